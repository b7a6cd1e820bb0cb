"""Group-baseline estimators without std normalisation, and the batch-whitened REINFORCE++.

    opmd      r_i - b, b = mean(G) or tau * (logsumexp(r / tau) - log n)   (Trinity-RFT OPMD)
    asymre    r_i - (mean(G) + baseline_shift)                             (Trinity-RFT AsymRE)
    dr_grpo   r_i - mean(G)                                                (Dr. GRPO, arXiv 2503.20783)
    rloo      (r_i - mean(G)) * n / (n - 1)                                (RLOO, arXiv 2402.14740)
    reinforce_plus_plus_baseline
              s_i = r_i - mean(G), whitened over the batch, token-weighted (verl `masked_whiten`)

A group of one row has baseline 0 (its score is its reward) in all of them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, ScoreExplanation, Scores
from rescore.transforms.strategies.function_estimator import estimator
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats, per_row, segment_max, segment_sum, zero_spread
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor

WHITEN_EPSILON = 1e-8
"""verl's `masked_whiten` adds 1e-8 to the variance."""
TRL_ADVANTAGE_EPSILON = 1e-4
"""TRL's RLOOTrainer adds 1e-4 to the std when `normalize_advantages` is set."""


def group_mean(reward: Tensor, offsets: Tensor) -> Tensor:
    """(G,) mean of each group, 0 for a group of one row (the spec's 'baseline 0')."""
    return group_stats(reward, offsets)[0]


def logavgexp_baseline(reward: Tensor, offsets: Tensor, tau: float) -> Tensor:
    """(G,) tau * (logsumexp(r / tau) - log n), shifted by the group max so exp never
    overflows; 0 for a group of one row."""
    sizes = offsets[1:] - offsets[:-1]
    x = reward / tau
    peak = segment_max(x, offsets)
    lse = peak + torch.log(segment_sum(torch.exp(x - per_row(peak, offsets)), offsets))
    b = tau * (lse - torch.log(sizes.to(reward.dtype)))
    # All rewards equal: the baseline is that reward exactly (float rounding of the formula
    # above would leave scores of ~1e-16).
    b = torch.where(zero_spread(reward, offsets), group_stats(reward, offsets)[0], b)
    return torch.where(sizes == 1, torch.zeros_like(b), b)


