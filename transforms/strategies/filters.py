"""Filters users ask for, as the first stage of a run (before the advantage strategy).

    filter_groups            DAPO dynamic sampling as verl does it (`algorithm.filter_groups`):
                             drop groups of 2+ rows whose `metric` column has one value on every
                             row (std 0); a group of one row is kept
    dapo_dynamic_sampling    DAPO dynamic sampling as Trinity-RFT 0.6.0 does it
    (dynamic_sampling)       (`DAPODynamicSamplingFilter`): a row is correct when its metric (the
                             `metric_key` column, else its reward) > `correct_threshold`; keep a
                             group of 2+ rows with 0 < correct < n; drop a group of one row.
                             The two agree on binary metrics with groups of 2+ rows.
    reward_filter            Trinity's row-level operator: keep rows with reward >= threshold
    reward_std_filter        Trinity's group operator: drop groups of one row and groups whose
                             reward std (ddof=0, np.std) <= threshold
    zero_variance_filter     SkyRL (trainer.algorithm.zero_variance_filter): a row is live when it
                             has action tokens; drop a group with 2+ live rows whose live rewards
                             lie within `zero_variance_filter_tol` (max - min <= tol); a group
                             with at most one live row is kept
    dynamic_filtering        OpenRLHF `--dynamic_filtering`: keep groups whose mean `metric` lies
                             strictly inside `dynamic_filtering_reward_range`
    mask_response_truncated  Trinity-RFT's operator (TRL `mask_truncated_completions`): rows whose
    (mask_truncated_completions)
                             `truncate_status` is "response_truncated" (or true) keep their place
                             in the group statistics but get advantages 0 and an all-zero
                             `action_mask`; with `drop`, they are dropped before scoring instead
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, Scores, audit_rows, group_reasons
from rescore.transforms.strategies.features import Feature, FeatureRows, OptionalColumn
from rescore.transforms.strategies.hashing import RESPONSE_TRUNCATED, string_key
from rescore.transforms.strategies.registry import (
    FILTER,
    Column,
    ConfigError,
    Path,
    StrategyParams,
    param,
    register,
)
from rescore.transforms.strategies.segments import (
    group_stats,
    masked_group_stats,
    per_row,
    population_var,
    segment_sum,
)
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor

TRUNCATED = RESPONSE_TRUNCATED  # one of hashing.COMPARED_STRINGS: its code is exact


def _metric(rows: GroupedRows, metric: str) -> Tensor:
    return rows.reward if metric == "reward" else rows.columns[metric].to(torch.float64)


class _Filter:
    batch_level = False

    def _keep_groups(self, rows: GroupedRows) -> Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = per_row(self._keep_groups(rows), rows.offsets)
        return Scores(None, keep, *group_stats(rows.reward, rows.offsets))


class _MetricFilter(_Filter):
    metric: str

    @property
    def needs(self) -> tuple[str, ...]:
        return () if self.metric == "reward" else (self.metric,)


@dataclass(frozen=True)
class FilterGroupsParams(StrategyParams):
    metric: Column = param("acc", help="the raw metric column whose spread decides (`reward`: the reward column)")


@register("filter_groups", kind=FILTER, summary="verl's DAPO filter_groups: drop groups of 2+ rows whose `metric` column has no spread")
class FilterGroups(_MetricFilter, FilterGroupsParams):
    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        _, offsets, g, _ = audit_rows(rows)
        values = _metric(rows, self.metric).detach().cpu().numpy().astype(np.float64)
        _, _, std = masked_group_stats(values, offsets, reached)
        return group_reasons(g, dropped, lambda i: f"{self.name}: {self.metric} std {std[i]:.6g} <= 0")

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        sizes = rows.offsets[1:] - rows.offsets[:-1]
        return (sizes == 1) | (population_var(_metric(rows, self.metric), rows.offsets) > 0)


def dapo_keep_groups(correct: Tensor, offsets: Tensor) -> Tensor:
    """(G,) bool: groups of 2+ rows with some but not all rows correct. correct (n,) bool."""
    sizes = offsets[1:] - offsets[:-1]
    count = segment_sum(correct.to(torch.int64), offsets)
    return (sizes >= 2) & (count > 0) & (count < sizes)


@dataclass(frozen=True)
class DAPODynamicSamplingParams(StrategyParams):
    metric_key: Column = param(
        "accuracy",
        help="the metric column; where the input has no such column, or a row's value is null, the row's reward "
             "(Trinity: exp.metrics[metric_key], else exp.reward)",
    )
    correct_threshold: float = param(0.0, help="a row is correct when its metric > correct_threshold")


@register("dynamic_sampling", kind=FILTER, summary="DAPO dynamic sampling (Trinity): keep groups of 2+ rows with 0 < #(metric > correct_threshold) < n")
@register("dapo_dynamic_sampling", kind=FILTER, summary="DAPO dynamic sampling (Trinity): keep groups of 2+ rows with 0 < #(metric > correct_threshold) < n")
class DAPODynamicSampling(_Filter, DAPODynamicSamplingParams):
    @property
    def needs(self) -> tuple[str, ...]:
        return () if self.metric_key == "reward" else (OptionalColumn(self.metric_key),)

    def outcome(self, rows: GroupedRows) -> Tensor:
        """(n,) float64 the metric of each row: the column's value, the reward where missing."""
        if self.metric_key == "reward":
            return rows.reward
        values = rows.columns[self.metric_key].to(torch.float64)
        return torch.where(torch.isnan(values), rows.reward, values)

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        return dapo_keep_groups(self.outcome(rows) > self.correct_threshold, rows.offsets)

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        _, offsets, g, _ = audit_rows(rows)
        correct = (self.outcome(rows) > self.correct_threshold).cpu().numpy()
        count = np.bincount(g, weights=correct, minlength=len(offsets) - 1).astype(np.int64)
        sizes = np.diff(offsets)

        def reason(i: int) -> str:
            if sizes[i] < 2:
                return f"{self.name}: a group of one row"
            what = "every row" if count[i] == sizes[i] else "no row"
            return f"{self.name}: {what} of {sizes[i]} has {self.metric_key} > {self.correct_threshold:g}"

        return group_reasons(g, dropped, reason)


