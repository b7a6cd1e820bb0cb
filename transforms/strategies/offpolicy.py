"""Off-policy (rollout) correction: importance weights and rejection masks between the
training-time log-probs `logprobs` (pi_train, refreshed by --logprob-model or logged) and the
behaviour log-probs that generated the rollout (`logprobs_original`, pi_rollout).

Per response token t of a row, with m_t the input action mask:

    log r_t   = logprobs_t - behaviour_t                 (log(pi_train / pi_rollout))
    k1_t      = -log r_t,   k2_t = (log r_t)^2 / 2,   k3_t = exp(log r_t) - 1 - log r_t
    seq_sum   = sum_t m_t x_t,   seq_mean = seq_sum / max(sum_t m_t, 1),   seq_max = max_{m_t=1} x_t

Each family is the framework's own definition (the tests compare with its function):

verl 0.9.1 (`rollout_corr_helper.py`), over the input mask:
    rollout_is = token:    w_t = exp(clamp(log r_t, -20, 20))
    rollout_is = sequence: w_t = exp(clamp(seq_sum(log r), -20, 20))
    rollout_is_threshold "U" (TIS): w = min(w, U);  "L_U" (IcePop): w = 0 outside [L, U]
    rollout_rs options (comma list, all must pass), log r clamped to +-20 first:
        token_k1 / seq_sum_k1 / seq_mean_k1: keep log L <= stat <= log U ("L_U"; "U" means L = 1/U)
        token_k2|k3, seq_sum_k2|k3, seq_mean_k2|k3, seq_max_k2|k3: keep stat <= U
TRL 1.16.0 (GRPOTrainer, vllm_importance_sampling_mode), over the input mask:
    d_t = m_t log r_t (NaN -> 0); token_*: rho_t = exp(d_t); sequence_*: rho = exp(sum_t d_t)
    *_truncate: clamp(rho, C_min, C_max);  *_mask: rho = 0 outside [C_min, C_max]
    off_policy_mask_threshold delta (DeepSeek-V3.2 OPSM): a row is masked when its advantage < 0
    and mean_t m_t (behaviour_t - logprobs_t) > delta
SkyRL (`off_policy_correction_utils.py`), applied in SkyRL's order:
    outlier tokens: a row is masked when any action token's exp(clamp(log r)) leaves [low, high];
    token mask: tokens with exp(clamp(log r)) outside [low, high] are masked;
    TIS (tis_ratio_type): min(exp(clamp(log r_t)), token cap) or min(exp(clamp(seq_sum)), seq cap),
        the sum over the mask left by the two masks above;
    sequence mask: geometric exp(clamp(seq_mean(log r))) or product exp(clamp(seq_sum(log r)))
        outside [low, high] masks the row (over the mask left by the token masks).
OpenRLHF 0.11.2 (PolicyLoss is_correction_*): statistic per token or per row (level seq: the
    ratio's geometric mean, a divergence's plain mean) of gating ratio (exp(log r)), binary_kl
    (p log(p/q) + (1-p) log((1-p)/(1-q)), p = exp(behaviour), q = exp(logprobs), both clamped to
    [1e-6, 1 - 1e-6]) or tv (|p - q|); mode mask: units outside [low, high] are rejected and the
    survivors weigh exp(log r_t); mode clip (token ratio only): w_t = clamp(r_t, low, high).

The written mask is the input's times every rejection; `is_weights` are zero where the input
mask is zero. Pure torch over padded (rows, tokens) arrays; no Beam, no Arrow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from rescore.transforms.strategies.base import (
    GroupedRows,
    OutputColumn,
    Scores,
    TokenColumn,
    WrittenRows,
    group_reasons,
)
from rescore.transforms.strategies.offpolicy_spec import RolloutCorrectionParams, parse_is_threshold, parse_rs
from rescore.transforms.strategies.features import OFFPOLICY_FEATURE as FEATURE  # the need's prefix (features.py)
from rescore.transforms.strategies.segments import group_stats

SAFETY_BOUND = 20.0
REASONS = (
    "",
    "rollout_rs",
    "outlier_token",
    "token_mask",
    "sequence_mask",
    "is_correction_gate",
    "behaviour_logprobs",
)


# --- padded arrays ----------------------------------------------------------------------------


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


def _seq_sum(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1)


def _seq_mean(x: Tensor, mask: Tensor) -> Tensor:
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def _seq_max(x: Tensor, mask: Tensor) -> Tensor:
    m = x.masked_fill(~mask.bool(), float("-inf")).max(-1).values if x.shape[-1] else torch.zeros(x.shape[0], dtype=x.dtype)
    return torch.where(m == float("-inf"), torch.zeros_like(m), m)


# --- verl -------------------------------------------------------------------------------------


def verl_weights(log_ratio: Tensor, mask: Tensor, level: str, threshold: str) -> Tensor:
    """(B, T) verl's rollout_is weights (zero where mask is 0)."""
    upper, lower = parse_is_threshold(threshold)
    if level == "token":
        raw = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    else:
        raw = torch.exp(_seq_sum(log_ratio, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)).unsqueeze(-1).expand_as(log_ratio)
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
            stat = _seq_sum(x, mask).unsqueeze(-1)
        elif level == "seq_mean":
            stat = _seq_mean(x, mask).unsqueeze(-1)
        else:
            stat = _seq_max(x, mask).unsqueeze(-1)
        ok = (stat >= math.log(lower)) & (stat <= math.log(upper)) if k == "k1" else stat <= upper
        keep = keep & ok.expand_as(mask)
    return keep.to(mask.dtype)


