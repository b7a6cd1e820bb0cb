"""Token-level output: broadcast each row's scalar over its response tokens.

advantages[t] = float32(score_i * token_scale_i) * action_mask[t] for the tokens t of row i,
computed on flat token arrays with per-row lengths (never row by row).
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_advantages(row_value: Tensor, lengths: Tensor, mask: Tensor | None = None) -> Tensor:
    """(T,) float32 token advantages.

    row_value: (n,) the per-row value (score * token_scale), any float dtype.
    lengths: (n,) int64 response tokens per row, T = lengths.sum().
    mask: (T,) action mask values (0/1, any dtype), or None for all ones.
    """
    values = torch.repeat_interleave(row_value.to(torch.float32), lengths)
    if mask is None:
        return values
    # + 0.0 turns the -0.0 of a negative value times a 0 mask into +0.0 (IEEE: -0 + +0 = +0).
    return (values * mask.to(torch.float32)).add_(0.0)