@dataclass(frozen=True)
class DynamicFilteringParams(StrategyParams):
    dynamic_filtering_reward_range: tuple[float, float] = param(
        (0.0, 1.0),
        help="[low, high]: keep groups whose mean metric lies strictly inside",
    )
    metric: Column = param("reward", help="the column whose group mean is compared (default the reward)")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        low, high = values["dynamic_filtering_reward_range"]
        if not low < high:
            raise ConfigError(f"{strategy}: 'dynamic_filtering_reward_range' needs low < high, got {[low, high]}")


@register("dynamic_filtering", kind=FILTER, summary="OpenRLHF dynamic filtering: keep groups whose mean `metric` lies strictly inside the range")
class DynamicFiltering(_MetricFilter, DynamicFilteringParams):
    @property
    def low(self) -> float:
        return self.dynamic_filtering_reward_range[0]

    @property
    def high(self) -> float:
        return self.dynamic_filtering_reward_range[1]

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        _, offsets, g, _ = audit_rows(rows)
        values = _metric(rows, self.metric).detach().cpu().numpy().astype(np.float64)
        sums = np.bincount(g, weights=values, minlength=len(offsets) - 1)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = sums / np.diff(offsets)
        return group_reasons(
            g, dropped,
            lambda i: f"{self.name}: {self.metric} mean {mean[i]:.6g} <= {self.low:g}" if mean[i] <= self.low
            else f"{self.name}: {self.metric} mean {mean[i]:.6g} >= {self.high:g}",
        )

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        values = _metric(rows, self.metric)
        mean = segment_sum(values, rows.offsets) / (rows.offsets[1:] - rows.offsets[:-1]).to(values.dtype)
        return (mean > self.low) & (mean < self.high)


def truncated_flags(values: Tensor, column_is_hash: bool) -> Tensor:
    """(n,) bool from the light column: the status string's exact code (rows/groups.py), or a
    bool as 0/1."""
    if column_is_hash:
        return values == string_key(TRUNCATED)
    return values != 0


@dataclass(frozen=True)
class MaskResponseTruncatedParams(StrategyParams):
    truncate_status_key: Column = param(
        "truncate_status",
        help="the column whose value `response_truncated` (or true) flags a truncated response",
    )
    drop: bool = param(False, help="drop flagged rows before scoring instead of zeroing their advantages and action_mask")