# --- TRL --------------------------------------------------------------------------------------


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


# --- SkyRL ------------------------------------------------------------------------------------


def _safe_exp(x: Tensor) -> Tensor:
    return torch.exp(x.clamp(-SAFETY_BOUND, SAFETY_BOUND))


def skyrl_outlier(log_ratio: Tensor, mask: Tensor, low: float | None, high: float | None) -> Tensor:
    """(B, 1) 0/1: SkyRL's compute_outlier_token_mask (a row with any action token's ratio
    outside [low, high] is masked)."""
    r = _safe_exp(log_ratio)
    bad = torch.zeros_like(mask, dtype=torch.bool)
    if high is not None:
        bad |= (r > high) & (mask > 0)
    if low is not None:
        bad |= (r < low) & (mask > 0)
    return (~bad).all(-1, keepdim=True).to(mask.dtype)


def skyrl_token_mask(log_ratio: Tensor, mask: Tensor, low: float, high: float) -> Tensor:
    """(B, T) 0/1: SkyRL's compute_token_mask."""
    r = _safe_exp(log_ratio)
    return (((r >= low) & (r <= high)) | (mask == 0)).to(mask.dtype)


def skyrl_tis(log_ratio: Tensor, mask: Tensor, kind: str, token_cap: float, seq_cap: float) -> Tensor:
    """(B, T) SkyRL's compute_tis_ratio broadcast over the tokens (not yet masked)."""
    if kind == "token":
        return _safe_exp(log_ratio).clamp(max=token_cap)
    seq = _safe_exp((log_ratio * mask).sum(-1, keepdim=True))
    return seq.clamp(max=seq_cap).expand_as(log_ratio)


def skyrl_sequence_mask(log_ratio: Tensor, mask: Tensor, metric: str, low: float, high: float) -> Tensor:
    """(B, 1) 0/1: SkyRL's compute_sequence_mask, geometric or product."""
    total = (log_ratio * mask).sum(-1, keepdim=True)
    if metric == "geometric":
        ratio = _safe_exp(total / mask.sum(-1, keepdim=True).clamp(min=1.0))
    else:
        ratio = _safe_exp(total)
    return (~(ratio > high) & ~(ratio < low)).to(mask.dtype)


# --- OpenRLHF ---------------------------------------------------------------------------------


