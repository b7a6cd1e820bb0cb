"""Outcome-reward estimators of Trinity-RFT 0.6.0 and verl 0.9.1 that need no live model.

    reinforce    r_i                                                (Trinity `reinforce`, the TOPR preset)
    rec          r_i - mean(K), optionally / (std0(K) + epsilon); K = the group after the
                 `drop="balance"` mode drops surplus below-mean rows  (Trinity `rec`)
    opo          r_i - sum(len r) / sum(len), len = action tokens     (verl `opo`)
    grpo_passk   the group's best row gets (r_max - r_2nd) [/ (std + epsilon)], others 0 (verl `grpo_passk`)
    gpg          alpha * (r_i - mean(G)) / f_norm, alpha = rows of the batch / rows with r != 0 (verl `gpg`)
    gdpo         sum_k w_k GRPO(r_k), then whitened over the batch by tokens (verl `gdpo`)
    remax        r_i - b_i, b_i = the greedy response's reward (verl / Trinity `remax`)

Group statistics come from the shared segment helpers (transforms/strategies/segments.py), so
their rule for groups of one row and for all-equal groups reaches every estimator here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, ScoreExplanation, Scores
from rescore.transforms.strategies.baselines import WHITEN_EPSILON, whiten_stats
from rescore.transforms.strategies.function_estimator import estimator
from rescore.transforms.strategies.hashing import mix64
from rescore.transforms.strategies.registry import ADVANTAGE, Column, ConfigError, StrategyParams, param, register
from rescore.transforms.strategies.segments import (
    group_stats,
    masked_group_stats,
    mean_and_std,
    per_row,
    population_var,
    rank_within_groups,
    segment_max,
    segment_sum,
)
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def _sizes(offsets: Tensor) -> Tensor:
    return offsets[1:] - offsets[:-1]


def _sub_offsets(keep: Tensor, offsets: Tensor) -> Tensor:
    """(G + 1,) boundaries of the kept rows of each group (no group may be left empty)."""
    counts = segment_sum(keep, offsets)
    out = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=keep.device)
    torch.cumsum(counts, 0, out=out[1:])
    return out


def row_keys(rows: GroupedRows, seed: int) -> Tensor:
    """(n,) int64 fixed hash of (seed, batch, task, run, step): per-row randomness that depends
    on the data keys only, never on a global RNG or on the order rows arrive in."""
    batch = rows.batch.cpu().numpy().view(np.uint64)
    task = (rows.task_key.cpu().numpy() if rows.task_key is not None else np.zeros(rows.num_rows, np.int64)).view(np.uint64)
    run = rows.run.cpu().numpy().view(np.uint64)
    step = rows.step.cpu().numpy().view(np.uint64)
    h = mix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF) ^ np.uint64(0x9E3779B97F4A7C15))
    for part in (batch, task, run, step):
        h = mix64(h ^ mix64(part))
    return torch.from_numpy(h.view(np.int64).copy()).to(rows.reward.device)


# --- pure functions ----------------------------------------------------------------------------


def exact_whiten_stats(values: np.ndarray, weights: np.ndarray) -> tuple[float, float]:
    """`whiten_stats`, with the spec's zero-spread rule: when every weighted value is the
    same, mu is that value and var is exactly 0 (a rounded sum could leave 1e-35)."""
    weighted = values[weights > 0]
    if len(weighted) and weighted.min() == weighted.max():
        return float(weighted[0]), 0.0
    return whiten_stats(values, weights)


def rec_scores(
    reward: Tensor, offsets: Tensor, *, epsilon: float, std_normalize: bool, drop: str | None, key: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Trinity-RFT `RECGroupedAdvantage`. Returns (score (n,), dropped (n,) bool, mean (G,), std (G,)).

    is_pos = r >= mean(G). With drop="balance" and more below-mean rows than the others, the
    surplus below-mean rows are dropped (score 0): those with the smallest `key` (a hash of
    the row's ids). Then over the rows left K: mean(K) and the population std (ddof=0); a group
    with one row left has mean 0 and std 1. Score r - mean(K), or / (std + epsilon) with
    std_normalize. A group of one row is never dropped (Trinity fails on it).
    """
    sizes = _sizes(offsets)
    mean_all = group_stats(reward, offsets)[0]
    dropped = torch.zeros_like(reward, dtype=torch.bool)
    if drop == "balance":
        neg = reward < per_row(mean_all, offsets)
        neg_count = segment_sum(neg, offsets)
        extra = torch.clamp(neg_count - (sizes - neg_count), min=0)
        k = key if key is not None else torch.zeros(reward.shape, dtype=torch.int64, device=reward.device)
        order_key = torch.where(neg, k, torch.full_like(k, torch.iinfo(torch.int64).max))
        rank = rank_within_groups(order_key, offsets)
        dropped = neg & (rank < per_row(extra, offsets)) & per_row(sizes > 1, offsets)
    keep = ~dropped
    sub = _sub_offsets(keep, offsets)
    kept_reward = reward[keep]
    kept_sizes = _sizes(sub)
    mean = mean_and_std(kept_reward, sub)[0]
    std = torch.sqrt(population_var(kept_reward, sub))
    few = kept_sizes <= 1
    mean = torch.where(few, torch.zeros_like(mean), mean)
    std = torch.where(few, torch.ones_like(std), std)
    score = reward - per_row(mean, offsets)
    if std_normalize:
        score = score / (per_row(std, offsets) + epsilon)
    return torch.where(dropped, torch.zeros_like(score), score), dropped, mean, std


