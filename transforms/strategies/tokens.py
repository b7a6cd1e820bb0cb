"""Token-level output: broadcast each row's scalar over its response tokens.

advantages[t] = float32(score_i * token_scale_i) * action_mask[t] for the tokens t of row i,
computed on flat token arrays with per-row lengths (never row by row).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
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


HOST_BLOCK_ROWS = 4096
"""Rows broadcast at a time into the output buffer (token_advantages_host)."""


def token_advantages_host(
    row_value: np.ndarray, lengths: np.ndarray, mask: np.ndarray | None = None, out: np.ndarray | None = None
) -> np.ndarray:
    """`token_advantages` on the host with numpy: the same float32 values bit for bit (the same
    IEEE operations: float32(value), times float32(mask), plus +0.0), written into one (T,)
    float32 buffer, `out` where given (T = lengths.sum()). torch's repeat_interleave builds an
    int64 index per token and three more per-token arrays on the way; on a CPU worker that was
    ~20 bytes of fresh memory per token for 4 bytes of result (benchmarks/README.md, issue 18).
    The values are repeated HOST_BLOCK_ROWS rows at a time into `out`: a caller that hands the
    same memory back for each unit (rows/tokens.py: from Arrow's pool) then faults no fresh page."""
    lengths = np.asarray(lengths, dtype=np.int64)
    with np.errstate(over="ignore"):  # beyond float32: inf, and the row is rejected (rows/output_rows.py)
        values = np.asarray(row_value).astype(np.float32, copy=False)
    if out is None:
        out = np.empty(int(lengths.sum()), dtype=np.float32)
    end = 0
    for first in range(0, len(lengths), HOST_BLOCK_ROWS):
        block = lengths[first : first + HOST_BLOCK_ROWS]
        start, end = end, end + int(block.sum())
        out[start:end] = np.repeat(values[first : first + HOST_BLOCK_ROWS], block)
    if end != len(out):
        raise ValueError(f"token_advantages_host: {len(out)} values for {end} tokens")
    if mask is None:
        return out
    np.multiply(out, mask, out=out, casting="unsafe")  # mask 0/1 of any dtype, cast per chunk
    np.add(out, np.float32(0.0), out=out)
    return out
    np.multiply(values, mask, out=values, casting="unsafe")  # mask 0/1 of any dtype, cast per chunk
    np.add(values, np.float32(0.0), out=values)
    return values