def openrlhf_gate(
    logprobs: Tensor, behaviour: Tensor, mask: Tensor, level: str, mode: str, gating: str, low: float, high: float
) -> tuple[Tensor, Tensor]:
    """((B, T) coefficient, (B, T) 0/1 keep): OpenRLHF PolicyLoss's is_correction gate."""
    log_ratio = logprobs - behaviour
    token_is = log_ratio.exp()
    seq = level == "seq"
    if gating == "ratio":
        stat = (_seq_mean(log_ratio, mask).unsqueeze(-1) if seq else log_ratio).exp()
    else:
        p = behaviour.exp().clamp(1e-6, 1 - 1e-6)
        q = logprobs.exp().clamp(1e-6, 1 - 1e-6)
        if gating == "binary_kl":
            stat = p * (p / q).log() + (1 - p) * ((1 - p) / (1 - q)).log()
        else:
            stat = (p - q).abs()
        if seq:
            stat = _seq_mean(stat, mask).unsqueeze(-1)
    stat = stat.expand_as(log_ratio)
    if mode == "clip":
        return stat.clamp(min=low, max=high), torch.ones_like(mask)
    keep = (stat >= low) & (stat <= high)
    return torch.where(keep, token_is, torch.zeros_like(token_is)), keep.to(mask.dtype)


# --- verl's diagnostics -----------------------------------------------------------------------


def _masked_mean(x: Tensor, mask: Tensor, axis: int | None = None) -> Tensor:
    """verl's masked_mean: sum(x m) / (sum(m) + 1e-8)."""
    if axis is None:
        return (x * mask).sum() / (mask.sum() + 1e-8)
    return (x * mask).sum(axis) / (mask.sum(axis) + 1e-8)


def offpolicy_metrics(logprobs: Tensor, behaviour: Tensor, mask: Tensor) -> dict[str, float]:
    """verl's compute_offpolicy_metrics over (B, T) rows (an empty row counts as verl counts it:
    a sequence mean of 0); {} where no row has an action token (verl asserts one)."""
    if not bool((mask > 0).any()):
        return {}
    mean_train = _masked_mean(logprobs, mask, -1)
    mean_rollout = _masked_mean(behaviour, mask, -1)
    log_ratio = logprobs - behaviour
    log_ppl_diff = mean_rollout - mean_train
    rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND))
    seq = _seq_sum(log_ratio, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": float(torch.exp(-mean_train).mean()),
        "training_log_ppl": float((-mean_train).mean()),
        "kl": float(_masked_mean(behaviour - logprobs, mask)),
        "k3_kl": float(_masked_mean(torch.exp(log_ratio) - log_ratio - 1, mask)),
        "rollout_ppl": float(torch.exp(-mean_rollout).mean()),
        "rollout_log_ppl": float((-mean_rollout).mean()),
        "log_ppl_diff": float(log_ppl_diff.mean()),
        "log_ppl_abs_diff": float(log_ppl_diff.abs().mean()),
        "log_ppl_diff_max": float(log_ppl_diff.max()),
        "log_ppl_diff_min": float(log_ppl_diff.min()),
        "ppl_ratio": float(torch.exp(log_ppl_diff).mean()),
        "chi2_token": float(_masked_mean(rho.square(), mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq).mean() - 1.0),
    }


# --- the whole correction ---------------------------------------------------------------------


@dataclass(frozen=True)
class Correction:
    """What the correction decided for B rows (padded to T tokens)."""

    weights: Tensor
    """(B, T) float64 importance weights, zero where the input mask is zero (ones without an
    importance-weight setting)."""
    mask: Tensor
    """(B, T) float64 the input mask times every rejection (OPSM not applied: it needs the
    advantage)."""
    reason: Tensor
    """(B,) int64 index in REASONS of the first mask that left the row no token (0: none)."""
    touched: Tensor | None = None
    """(B,) int64 index in REASONS of the first mask that removed any of the row's tokens."""