def opo_baseline(reward: Tensor, offsets: Tensor, action_tokens: Tensor) -> np.ndarray:
    """opo's length-weighted group mean per row (opo_scores, in numpy): the audit baseline."""
    reward = reward.detach().cpu().numpy().astype(np.float64)
    offsets = offsets.detach().cpu().numpy().astype(np.int64)
    g = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    groups = len(offsets) - 1
    sizes = np.diff(offsets)
    length = action_tokens.detach().cpu().numpy().astype(np.float64)
    total = np.bincount(g, weights=length, minlength=groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        weighted = np.bincount(g, weights=length * reward, minlength=groups) / np.where(total > 0, total, 1.0)
        plain = np.bincount(g, weights=reward, minlength=groups) / sizes
    b = np.where(total > 0, weighted, plain)
    top = np.full(groups, -np.inf)
    low = np.full(groups, np.inf)
    np.maximum.at(top, g, reward)
    np.minimum.at(low, g, reward)
    b = np.where(top == low, top, b)
    return np.where(sizes == 1, 0.0, b)[g]


@estimator("opo", summary="r - length-weighted group mean (verl `opo`, arXiv 2505.23585)", baseline=opo_baseline)
def opo_scores(
    reward: Tensor, offsets: Tensor, action_tokens: Tensor, *, epsilon: float = param(1e-6, minimum=0.0, help="accepted and unused, as in verl")
) -> Tensor:
    """verl `compute_opo_outcome_advantage`: r_i - sum_G(len r) / sum_G(len), len = action
    tokens; a group of one row has baseline 0. A group without any action token (verl: 0/0)
    takes the plain mean; its advantages are all masked anyway."""
    length = action_tokens.to(reward.dtype)
    sizes = _sizes(offsets)
    total = segment_sum(length, offsets)
    weighted = segment_sum(length * reward, offsets) / torch.where(total > 0, total, torch.ones_like(total))
    baseline = torch.where(total > 0, weighted, group_stats(reward, offsets)[0])
    # All-equal rewards: the baseline is that reward exactly (a weighted sum could round).
    top = segment_max(reward, offsets)
    equal = top == -segment_max(-reward, offsets)
    baseline = torch.where(equal, top, baseline)
    baseline = torch.where(sizes == 1, torch.zeros_like(baseline), baseline)
    return reward - per_row(baseline, offsets)


def passk_baseline(reward: Tensor, offsets: Tensor) -> np.ndarray:
    """r_second for the group's first top row; NaN for the rows that score 0 (the audit baseline)."""
    reward = reward.detach().cpu().numpy().astype(np.float64)
    offsets = offsets.detach().cpu().numpy().astype(np.int64)
    out = np.full(len(reward), np.nan)
    for a, b in zip(offsets[:-1], offsets[1:]):
        if b - a < 2:
            continue
        first = a + int(np.argmax(reward[a:b]))
        out[first] = np.max(np.delete(reward[a:b], first - a))
    return out


@estimator(
    "grpo_passk", summary="only the group's best row scores (r_max - r_second) [/ (std + epsilon)] (verl `grpo_passk`)", baseline=passk_baseline
)
def passk_scores(
    reward: Tensor,
    offsets: Tensor,
    *,
    epsilon: float = param(1e-6, minimum=0.0, help="added to the std with norm_adv_by_std_in_grpo"),
    norm_adv_by_std_in_grpo: bool = param(True, help="divide r_max - r_second by std(G) + epsilon"),
) -> Tensor:
    """verl `compute_grpo_passk_outcome_advantage`: in each group only the first row with the
    top reward scores r_max - r_second_max (divided by std(G) + epsilon when normalising);
    every other row scores 0. A group of one row scores 0 (verl refuses such a group)."""
    sizes = _sizes(offsets)
    top = per_row(segment_max(reward, offsets), offsets)
    at_top = (reward == top).to(torch.int64)
    starts = per_row(offsets[:-1], offsets)
    running = torch.cumsum(at_top, 0)
    before = torch.cat([torch.zeros(1, dtype=torch.int64, device=reward.device), running])[starts]
    first_top = (at_top == 1) & (running - before == 1)
    second = per_row(segment_max(torch.where(first_top, torch.full_like(reward, -torch.inf), reward), offsets), offsets)
    adv = top - second
    if norm_adv_by_std_in_grpo:
        adv = adv / (per_row(mean_and_std(reward, offsets)[1], offsets) + epsilon)
    ok = first_top & per_row(sizes > 1, offsets)
    return torch.where(ok, adv, torch.zeros_like(adv))


def grpo_per_group(values: Tensor, offsets: Tensor, *, epsilon: float, norm: bool) -> Tensor:
    """verl `compute_grpo_outcome_advantage` on one reward dimension: (v - mean) / (std + eps)
    (or v - mean), a group of one row having mean 0 and std 1."""
    mean, std = group_stats(values, offsets)
    centred = values - per_row(mean, offsets)
    return centred / (per_row(std, offsets) + epsilon) if norm else centred


# --- strategy objects --------------------------------------------------------------------------


class _Estimator:
    needs: tuple[str, ...] = ()
    batch_level = False

    def _stats(self, rows: GroupedRows) -> tuple[Tensor, Tensor]:
        return group_stats(rows.reward, rows.offsets)

    def _keep(self, rows: GroupedRows) -> Tensor:
        return torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)


