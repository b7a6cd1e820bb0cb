"""The padded (rows, tokens) arrays every off-policy library's math works on
(transforms/strategies/offpolicy.py has the formulas), and the sequence statistics they share:
SAFETY_BOUND clamps, padding and unpadding, masked sums, means and maxima. Pure torch and numpy;
no Beam, no Arrow. Public: the correction (offpolicy_correct.py) and the token-level estimators
(token_baseline.py) read rows through these."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor

SAFETY_BOUND = 20.0
"""verl's clamp of log ratios before exp (SkyRL's and the diagnostics' too)."""


def padded(offsets: np.ndarray, values: np.ndarray, fill: float = 0.0) -> Tensor:
    """(B, T) float64 from a flat list column (row i = values[offsets[i]:offsets[i + 1]])."""
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.diff(offsets)
    b, t = len(lengths), int(lengths.max()) if len(lengths) else 0
    out = np.full((b, t), fill, dtype=np.float64)
    if len(values):
        rows = np.repeat(np.arange(b), lengths)
        cols = np.arange(len(values)) - np.repeat(offsets[:-1], lengths)
        out[rows, cols] = np.asarray(values, dtype=np.float64)
    return torch.from_numpy(out)


def unpadded(x: Tensor, lengths: np.ndarray) -> np.ndarray:
    """The flat (T,) values of the first lengths[i] entries of each row of (B, T) `x`."""
    if x.shape[0] == 0:
        return np.zeros(0, dtype=np.float64)
    keep = torch.arange(x.shape[1]).unsqueeze(0) < torch.as_tensor(lengths).unsqueeze(1)
    return x[keep].numpy().astype(np.float64)


def seq_sum(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1)


def seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def seq_max(x: Tensor, mask: Tensor) -> Tensor:
    m = x.masked_fill(~mask.bool(), float("-inf")).max(-1).values if x.shape[-1] else torch.zeros(x.shape[0], dtype=x.dtype)
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)



def safe_exp(x: Tensor) -> Tensor:
    """exp of x clamped to [-SAFETY_BOUND, SAFETY_BOUND]."""
    return torch.exp(x.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def masked_mean(x: Tensor, mask: Tensor, axis: int | None = None) -> Tensor:
    """verl's masked_mean: sum(x m) / (sum(m) + 1e-8)."""
    if axis is None:
        return (x * mask).sum() / (mask.sum() + 1e-8)
    return (x * mask).sum(axis) / (mask.sum(axis) + 1e-8)