@register("mask_truncated_completions", kind=FILTER, summary="truncated responses (truncate_status): advantages 0 and action_mask zeroed, or dropped with drop=true")
@register("mask_response_truncated", kind=FILTER, summary="truncated responses (truncate_status): advantages 0 and action_mask zeroed, or dropped with drop=true")
class MaskResponseTruncated(_Filter, MaskResponseTruncatedParams):
    """Flags the rows whose `truncate_status_key` column says TRUNCATED (or is true); the
    MasksRows capability (base.py) zeroes their advantages and action mask, or with `drop`
    they are dropped before scoring."""

    mask_status = TRUNCATED

    @property
    def column(self) -> str:
        return self.truncate_status_key

    @property
    def mask_column(self) -> str:
        return self.truncate_status_key

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.truncate_status_key,)

    @property
    def masks(self) -> bool:
        return not self.drop

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        return [f"{self.name}: {self.column} is {TRUNCATED} (drop=true)"] * len(dropped)

    def flagged(self, rows: GroupedRows) -> Tensor:
        values = rows.columns[self.column]
        return truncated_flags(values, not values.is_floating_point())

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = ~self.flagged(rows) if self.drop else torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return Scores(None, keep, *group_stats(rows.reward, rows.offsets))

    def masked(self, rows: GroupedRows) -> Tensor | None:
        """(n,) bool rows whose advantages the plan zeroes (masking mode), or None."""
        return None if self.drop else self.flagged(rows)


def pass_rates(reward: Tensor, offsets: Tensor, threshold: float) -> Tensor:
    """(G,) float64 share of each group's rows with reward >= threshold."""
    passed = (reward >= threshold).to(torch.float64)
    return segment_sum(passed, offsets) / (offsets[1:] - offsets[:-1]).to(torch.float64)


def in_band(p, lo: float, hi: float):
    """lo < p < hi, elementwise (the one definition the filter and `rescore task-stats --band` use)."""
    return (p > lo) & (p < hi)


TASK_HISTORY_COLUMN = "task_history_pass_rate"


@dataclass(frozen=True)
class TaskHistory(Feature):
    """Need of pass_rate_band with task_stats: light column x.task_history_pass_rate, the pass
    rate of the row's task in the `rescore task-stats` output at `path`, matched by the task's
    exact value (NaN: the task is not in the table)."""

    path: str

    def light(self, rows: FeatureRows) -> dict[str, np.ndarray]:
        return {TASK_HISTORY_COLUMN: rows.task_history(self.path)}


@dataclass(frozen=True)
class PassRateBandParams(StrategyParams):
    lo: float = param(0.0, between=(0.0, 1.0), help="keep tasks whose pass rate is > lo")
    hi: float = param(1.0, between=(0.0, 1.0), help="keep tasks whose pass rate is < hi")
    threshold: float = param(1.0, help="a row passes when its reward >= threshold (without task_stats)")
    task_stats: Path | None = param(
        None,
        help="a `rescore task-stats` output directory or table: the task's pass rate over its whole history "
             "instead of the group's",
    )
    unseen: Literal["keep", "drop"] = param("keep", help="with task_stats: `keep` or `drop` a task the table lacks")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if not values["lo"] < values["hi"]:
            raise ConfigError(f"{strategy}: needs lo < hi, got lo={values['lo']!r}, hi={values['hi']!r}")


@register("pass_rate_band", kind=FILTER, summary="keep tasks whose pass rate (share of rows with reward >= threshold) lies strictly inside (lo, hi): "
    "the group's, or the task's whole history from a `rescore task-stats` table (task_stats)")
class PassRateBand(_Filter, PassRateBandParams):
    """Per group (no `task_stats`): the group's own pass rate. With `task_stats`: the task's
    pass rate over its whole history, matched by the task's exact value where the row is read
    (the need TaskHistory: a hash never decides that two tasks are one); a task
    missing from the table is kept or dropped by `unseen`. The launcher reads the table before the
    run (pipelines/task_history.py); this module never touches a file."""

    @property
    def needs(self) -> tuple[str, ...]:
        return () if self.task_stats is None else (TaskHistory(self.task_stats),)

    def _group_rates(self, rows: GroupedRows) -> tuple[np.ndarray, np.ndarray]:
        """(G,) float64 pass rates and (G,) bool known (False: a task missing from the table)."""
        offsets = rows.offsets.detach().cpu()
        if self.task_stats is None:
            p = pass_rates(rows.reward.detach().cpu(), offsets, self.threshold).numpy()
            return p, np.ones(len(p), dtype=bool)
        # every row of a group has its task's rate: the group's first row says it
        p = rows.columns[TASK_HISTORY_COLUMN].detach().cpu().numpy()[offsets[:-1].numpy()]
        known = ~np.isnan(p)
        return p, known

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        p, known = self._group_rates(rows)
        keep = np.where(known, in_band(p, self.lo, self.hi), self.unseen == "keep")
        return torch.as_tensor(keep, dtype=torch.bool, device=rows.reward.device)

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        _, _, g, _ = audit_rows(rows)
        p, known = self._group_rates(rows)
        what = "task pass rate" if self.task_stats else "pass rate"

        def reason(i: int) -> str:
            if not known[i]:
                return f"{self.name}: task not in task_stats (unseen=drop)"
            return f"{self.name}: {what} {p[i]:.6g} <= {self.lo:g}" if p[i] <= self.lo else f"{self.name}: {what} {p[i]:.6g} >= {self.hi:g}"

        return group_reasons(g, dropped, reason)

