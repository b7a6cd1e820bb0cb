"""verl 0.9.1's rollout correction (`rollout_corr_helper.py`): importance weights, rejection
masks, rollout_is_batch_normalize and the off-policy diagnostics (compute_offpolicy_metrics,
compute_is_metrics), over padded (rows, tokens) arrays; the formulas are in the doc of
transforms/strategies/offpolicy.py. Pure torch; no Beam, no Arrow."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.offpolicy_spec import parse_is_threshold
from rescore.transforms.strategies.offpolicy_tensors import SAFETY_BOUND, masked_mean, seq_max, seq_mean, seq_sum
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def verl_weights(log_ratio: Tensor, mask: Tensor, level: str, threshold: str) -> Tensor:
    """(B, T) verl's rollout_is weights (zero where mask is 0)."""
    upper, lower = parse_is_threshold(threshold)
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        raw = torch.exp(seq_sum(log_ratio, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)).unsqueeze(-1).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        return raw.clamp(max=upper)
    return torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))


def batch_normalize_terms(weights: Tensor, mask: Tensor, level: str) -> tuple[Tensor, Tensor]:
    """(numerator (B,), denominator (B,)) float64 per row of verl's `rollout_is_batch_normalize`
    mean, which adds up over any split of a batch into rows: at token level the sums of w m and
    of m (the mean over every action token of the batch), at sequence level the row's mean
    weight sum(w m) / (sum(m) + 1e-8) and 1 for a row with action tokens (the mean over rows).
    batch_normalize_factor turns the batch's totals into verl's divisor."""
    w, m = weights.to(torch.float64), mask.to(torch.float64)
    if level == "token":
        return (w * m).sum(-1), m.sum(-1)
    if level == "sequence":
        return (w * m).sum(-1) / (m.sum(-1) + 1e-8), (m.sum(-1) > 0).to(torch.float64)
    raise ValueError(f"rollout_is_batch_normalize: unknown rollout_is level {level!r}")


def batch_normalize_factor(numerator: float, denominator: float, level: str) -> float:
    """verl's divisor from a batch's summed batch_normalize_terms: its mean weight (token level
    with masked_mean's + 1e-8, sequence level over at least 1e-8 rows), or 1 where the mean is
    at most 1e-8 (the weights are then left as they are)."""
    mean = numerator / (denominator + 1e-8) if level == "token" else numerator / max(denominator, 1e-8)
    return mean if mean > 1e-8 else 1.0


def verl_rejection(log_ratio: Tensor, mask: Tensor, options: list[tuple[str, float | None, float]]) -> Tensor:
    """(B, T) 0/1: verl's compute_rollout_rejection_mask keep mask (every option must pass)."""
    lr = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    stats = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}
    keep = torch.ones_like(mask, dtype=torch.bool)
    for name, lower, upper in options:
        level, _, k = name.rpartition("_")
        x = stats[k]
        if level == "token":
            stat = x
        elif level == "seq_sum":
            stat = seq_sum(x, mask).unsqueeze(-1)
        elif level == "seq_mean":
            stat = seq_mean(x, mask).unsqueeze(-1)
        else:
            stat = seq_max(x, mask).unsqueeze(-1)
        ok = (stat >= math.log(lower)) & (stat <= math.log(upper)) if k == "k1" else stat <= upper
        keep = keep & ok.expand_as(mask)
    return keep.to(mask.dtype)


# --- verl's diagnostics -----------------------------------------------------------------------


def offpolicy_metrics(logprobs: Tensor, behaviour: Tensor, mask: Tensor) -> dict[str, float]:
    """verl's compute_offpolicy_metrics over (B, T) rows (an empty row counts as verl counts it:
    a sequence mean of 0); {} where no row has an action token (verl asserts one)."""
    if not bool((mask > 0).any()):
        return {}
    mean_train = masked_mean(logprobs, mask, -1)
    mean_rollout = masked_mean(behaviour, mask, -1)
    log_ratio = logprobs - behaviour
    log_ppl_diff = mean_rollout - mean_train
    rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq = seq_sum(log_ratio, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": float(torch.exp(-mean_train).mean()),
        "training_log_ppl": float((-mean_train).mean()),
        "kl": float(masked_mean(behaviour - logprobs, mask)),
        "k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)),
        "rollout_ppl": float(torch.exp(-mean_rollout).mean()),
        "rollout_log_ppl": float((-mean_rollout).mean()),
        "log_ppl_diff": float(log_ppl_diff.mean()),
        "log_ppl_abs_diff": float(log_ppl_diff.abs().mean()),
        "log_ppl_diff_max": float(log_ppl_diff.max()),
        "log_ppl_diff_min": float(log_ppl_diff.min()),
        "ppl_ratio": float(torch.exp(log_ppl_diff).mean()),
        "chi2_token": float(masked_mean(rho.square(), mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq).mean() - 1.0),
    }

METRIC_SUMS = (
    "rows", "tokens", "kl", "k3_kl", "rho2", "training_ppl", "training_log_ppl", "rollout_ppl", "rollout_log_ppl",
    "log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio", "chi2_seq", "is_w", "is_w2", "is_high", "is_low", "is_n",
)
"""The per-row terms of verl's off-policy metrics that add up over a batch (light columns
x.offpolicy_m_NAME; ScoreGroups sums them per group, the summary per batch)."""


