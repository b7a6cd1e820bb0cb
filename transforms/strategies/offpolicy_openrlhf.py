"""OpenRLHF 0.11.2's off-policy correction (PolicyLoss is_correction_*), over padded (rows,
tokens) arrays; the formulas are in the doc of transforms/strategies/offpolicy.py. Pure torch;
no Beam, no Arrow."""

from __future__ import annotations


from typing import TYPE_CHECKING

from rescore.transforms.strategies.offpolicy_tensors import seq_mean
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def openrlhf_gate(
    logprobs: Tensor, behaviour: Tensor, mask: Tensor, level: str, mode: str, gating: str, low: float, high: float
) -> tuple[Tensor, Tensor]:
    """((B, T) coefficient, (B, T) 0/1 keep): OpenRLHF PolicyLoss's is_correction gate."""
    log_ratio = logprobs - behaviour
    token_is = log_ratio.exp()
    seq = level == "seq"
    if gating == "ratio":
        stat = (seq_mean(log_ratio, mask).unsqueeze(-1) if seq else log_ratio).exp()
    else:
        p = behaviour.exp().clamp(1e-6, 1 - 1e-6)
        q = logprobs.exp().clamp(1e-6, 1 - 1e-6)
        if gating == "binary_kl":
            stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
        else:
            stat = (p - q).abs()
        if seq:
            stat = seq_mean(stat, mask).unsqueeze(-1)
    stat = stat.expand_as(log_ratio)
    if mode == "clip":
        return stat.clamp(min=low, max=high), torch.ones_like(mask)
    keep = (stat >= low) & (stat <= high)
    return torch.where(keep, token_is, torch.zeros_like(token_is)), keep.to(mask.dtype)