def _row_groups(offsets: Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(group of each row (n,), its group's size (n,)) as numpy, for the audit baselines."""
    sizes = np.diff(offsets.detach().cpu().numpy().astype(np.int64))
    g = np.repeat(np.arange(len(sizes)), sizes)
    return g, sizes[g]


def opmd_baseline(reward: Tensor, offsets: Tensor, group_mean: np.ndarray, *, opmd_baseline: str, tau: float) -> np.ndarray:
    """b per row (the audit baseline): the group mean (0 for a group of one row) or the logavgexp."""
    g, sizes = _row_groups(offsets)
    if opmd_baseline == "mean":
        return np.where(sizes > 1, group_mean, 0.0)
    return logavgexp_baseline(reward, offsets, tau).detach().cpu().numpy().astype(np.float64)[g]


@estimator("opmd", summary="r - b, b = group mean or tau * logavgexp(r / tau); no std normalisation", baseline=opmd_baseline)
def opmd_scores(
    reward: Tensor,
    offsets: Tensor,
    *,
    opmd_baseline: Literal["mean", "logavgexp"] = param(
        "mean", help="`mean`: b = mean(G); `logavgexp`: b = tau * (logsumexp(r / tau) - log n), shifted by the group maximum"
    ),
    tau: float = param(1.0, positive=True, help="temperature of the `logavgexp` baseline"),
) -> Tensor:
    """(n,) r - b (Trinity-RFT `OPMDAdvantageFn`); a group of one row has b = 0."""
    b = group_mean(reward, offsets) if opmd_baseline == "mean" else logavgexp_baseline(reward, offsets, tau)
    return reward - per_row(b, offsets)


def asymre_baseline(offsets: Tensor, group_mean: np.ndarray, *, baseline_shift: float) -> np.ndarray:
    """mean(G) + baseline_shift per row (the audit baseline); 0 for a group of one row."""
    return np.where(_row_groups(offsets)[1] > 1, group_mean + baseline_shift, 0.0)


@estimator("asymre", summary="r - (mean(G) + baseline_shift) (asymmetric REINFORCE)", baseline=asymre_baseline)
def asymre_scores(
    reward: Tensor,
    offsets: Tensor,
    *,
    baseline_shift: float = param(-0.1, help="added to the group mean baseline; a negative shift favours positive advantages"),
) -> Tensor:
    """(n,) r - (mean(G) + baseline_shift) (Trinity-RFT `ASYMREGroupAdvantage`); r for a group of one row."""
    # (r - mean) - shift rather than r - (mean + shift): equal mathematically, and a group whose
    # rewards are all equal then scores exactly -shift.
    single = per_row((offsets[1:] - offsets[:-1]) == 1, offsets)
    shifted = (reward - per_row(group_mean(reward, offsets), offsets)) - baseline_shift
    return torch.where(single, reward, shifted)


@estimator("dr_grpo", summary="r - mean(G) (GRPO without the std division)")
def dr_grpo_scores(reward: Tensor, offsets: Tensor) -> Tensor:
    """(n,) r - mean(G); a group of one row scores its reward (Dr. GRPO)."""
    return reward - per_row(group_mean(reward, offsets), offsets)


def rloo_scores(reward: Tensor, offsets: Tensor) -> Tensor:
    sizes = (offsets[1:] - offsets[:-1]).to(reward.dtype)
    factor = torch.where(sizes > 1, sizes / (sizes - 1).clamp(min=1), torch.ones_like(sizes))
    return (reward - per_row(group_mean(reward, offsets), offsets)) * per_row(factor, offsets)


def whiten_stats(values: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """(mu, var) of `values` weighted by `weights` (token counts): mu = sum(w s) / sum(w),
    var = sum(w (s - mu)^2) / (sum(w) - 1), Bessel-corrected over tokens as verl does.

    With no weight at all mu = 0; with a total weight of 1 or less var = 0 (one token has no
    spread). When every weighted value is the same (rows without weight do not count), mu is
    that value and var is exactly 0, whatever float rounding says (the spec's zero spread).
    Callers pass values sorted by (value, weight), so the sums have a fixed order.
    """
    total = math.fsum(weights)
    if total <= 0:
        return 0.0, 0.0
    weighted = values[weights > 0]
    if weighted.min() == weighted.max():
        return float(weighted[0]), 0.0
    mu = math.fsum(values * weights) / total
    if total <= 1:
        return mu, 0.0
    return mu, math.fsum(weights * (values - mu) ** 2) / (total - 1)


class _GroupBaseline(ScoreExplanation):
    """Shared shape of the per-group estimators: no batch statistics, every row kept."""

    needs: tuple[str, ...] = ()
    batch_level = False

    def _scores(self, rows: GroupedRows) -> Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        mean, std = group_stats(rows.reward, rows.offsets)
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return Scores(score=self._scores(rows), keep=keep, group_mean=mean, group_std=std)


@dataclass(frozen=True)
class RLOOParams(StrategyParams):
    normalize_advantages: bool = param(
        False, hidden_at_default=True,
        help="TRL's option: whiten the leave-one-out scores over the batch, (a - mean(a)) / (std(a) + 1e-4), std "
             "ddof 1",
    )


@register("rloo", kind=ADVANTAGE, summary="leave-one-out baseline: (r - mean(G)) * n / (n - 1); TRL's normalize_advantages whitens over the batch")
class RLOO(_GroupBaseline, RLOOParams):
    def audit_baseline(self, rows: GroupedRows, group_mean: np.ndarray) -> np.ndarray:
        """The mean of the group's other rows."""
        reward, _, _, sizes = self.audit_rows(rows)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(sizes > 1, (group_mean * sizes - reward) / (sizes - 1), 0.0)

    @property
    def batch_level(self) -> bool:
        return self.normalize_advantages

    def _scores(self, rows):
        return rloo_scores(rows.reward, rows.offsets)

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        return rows.batch, self._scores(rows), torch.ones_like(rows.reward)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        # TRL RLOOTrainer: (a - a.mean()) / (a.std() + 1e-4) over the batch's sequences.
        n = len(values)
        mean = math.fsum(values) / n if n else 0.0
        # One row: TRL gives NaN (std of one value); its score is 0 here (s - mean = 0).
        std = math.sqrt(math.fsum((values - mean) ** 2) / (n - 1)) if n > 1 else 0.0
        return mean, std

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        base = super().score(rows, None)
        if not self.normalize_advantages:
            return base
        mean, std = batch_stats[:, 0], batch_stats[:, 1]
        score = (base.score - mean) / (std + TRL_ADVANTAGE_EPSILON)
        return Scores(score=score, keep=base.keep, group_mean=base.group_mean, group_std=base.group_std)


@dataclass(frozen=True)
class ReinforcePlusPlusBaselineParams(StrategyParams):
    pass


@register("reinforce_plus_plus_baseline", kind=ADVANTAGE, summary="r - mean(G), then whitened over the batch weighted by action tokens (REINFORCE++)")
class ReinforcePlusPlusBaseline(_GroupBaseline, ReinforcePlusPlusBaselineParams):
    """s_i = r_i - mean(G), whitened over the whole batch with weights = action tokens."""

    batch_level = True

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        return rows.batch, dr_grpo_scores(rows.reward, rows.offsets), rows.action_tokens.to(torch.float64)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        return whiten_stats(values, weights)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        base = super().score(rows, None)
        mu, var = batch_stats[:, 0], batch_stats[:, 1]
        score = (base.score - mu) / torch.sqrt(var + WHITEN_EPSILON)
        return Scores(score=score, keep=base.keep, group_mean=base.group_mean, group_std=base.group_std)

    def _scores(self, rows):
        return dr_grpo_scores(rows.reward, rows.offsets)