def correct(p: RolloutCorrectionParams, logprobs: Tensor, behaviour: Tensor, mask: Tensor) -> Correction:
    """Apply every setting of `p` to (B, T) padded log-probs and input mask (0/1 float64)."""
    log_ratio = (logprobs - behaviour) * (mask > 0)  # padding and non-action tokens: ratio 1
    had = mask.sum(-1) > 0
    reason = torch.zeros(mask.shape[0], dtype=torch.int64)
    touched = torch.zeros(mask.shape[0], dtype=torch.int64)
    current = mask

    def reject(keep: Tensor, code: int) -> None:
        nonlocal current
        after = current * keep
        emptied = had & (reason == 0) & (after.sum(-1) == 0)
        reason[emptied] = code
        touched[(touched == 0) & (after.sum(-1) < current.sum(-1))] = code
        current = after

    # SkyRL's token masks first: its TIS ratio and sequence mask read the mask they leave.
    sky_mask = mask
    if p.outlier_token_is_threshold_low is not None or p.outlier_token_is_threshold_high is not None:
        keep = skyrl_outlier(log_ratio, mask, p.outlier_token_is_threshold_low, p.outlier_token_is_threshold_high)
        sky_mask = sky_mask * keep
        reject(keep, REASONS.index("outlier_token"))
    if p.token_mask_is_threshold_low is not None and p.token_mask_is_threshold_high is not None:
        keep = skyrl_token_mask(log_ratio, sky_mask, p.token_mask_is_threshold_low, p.token_mask_is_threshold_high)
        sky_mask = sky_mask * keep
        reject(keep, REASONS.index("token_mask"))

    weights = mask.clone()
    if p.rollout_is is not None:
        weights = verl_weights(log_ratio, mask, p.rollout_is, p.rollout_is_threshold)
    elif p.vllm_importance_sampling_mode is not None:
        weights = trl_weights(log_ratio, mask, p.vllm_importance_sampling_mode, p.vllm_importance_sampling_clip_min, p.vllm_importance_sampling_clip_max)
    elif p.tis_ratio_type is not None:
        weights = skyrl_tis(log_ratio, sky_mask, p.tis_ratio_type, p.token_tis_ratio_clip_high, p.sequence_tis_ratio_clip_high) * mask
    if p.rollout_rs is not None:
        reject(verl_rejection(log_ratio, mask, parse_rs(p.rollout_rs, p.rollout_rs_threshold)), REASONS.index("rollout_rs"))
    if p.sequence_mask_metric is not None:
        low, high = (p.geo_mask_low, p.geo_mask_high) if p.sequence_mask_metric == "geometric" else (p.product_mask_low, p.product_mask_high)
        reject(skyrl_sequence_mask(log_ratio, sky_mask, p.sequence_mask_metric, low, high), REASONS.index("sequence_mask"))
    if p.is_correction_level != "off":
        low, high = p.is_correction_threshold
        coef, keep = openrlhf_gate(logprobs, behaviour, mask, p.is_correction_level, p.is_correction_mode, p.is_correction_gating, low, high)
        weights = coef * mask
        reject(keep, REASONS.index("is_correction_gate"))
    return Correction(weights, current, reason, touched)


def _rows_tensors(p: RolloutCorrectionParams, rows: WrittenRows) -> tuple[np.ndarray, Tensor, Tensor, Tensor, np.ndarray]:
    """(response lengths, logprobs, behaviour, mask (B, T), bad (B,) rows whose log-prob lists
    do not line up with the response)."""
    lengths, flat_mask = rows.response()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    bad = np.zeros(len(lengths), dtype=bool)
    cols = []
    for name in ("logprobs", p.behaviour_logprobs):
        col = rows.tokens(name)
        n = np.diff(col.offsets)
        ok = n == lengths
        bad |= ~ok
        values = np.asarray(col.values, dtype=np.float64)
        if not ok.all():  # rebuild row by row: the bad rows get zeros
            fixed = np.zeros(int(lengths.sum()), dtype=np.float64)
            for i in np.flatnonzero(ok):
                fixed[offsets[i] : offsets[i + 1]] = values[col.offsets[i] : col.offsets[i + 1]]
            values = fixed
        nan = np.isnan(values)
        if nan.any():
            bad[np.repeat(np.arange(len(lengths)), lengths)[nan]] = True
            values = np.where(nan, 0.0, values)
        cols.append(padded(offsets, values))
    return lengths, cols[0], cols[1], padded(offsets, flat_mask), bad


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
    mean_train = _masked_mean(logprobs, mask, -1)
    mean_rollout = _masked_mean(behaviour, mask, -1)
    log_ratio = (logprobs - behaviour) * (mask > 0)
    diff = mean_rollout - mean_train
    seq = _seq_sum(log_ratio, mask).clamp(-SAFETY_BOUND, SAFETY_BOUND)
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


