"""Normalisation of rewards into advantages: the family, and two estimators built on it.

    normalize        score = (r - m) / (s + eps)                        (AReaL `Normalization`)
        m  mean_level group: the group mean; batch: the batch mean; none: 0;
           mean_leave1out: the mean of the other rows of the group / batch (0 alone)
        s  std_level group / batch: sqrt(sum w (x - c)^2 / (W - ddof)), over the group / batch,
           x = r - m, c = 0 (std_of=centered, AReaL) or x = r, c = its mean at that level
           (std_of=reward, TRL's scale_rewards=batch); ddof 1 with std_unbiased, else 0;
           a set with W <= ddof has s = 1; std_level none: s = 1 and eps = 0
        w  1 per row, or the row's action tokens (weighting=token)
    maxrl            (r - mean(G)) / (mean(G) + epsilon); r for a group of one (SkyRL)
    flash_reinforce  r - mean(batch), no whitening (OpenRLHF)

Special cases (tests/strategies/test_estimators_units.py checks each equality):
    grpo (groups of 2+)      mean_level=group, std_level=group, eps=epsilon
    OpenRLHF group_norm      the same with eps=1e-9
    TRL scale_rewards=group  eps=1e-4; =batch: std_level=batch, std_of=reward; =none: std_level=none
    dr_grpo                  mean_level=group, std_level=none
    rloo                     mean_level=group, mean_leave1out, std_level=none
    AReaL's defaults         mean_level=batch, std_level=batch, std_unbiased, eps=1e-5
Unlike grpo's convention (mean 0, std 1), a group of one row has mean = its reward, so scores
0 with mean_level=group (AReaL; TRL with one generation); a leave-one-out mean of one row is 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, ScoreExplanation, Scores
from rescore.transforms.strategies.function_estimator import estimator
from rescore.transforms.strategies.registry import ADVANTAGE, ConfigError, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats, per_row, segment_sum, zero_spread
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def weighted_mean(values: Tensor, weights: Tensor, offsets: Tensor) -> Tensor:
    """(G,) sum w x / sum w per segment (0 where sum w is 0); exactly the value where every
    value of the segment is equal."""
    total = segment_sum(weights, offsets)
    mean = segment_sum(values * weights, offsets) / torch.where(total > 0, total, torch.ones_like(total))
    mean = torch.where(total > 0, mean, torch.zeros_like(mean))
    flat = zero_spread(values, offsets)
    if values.numel():
        mean = torch.where(flat & (total > 0), values[offsets[:-1].clamp(max=values.numel() - 1)], mean)
    return mean


def leave_one_out_mean(values: Tensor, offsets: Tensor) -> Tensor:
    """(n,) the mean of the other rows of each row's segment; 0 for a segment of one."""
    sizes = per_row(offsets[1:] - offsets[:-1], offsets).to(values.dtype)
    total = per_row(segment_sum(values, offsets), offsets)
    out = (total - values) / torch.clamp(sizes - 1, min=1)
    flat = per_row(zero_spread(values, offsets), offsets)
    out = torch.where(flat, values, out)
    return torch.where(sizes <= 1, torch.zeros_like(out), out)


def spread(values: Tensor, center: Tensor, weights: Tensor, offsets: Tensor, ddof: int) -> Tensor:
    """(G,) sqrt(sum w (x - c)^2 / (W - ddof)) per segment, c (n,); 1 where W <= ddof (and
    where W is 0)."""
    total = segment_sum(weights, offsets)
    dev = values - center
    sq = segment_sum(weights * dev * dev, offsets)
    denom = total - ddof
    ok = denom > 0
    return torch.where(ok, torch.sqrt(sq / torch.where(ok, denom, torch.ones_like(denom))), torch.ones_like(sq))


def batch_offsets(batch: Tensor) -> Tensor:
    """(B + 1,) boundaries of the batches of rows sorted by batch."""
    n = batch.numel()
    starts = torch.ones(n, dtype=torch.bool, device=batch.device)
    if n > 1:
        starts[1:] = batch[1:] != batch[:-1]
    return torch.cat([torch.nonzero(starts).flatten(), torch.tensor([n], dtype=torch.int64, device=batch.device)])


