"""TRL 1.16.0's off-policy correction (GRPOTrainer's vllm_importance_sampling_mode and the
DeepSeek-V3.2 off-policy sequence mask), over padded (rows, tokens) arrays; the formulas are in
the doc of transforms/strategies/offpolicy.py. Pure torch; no Beam, no Arrow."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor



def trl_weights(log_ratio: Tensor, mask: Tensor, mode: str, clip_min: float | None, clip_max: float | None) -> Tensor:
    """(B, T) TRL's vLLM importance-sampling ratio for `mode`, zero where mask is 0."""
    d = torch.nan_to_num(log_ratio * mask, nan=0.0)
    if mode.startswith("sequence"):
        rho = torch.exp(d.sum(-1, keepdim=True)).expand_as(d)
    else:
        rho = torch.exp(d)
    if mode.endswith("truncate"):
        rho = torch.clamp(rho, min=clip_min, max=clip_max)
    else:
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        rho = rho.masked_fill((rho < low) | (rho > high), 0.0)
    return rho * mask


def off_policy_sequence_mask(logprobs: Tensor, behaviour: Tensor, mask: Tensor, advantage: Tensor, delta: float) -> Tensor:
    """(B,) bool keep: TRL's get_off_policy_mask (DeepSeek-V3.2 eq. 9): advantage >= 0 or the
    mean over the mask of behaviour - logprobs <= delta."""
    kl = torch.nan_to_num(behaviour - logprobs, nan=0.0)
    avg = (kl * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return (advantage >= 0) | (avg <= delta)