def _no_baseline(reward: Tensor) -> np.ndarray:
    """reinforce subtracts nothing: its audit baseline is 0."""
    return np.zeros(reward.shape[0])


@estimator("reinforce", summary="the raw reward r (Trinity `reinforce`; the TOPR preset)", baseline=_no_baseline)
def reinforce_scores(reward: Tensor) -> Tensor:
    """(n,) the reward itself (Trinity `REINFORCEGroupAdvantage`)."""
    return reward.clone()


@dataclass(frozen=True)
class RECParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0, help="added to the std")
    std_normalize: bool = param(False, null=False, help="divide by the group's std")
    drop: Literal["balance"] | None = param(
        None,
        help="`balance`: when a group has more rows below its mean (`r < mean(G)`) than others, the surplus "
             "below-mean rows score 0",
    )
    seed: int = param(0, minimum=0, help="(not Trinity's) which below-mean rows `balance` drops")


@register("rec", kind=ADVANTAGE, summary="r - mean, optionally / (std + epsilon), with drop=balance of surplus below-mean rows (Trinity `rec`)")
class REC(_Estimator, ScoreExplanation, RECParams):
    def dropped(self, rows: GroupedRows) -> np.ndarray:
        """(n,) bool: the rows drop="balance" dropped (they score 0)."""
        if not self.drop:
            return np.zeros(rows.num_rows, dtype=bool)
        _, dropped, _, _ = rec_scores(
            rows.reward, rows.offsets, epsilon=self.epsilon, std_normalize=self.std_normalize, drop=self.drop, key=row_keys(rows, self.seed)
        )
        return dropped.detach().cpu().numpy().astype(bool)

    def audit_baseline(self, rows: GroupedRows, group_mean: np.ndarray) -> np.ndarray:
        """mean(K) of the rows `drop` left (0 for a group of one row left); NaN for a dropped row."""
        return np.where(self.dropped(rows), np.nan, group_mean.copy())

    def audit_group_std(self, rows: GroupedRows, group_std: np.ndarray) -> np.ndarray:
        """The std over the rows left (K) with ddof=1, as the docs define the column; 1 where
        fewer than 2 rows are left (rec's own convention)."""
        reward, offsets, g, _ = self.audit_rows(rows)
        count, _, std = masked_group_stats(reward, offsets, ~self.dropped(rows))
        return np.where(count < 2, 1.0, std)[g]


    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        key = row_keys(rows, self.seed) if self.drop else None
        score, _, mean, std = rec_scores(
            rows.reward, rows.offsets, epsilon=self.epsilon, std_normalize=self.std_normalize, drop=self.drop, key=key
        )
        return Scores(score, self._keep(rows), mean, std)