def normalize_scores(
    reward: Tensor, weights: Tensor, offsets: Tensor, batch_of: Tensor, *, mean_level: str, mean_leave1out: bool,
    std_level: str, std_unbiased: bool, eps: float, std_of: str,
) -> Tensor:
    """(n,) scores of rows sorted by (batch, group); `offsets` (G + 1,) the groups, `batch_of`
    (B + 1,) the batches (the whole batch must be present: a reference, or one bucket per
    batch; the pipeline gives batch statistics instead, see Normalize)."""
    levels = {"group": offsets, "batch": batch_of}
    if mean_level == "none":
        mean = torch.zeros_like(reward)
    elif mean_leave1out:
        mean = leave_one_out_mean(reward, levels[mean_level])
    else:
        mean = per_row(weighted_mean(reward, weights, levels[mean_level]), levels[mean_level])
    centered = reward - mean
    if std_level == "none":
        return centered
    at = levels[std_level]
    ddof = 1 if std_unbiased else 0
    if std_of == "reward":
        std = spread(reward, per_row(weighted_mean(reward, weights, at), at), weights, at, ddof)
    else:
        std = spread(centered, torch.zeros_like(centered), weights, at, ddof)
    return centered / (per_row(std, at) + eps)


@dataclass(frozen=True)
class NormalizeParams(StrategyParams):
    mean_level: Literal["group", "batch", "none"] = param("batch", help="`m`: the group mean, the batch mean, or `none` (0)")
    mean_leave1out: bool = param(
        False,
        help="`m` is the mean of the *other* rows of the group / batch (0 for a set of one); needs `weighting=row`",
    )
    std_level: Literal["group", "batch", "none"] = param(
        "batch",
        help="`s` over the group, the batch, or `none` (`s = 1` and `eps = 0`)",
    )
    std_unbiased: bool = param(True, help="ddof 1, else 0; a set with weight ≤ ddof has `s = 1`")
    eps: float = param(1e-5, minimum=0.0, help="added to `s`")
    std_of: Literal["centered", "reward"] = param(
        "centered",
        help="`centered`: `s = sqrt(Σ w (r - m)² / (W - ddof))` about 0, `m` as used (AReaL); `reward`: the std of"
             " the raw rewards at `std_level` about their own mean (TRL's `scale_rewards=batch`)",
    )
    weighting: Literal["row", "token"] = param(
        "row",
        help="`token`: every mean and std weighs a row by its action tokens (AReaL's `loss_mask`)",
    )

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if values["mean_leave1out"] and values["weighting"] == "token":
            raise ConfigError(f"{strategy}: 'mean_leave1out' needs weighting=row (a token-weighted leave-one-out mean is not defined)")
        if values["mean_leave1out"] and values["mean_level"] == "none":
            raise ConfigError(f"{strategy}: 'mean_leave1out' needs mean_level group or batch")