class RolloutCorrection(RolloutCorrectionParams):
    """A filter stage: rows that every token of which a rejection mask removes are dropped
    (ExplainsDrops says which), the others written with `is_weights` and the rejections zeroed
    in `action_mask` (the input's kept as `action_mask_original`)."""

    @property
    def needs(self) -> tuple[str, ...]:
        params = json.dumps(self.params, sort_keys=True, separators=(",", ":"))
        out = ["logprobs", self.behaviour_logprobs, f"{FEATURE}{self.name}:{params}"]
        if self.max_staleness is not None:
            out.append(self.model_version_key)
        return tuple(out)

    @property
    def batch_level(self) -> bool:
        return False

    # --- before the shuffle: what decides whether a row is kept ---------------------------------

    def light_features(self, rows: WrittenRows) -> dict[str, np.ndarray]:
        """x.offpolicy_kept (tokens left) and x.offpolicy_reason of each row, as float64."""
        lengths, logprobs, behaviour, mask, bad = _rows_tensors(self, rows)
        c = correct(self, logprobs, behaviour, mask)
        reason = c.reason.numpy().astype(np.float64)
        reason[bad] = REASONS.index("behaviour_logprobs")
        kept = c.mask.sum(-1).numpy()
        kept[bad] = 0.0
        had = mask.sum(-1).numpy() > 0
        kept = np.where(had | bad, kept, -1.0)  # -1: nothing to train on in the input already
        out = {"offpolicy_kept": kept, "offpolicy_reason": reason}
        upper, lower = parse_is_threshold(self.rollout_is_threshold) if self.rollout_is is not None else (math.inf, None)
        terms = metric_terms(
            logprobs, behaviour, mask, c.weights if self.rollout_is is not None else None, upper, self.rollout_is or "token", lower
        )
        for k, v in terms.items():
            out["offpolicy_m_" + k] = np.where(bad, 0.0, v)
        if self.rollout_is_batch_normalize:  # verl's batch mean, over the input mask of every row
            num, den = batch_normalize_terms(c.weights, mask, self.rollout_is)
            out[BN_NUM], out[BN_DEN] = np.where(bad, 0.0, num.numpy()), np.where(bad, 0.0, den.numpy())
        return out

    def norm_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        """(batch ids, numerators, denominators) (n,) of the rows' batch_normalize_terms."""
        return rows.batch, rows.columns[BN_NUM], rows.columns[BN_DEN]

    def norm_factor(self, numerator: float, denominator: float) -> float:
        """verl's divisor of the weights from a batch's summed terms (1 where the mean is ~0)."""
        return batch_normalize_factor(numerator, denominator, self.rollout_is)

    def group_metric_sums(self, rows: GroupedRows) -> dict[str, np.ndarray]:
        """(G,) per group: the sums of metric_terms over its rows (rows whose log-probs did not
        line up count nowhere), and log_ppl_diff's max and min (NaN where no row counts)."""
        offsets = rows.offsets.cpu().numpy()
        g = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        counted = rows.columns["offpolicy_m_rows"].cpu().numpy() > 0
        out = {}
        for k in METRIC_SUMS:
            if "offpolicy_m_" + k not in rows.columns:  # the weights' sums: rollout_is only
                continue
            v = rows.columns["offpolicy_m_" + k].cpu().numpy()
            out[k] = np.array([math.fsum(v[offsets[i] : offsets[i + 1]]) for i in range(len(offsets) - 1)])
        d = rows.columns["offpolicy_m_log_ppl_diff"].cpu().numpy()
        high = np.full(len(offsets) - 1, -np.inf)
        low = np.full(len(offsets) - 1, np.inf)
        np.maximum.at(high, g[counted], d[counted])
        np.minimum.at(low, g[counted], d[counted])
        out["log_ppl_diff_max"], out["log_ppl_diff_min"] = high, low
        return out

    def _stale(self, rows: GroupedRows) -> Tensor:
        if self.max_staleness is None:
            return torch.zeros(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        if self.current_model_version is None:  # the launcher sets it to the input's newest version
            raise RuntimeError(f"internal error: {self.name}: max_staleness without a current_model_version")
        version = rows.columns[self.model_version_key]
        return version < (self.current_model_version - self.max_staleness)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        kept = rows.columns["offpolicy_kept"]
        keep = (kept != 0) & ~self._stale(rows)
        mean, std = group_stats(rows.reward, rows.offsets)
        return Scores(None, keep, mean, std)

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        stale = self._stale(rows).cpu().numpy()
        reason = rows.columns["offpolicy_reason"].cpu().numpy().astype(np.int64)
        version = rows.columns[self.model_version_key].cpu().numpy() if self.max_staleness is not None else None
        out = []
        for i in np.flatnonzero(dropped) if dropped.dtype == bool else dropped:
            if stale[i]:
                out.append(
                    f"{self.name}: model_version {version[i]:g} is more than max_staleness {self.max_staleness}"
                    f" behind {self.current_model_version}"
                )
            elif REASONS[reason[i]] == "behaviour_logprobs":
                out.append(f"{self.name}: {self.behaviour_logprobs} or logprobs do not line up with the response (or hold NaN)")
            else:
                out.append(f"{self.name}: every action token rejected ({REASONS[reason[i]] or 'masks'})")
        return out

    # --- where a row is written ---------------------------------------------------------------

    def correction_columns(self, input_names: Collection[str]) -> list[OutputColumn]:
        return [OutputColumn("is_weights", per_token=True)]

    def token_correction(self, rows: WrittenRows, advantage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat is_weights (T,), flat corrected mask (T,)) over the rows' response tokens;
        `advantage` (n,) is each row's scalar advantage (the OPSM reads its sign)."""
        weights, mask, _ = self.corrected_rows(rows, advantage)
        return weights, mask

    def corrected_rows(
        self, rows: WrittenRows, advantage: np.ndarray, factor: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """token_correction's (weights, mask) and the audit values of each row: the sequence
        log ratio sum_t m_t (logprobs_t - behaviour_t) and the first mask that removed any of
        its tokens (None: none). `factor` (n,): each row's batch divisor of the weights
        (rollout_is_batch_normalize), or None."""
        lengths, logprobs, behaviour, mask, bad = _rows_tensors(self, rows)
        c = correct(self, logprobs, behaviour, mask)
        new_mask = c.mask
        why = np.array([REASONS[i] or None for i in c.touched.tolist()], dtype=object)
        if self.off_policy_mask_threshold is not None:
            keep = off_policy_sequence_mask(logprobs, behaviour, mask, torch.as_tensor(advantage, dtype=torch.float64), self.off_policy_mask_threshold)
            hit = (~keep).numpy() & (new_mask.sum(-1) > 0).numpy()
            why[hit & (why == None)] = "off_policy_mask"  # noqa: E711  (an object array)
            new_mask = new_mask * keep.unsqueeze(-1).to(new_mask.dtype)
        weights = c.weights
        if factor is not None:
            weights = weights / torch.tensor(np.asarray(factor, dtype=np.float64)).unsqueeze(-1)
        if bad.any():
            b = torch.from_numpy(bad)
            new_mask[b] = 0.0
            weights[b] = 0.0
            why[bad] = "behaviour_logprobs"
        audit = {"offpolicy_seq_log_ratio": _seq_sum((logprobs - behaviour) * (mask > 0), mask).numpy(), "offpolicy_mask_reason": why}
        return unpadded(weights, lengths), unpadded(new_mask, lengths), audit

    def metrics(self, rows: WrittenRows) -> dict[str, float]:
        """verl's off-policy diagnostics over these rows."""
        lengths, logprobs, behaviour, mask, bad = _rows_tensors(self, rows)
        keep = torch.from_numpy(~bad)
        return offpolicy_metrics(logprobs[keep], behaviour[keep], mask[keep])


BN_NUM, BN_DEN = "offpolicy_bn_num", "offpolicy_bn_den"
"""Light columns of rollout_is_batch_normalize: each row's batch_normalize_terms."""


def light_features(need: str, rows: WrittenRows) -> dict[str, np.ndarray]:
    """The light columns of need `@offpolicy:NAME:PARAMS` (see FEATURE) for `rows`."""
    from rescore.transforms.strategies.registry import create

    name, _, params = need[len(FEATURE) :].partition(":")
    stage = create(name, json.loads(params))
    return stage.light_features(rows)


_PRESETS: dict[type, type] = {}


def preset(**values):
    """The factory of the presets (offpolicy_spec.py registers each under the framework's name): a
    RolloutCorrection that is also an instance of the preset's own declaration."""
    from rescore.transforms.strategies.registry import spec

    params = spec(values["name"]).params
    if params not in _PRESETS:
        _PRESETS[params] = type(params.__name__.removesuffix("Params"), (RolloutCorrection, params), {})
    return _PRESETS[params](**values)