@dataclass(frozen=True)
class GPGParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0, help="accepted and unused, as in verl")
    f_norm: float = param(1.0, nonzero=True, help="divides the advantage; must not be 0")
    alpha: float = param(
        1.0,
        help="accepted for configs that set it; verl 0.9.1 overwrites it with rows of the batch / max(rows with r "
             "!= 0, 1), and so does Rescore",
    )


@register("gpg", kind=ADVANTAGE, summary="alpha * (r - mean(G)) / f_norm, alpha = batch rows / rows with r != 0 (verl `gpg`)")
class GPG(_Estimator, ScoreExplanation, GPGParams):
    batch_level = True

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        return rows.batch, rows.reward, torch.ones_like(rows.reward)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        # verl: alpha = bsz / max(count_nonzero(scores), 1) over the trainer's batch.
        return (len(values) / max(int(np.count_nonzero(values)), 1),)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        mean, std = self._stats(rows)
        alpha = batch_stats[:, 0]
        s = alpha * (rows.reward - per_row(mean, rows.offsets)) / self.f_norm
        return Scores(s, self._keep(rows), mean, std)


@dataclass(frozen=True)
class GDPOParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0, help="added to the std of each reward column's GRPO step")
    norm_adv_by_std_in_grpo: bool = param(True, help="GRPO per column divides by std + epsilon; false: r_k - mean only")
    gdpo_reward_keys: tuple[Column, ...] = param(
        (),
        help="the reward columns, each normalised within the group (none: the `reward` column alone)",
    )
    gdpo_reward_weights: tuple[float, ...] | None = param(None, help="w_k of the weighted sum, one per column (null: all 1)")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        weights, columns = values["gdpo_reward_weights"], max(len(values["gdpo_reward_keys"]), 1)
        if weights is not None and len(weights) != columns:
            raise ConfigError(f"{strategy}: 'gdpo_reward_weights' has {len(weights)} weights for {columns} reward columns")


@register("gdpo", kind=ADVANTAGE, summary="GRPO per reward column, weighted sum, whitened over the batch by tokens (verl `gdpo`)")
class GDPO(_Estimator, GDPOParams):
    batch_level = True

    @property
    def needs(self) -> tuple[str, ...]:
        return tuple(k for k in self.gdpo_reward_keys if k != "reward")

    def summed(self, rows: GroupedRows) -> Tensor:
        """(n,) sum_k w_k GRPO(r_k) before the batch whitening."""
        keys = self.gdpo_reward_keys or ("reward",)
        weights = self.gdpo_reward_weights or (1.0,) * len(keys)
        total = torch.zeros_like(rows.reward)
        for key, w in zip(keys, weights):
            values = rows.reward if key == "reward" else rows.columns[key].to(torch.float64)
            total = total + w * grpo_per_group(values, rows.offsets, epsilon=self.epsilon, norm=self.norm_adv_by_std_in_grpo)
        return total

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        return rows.batch, self.summed(rows), rows.action_tokens.to(torch.float64)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        return exact_whiten_stats(values, weights)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        mu, var = batch_stats[:, 0], batch_stats[:, 1]
        s = (self.summed(rows) - mu) / torch.sqrt(var + WHITEN_EPSILON)
        return Scores(s, self._keep(rows), *self._stats(rows))


@dataclass(frozen=True)
class ReMaxParams(StrategyParams):
    reward_baselines: Column = param("reward_baselines", help="the column holding the greedy response's reward b_i")


@register("remax", kind=ADVANTAGE, summary="r - the greedy response's reward, read from a column (verl / Trinity `remax`)")
class ReMax(_Estimator, ScoreExplanation, ReMaxParams):
    def audit_baseline(self, rows: GroupedRows, group_mean: np.ndarray) -> np.ndarray:
        """The greedy-decode reward column."""
        return rows.columns[self.reward_baselines].detach().cpu().numpy().astype(np.float64)

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.reward_baselines,)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        reward = rows.reward
        if rows.last_action is not None:
            # The outcome reward sits on the last response token and is masked with it.
            reward = torch.where(rows.last_action, reward, torch.zeros_like(reward))
        s = reward - rows.columns[self.reward_baselines].to(torch.float64)
        return Scores(s, self._keep(rows), *self._stats(rows))