@register("normalize", kind=ADVANTAGE, summary="(r - mean) / (std + eps): mean over group / batch / leave-one-out / none, std over group / batch / none (AReaL NormConfig)")
class Normalize(ScoreExplanation, NormalizeParams):
    """The family above. A batch-level mean or std comes from batch statistics (the pipeline's
    second GroupByKey): (mean of r, std about it, RMS of r - group-level mean) per batch."""

    needs: tuple[str, ...] = ()

    @property
    def batch_level(self) -> bool:
        return "batch" in (self.mean_level, self.std_level)

    def audit_baseline(self, rows: GroupedRows, group_mean: np.ndarray) -> np.ndarray:
        """The group mean where that is what it subtracts (mean_level=group, row weights);
        null otherwise (a batch, leave-one-out or token-weighted mean)."""
        plain = self.mean_level == "group" and not self.mean_leave1out and self.weighting == "row"
        return group_mean.copy() if plain else np.full(rows.num_rows, np.nan)

    def _weights(self, rows: GroupedRows) -> Tensor:
        return rows.action_tokens.to(torch.float64) if self.weighting == "token" else torch.ones_like(rows.reward)

    def _group_centered(self, rows: GroupedRows) -> Tensor:
        """r - the mean when that mean is per group (or none): computable inside a bucket."""
        if self.mean_level == "none":
            return rows.reward
        if self.mean_leave1out:
            return rows.reward - leave_one_out_mean(rows.reward, rows.offsets)
        return rows.reward - per_row(weighted_mean(rows.reward, self._weights(rows), rows.offsets), rows.offsets)

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        if self.mean_level == "batch" or self.std_of == "reward":
            values = rows.reward
        else:
            values = self._group_centered(rows)
        return rows.batch, values, self._weights(rows)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        """(weighted mean, std about it, RMS about 0, sum of weights, sum of values)."""
        ddof = 1 if self.std_unbiased else 0
        total = float(weights.sum())
        if total <= 0:
            return (0.0, 1.0, 1.0, 0.0, 0.0)
        flat = len(values) > 0 and bool((values == values[0]).all())
        mean = float(values[0]) if flat else float((values * weights).sum() / total)
        sq = 0.0 if flat else float((weights * (values - mean) ** 2).sum())
        rms_sq = float((weights * values**2).sum())
        std = float(np.sqrt(sq / (total - ddof))) if total > ddof else 1.0
        rms = float(np.sqrt(rms_sq / (total - ddof))) if total > ddof else 1.0
        return (mean, std, rms, total, float((values * weights).sum()))

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        reward = rows.reward
        w = self._weights(rows)
        if self.mean_level == "batch":
            if self.mean_leave1out:
                total, count = batch_stats[:, 4], batch_stats[:, 3]
                loo = (total - reward) / torch.clamp(count - 1, min=1)
                mean = torch.where(count <= 1, torch.zeros_like(reward), loo)
            else:
                mean = batch_stats[:, 0]
            centered = reward - mean
        else:
            centered = self._group_centered(rows)
        g_mean, g_std = group_stats(reward, rows.offsets)
        if self.std_level == "none":
            return Scores(centered, torch.ones_like(reward, dtype=torch.bool), g_mean, g_std)
        ddof = 1 if self.std_unbiased else 0
        if self.std_level == "group":
            if self.std_of == "reward":
                std = spread(reward, per_row(weighted_mean(reward, w, rows.offsets), rows.offsets), w, rows.offsets, ddof)
            else:
                std = spread(centered, torch.zeros_like(centered), w, rows.offsets, ddof)
            std = per_row(std, rows.offsets)
        elif self.mean_level == "batch" and self.mean_leave1out and self.std_of == "centered":
            # r - (T - r) / (N - 1) = N / (N - 1) * (r - T / N): the RMS of those is
            # N / (N - 1) times the std about the batch mean; N <= 1: the RMS of r itself.
            count = batch_stats[:, 3]
            std = torch.where(count > 1, count / torch.clamp(count - 1, min=1) * batch_stats[:, 1], batch_stats[:, 2])
        elif self.std_of == "reward" or self.mean_level == "batch":
            std = batch_stats[:, 1]
        else:
            std = batch_stats[:, 2]
        return Scores(centered / (std + self.eps), torch.ones_like(reward, dtype=torch.bool), g_mean, g_std)


@estimator("maxrl", summary="(r - mean(G)) / (mean(G) + epsilon); a group of one row keeps r (SkyRL `maxrl`)")
def maxrl_scores(
    reward: Tensor, offsets: Tensor, *, epsilon: float = param(1e-6, minimum=0.0, help="added to the group mean that divides")
) -> Tensor:
    """(n,) (r - mean(G)) / (mean(G) + epsilon); r for a group of one (SkyRL)."""
    sizes = per_row(offsets[1:] - offsets[:-1], offsets)
    mean = per_row(weighted_mean(reward, torch.ones_like(reward), offsets), offsets)
    return torch.where(sizes > 1, (reward - mean) / (mean + epsilon), reward)


@dataclass(frozen=True)
class FlashReinforceParams(StrategyParams):
    pass


@register("flash_reinforce", kind=ADVANTAGE, summary="r - the batch's mean reward, no whitening (OpenRLHF `flash_reinforce`)")
class FlashReinforce(FlashReinforceParams):
    """r - the batch mean (row-weighted, over the rows this stage sees)."""

    batch_level = True
    needs: tuple[str, ...] = ()

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        return rows.batch, rows.reward, torch.ones_like(rows.reward)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        if len(values) == 0:
            return (0.0,)
        if bool((values == values[0]).all()):
            return (float(values[0]),)
        return (float(values.sum() / len(values)),)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        mean, std = group_stats(rows.reward, rows.offsets)
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return Scores(rows.reward - batch_stats[:, 0], keep, mean, std)
