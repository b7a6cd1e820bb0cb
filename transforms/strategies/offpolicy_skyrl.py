"""SkyRL's off-policy correction (`off_policy_correction_utils.py`): outlier-token, token and
sequence masks and the TIS ratio, over padded (rows, tokens) arrays; the formulas are in the doc
of transforms/strategies/offpolicy.py. Pure torch; no Beam, no Arrow."""

from __future__ import annotations


from typing import TYPE_CHECKING

from rescore.transforms.strategies.offpolicy_tensors import safe_exp
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def skyrl_outlier(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> Tensor:
    """(B, 1) 0/1: SkyRL's compute_outlier_token_mask (a row with any action token's ratio
    outside [low, high] is masked)."""
    r = safe_exp(log_ratio)
    bad = torch.zeros_like(mask, dtype=torch.bool)
    if high is not None:
        bad |= (r > high) & (mask > 0)
    if low is not None:
        bad |= (r < low) & (mask > 0)
    return (~bad).all(-1, keepdim=True).to(mask.dtype)


def skyrl_token_mask(log_ratio: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """(B, T) 0/1: SkyRL's compute_token_mask."""
    r = safe_exp(log_ratio)
    return (((r >= low) & (r <= high)) | (mask == 0)).to(mask.dtype)


def skyrl_tis(log_ratio: Tensor, mask: Tensor, kind: str, token_cap: float, seq_cap: float) -> Tensor:
    """(B, T) SkyRL's compute_tis_ratio broadcast over the tokens (not yet masked)."""
    if kind == "token":
        return safe_exp(log_ratio).clamp(max=token_cap)
    seq = safe_exp((log_ratio * mask).sum(-1, keepdim=True))
    return seq.clamp(max=seq_cap).expand_as(log_ratio)


def skyrl_sequence_mask(log_ratio: Tensor, mask: Tensor, metric: str, low: float, high: float) -> Tensor:
    """(B, 1) 0/1: SkyRL's compute_sequence_mask, geometric or product."""
    total = (log_ratio * mask).sum(-1, keepdim=True)
    if metric == "geometric":
        ratio = safe_exp(total / mask.sum(-1, keepdim=True).clamp(min=1.0))
    else:
        ratio = safe_exp(total)
    return (~(ratio > high) & ~(ratio < low)).to(mask.dtype)