def metric_terms(
    logprobs: Tensor, behaviour: Tensor, mask: Tensor, weights: Tensor | None = None, upper: float = math.inf,
    level: str = "token", lower: float | None = None,
) -> dict[str, np.ndarray]:
    """(B,) float64 per row: the summands of offpolicy_metrics (verl's formulas, sequence means
    with its 1e-8), and `log_ppl_diff` also for the batch max / min."""
    mean_train = masked_mean(logprobs, mask, -1)
    mean_rollout = masked_mean(behaviour, mask, -1)
    log_ratio = (logprobs - behaviour) * (mask > 0)
    diff = mean_rollout - mean_train
    seq = seq_sum(log_ratio, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    terms = {
        "rows": torch.ones(mask.shape[0], dtype=torch.float64),
        "tokens": mask.sum(-1),
        "kl": ((behaviour - logprobs) * mask).sum(-1),
        "k3_kl": ((torch.exp(log_ratio) - log_ratio - 1) * mask).sum(-1),
        "rho2": (torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)).square() * mask).sum(-1),
        "training_ppl": torch.exp(-mean_train),
        "training_log_ppl": -mean_train,
        "rollout_ppl": torch.exp(-mean_rollout),
        "rollout_log_ppl": -mean_rollout,
        "log_ppl_diff": diff,
        "log_ppl_abs_diff": diff.abs(),
        "ppl_ratio": torch.exp(diff),
        "chi2_seq": torch.exp(2.0 * seq),
    }
    if weights is not None:  # verl's rollout_is: the weights clamped to [0, upper] (its mean and ESS)
        w = weights.clamp(min=0.0, max=upper)
        terms["is_w"] = (w * mask).sum(-1)
        terms["is_w2"] = (w.square() * mask).sum(-1)
        # compute_is_metrics' rollout_is_ratio_fraction_high / _low: the raw ratios beyond the
        # bounds (lower 1 / upper for TIS), per action token at token level, per row (its
        # unclamped log sequence ratio) at sequence level; is_n is the count they divide by.
        low = 1.0 / upper if lower is None else lower
        if level == "sequence":
            seq_raw = ((logprobs - behaviour) * mask).sum(-1)
            terms["is_high"] = (seq_raw > math.log(upper)).to(torch.float64)
            terms["is_low"] = (seq_raw < math.log(low)).to(torch.float64)
            terms["is_n"] = torch.ones(mask.shape[0], dtype=torch.float64)
        else:
            raw = torch.exp(((logprobs - behaviour) * (mask > 0)).clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
            terms["is_high"] = ((raw > upper).to(torch.float64) * mask).sum(-1)
            terms["is_low"] = ((raw < low).to(torch.float64) * mask).sum(-1)
            terms["is_n"] = mask.sum(-1)
    return {k: v.numpy().astype(np.float64) for k, v in terms.items()}


def _div(a: float, b: float) -> float:
    """a / b as IEEE floats divide (x / 0 is +-inf or NaN, never ZeroDivisionError)."""
    if b != 0:
        return a / b
    with np.errstate(divide="ignore", invalid="ignore"):
        return float(np.float64(a) / np.float64(b))


def metrics_from_sums(sums: dict[str, float], high: float, low: float) -> dict[str, float]:
    """verl's compute_offpolicy_metrics of a batch from the sums of metric_terms over its rows
    (and the max / min of log_ppl_diff); with rollout_is weights also compute_is_metrics'
    rollout_is_eff_sample_size, rollout_is_mean and rollout_is_std."""
    n, tokens = sums["rows"], sums["tokens"]
    extra = {}
    if "is_w" in sums:
        mean = sums["is_w"] / (tokens + 1e-8)
        extra["rollout_is_eff_sample_size"] = _div(1.0, _div(_div(sums["is_w2"], (mean + 1e-8) * (mean + 1e-8)), tokens + 1e-8))
        # compute_is_metrics' rollout_is_mean and rollout_is_std (the applied weights, which are
        # already within [0, upper]; the std 0 for a batch of at most one action token)
        extra["rollout_is_mean"] = mean
        extra["rollout_is_std"] = math.sqrt(max(sums["is_w2"] / (tokens + 1e-8) - mean * mean, 0.0)) if tokens > 1 else 0.0
        if "is_n" in sums:
            extra["rollout_is_ratio_fraction_high"] = sums["is_high"] / (sums["is_n"] + 1e-8)
            extra["rollout_is_ratio_fraction_low"] = sums["is_low"] / (sums["is_n"] + 1e-8)
    seq = {k: sums[k] / n for k in ("training_ppl", "training_log_ppl", "rollout_ppl", "rollout_log_ppl", "log_ppl_diff", "log_ppl_abs_diff", "ppl_ratio")}
    return {
        **seq,
        "kl": sums["kl"] / (tokens + 1e-8),
        "k3_kl": sums["k3_kl"] / (tokens + 1e-8),
        "log_ppl_diff_max": high,
        "log_ppl_diff_min": low,
        "chi2_token": sums["rho2"] / (tokens + 1e-8) - 1.0,
        "chi2_seq": sums["chi2_seq"] / n - 1.0,
        **extra,
    }