@dataclass(frozen=True)
class RewardFilterParams(StrategyParams):
    threshold: float = param(0.0, help="keep rows with reward >= threshold")


@register("reward_filter", kind=FILTER, summary="row-level: keep rows with reward >= threshold (Trinity `reward_filter`)")
class RewardFilter(RewardFilterParams):
    batch_level = False
    needs: tuple[str, ...] = ()

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        return Scores(None, rows.reward >= self.threshold, *group_stats(rows.reward, rows.offsets))

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        reward = rows.reward.detach().cpu().numpy()
        return [f"{self.name}: reward {reward[i]:.6g} < {self.threshold:g}" for i in dropped]


@dataclass(frozen=True)
class RewardSTDFilterParams(StrategyParams):
    threshold: float = param(0.0, help="drop groups whose reward std (ddof 0) <= threshold")


@register("reward_std_filter", kind=FILTER, summary="drop groups with fewer than 2 rows or reward std (ddof=0) <= threshold (Trinity `reward_std_filter`)")
class RewardSTDFilter(_Filter, RewardSTDFilterParams):
    needs: tuple[str, ...] = ()

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        sizes = rows.offsets[1:] - rows.offsets[:-1]
        return (sizes >= 2) & (torch.sqrt(population_var(rows.reward, rows.offsets)) > self.threshold)

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        _, offsets, g, _ = audit_rows(rows)
        std = torch.sqrt(population_var(rows.reward, rows.offsets)).cpu().numpy()
        sizes = np.diff(offsets)
        return group_reasons(
            g, dropped,
            lambda i: f"{self.name}: a group of one row" if sizes[i] < 2 else f"{self.name}: std {std[i]:.6g} <= {self.threshold:g}",
        )


def live_spread(reward: Tensor, live: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """((G,) live rows, (G,) max - min of the live rewards; 0 without live rows)."""
    count = segment_sum(live.to(torch.int64), offsets)
    if reward.numel() == 0:
        return count, torch.zeros_like(count, dtype=reward.dtype)
    hi = torch.segment_reduce(torch.where(live, reward, torch.full_like(reward, -torch.inf)), "max", offsets=offsets, unsafe=True)
    lo = torch.segment_reduce(torch.where(live, reward, torch.full_like(reward, torch.inf)), "min", offsets=offsets, unsafe=True)
    return count, torch.where(count > 0, hi - lo, torch.zeros_like(hi))


@dataclass(frozen=True)
class ZeroVarianceFilterParams(StrategyParams):
    zero_variance_filter_tol: float = param(
        1e-6, minimum=0.0,
        help="a group with 2+ live rows whose live rewards satisfy max - min <= tol is dropped",
    )


@register("zero_variance_filter", kind=FILTER, summary="drop groups with 2+ live rows (action tokens > 0) whose rewards lie within tol (SkyRL)")
class ZeroVarianceFilter(_Filter, ZeroVarianceFilterParams):
    needs: tuple[str, ...] = ()

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        count, spread = live_spread(rows.reward, rows.action_tokens > 0, rows.offsets)
        return ~((count > 1) & (spread <= self.zero_variance_filter_tol))

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        _, _, g, _ = audit_rows(rows)
        count, spread = (t.cpu().numpy() for t in live_spread(rows.reward, rows.action_tokens > 0, rows.offsets))
        return group_reasons(
            g, dropped,
            lambda i: f"{self.name}: {count[i]} live rows, reward spread {spread[i]:.6g} <= {self.zero_variance_filter_tol:g}",
        )
