"""Filters users ask for, as the first stage of a run (before the advantage strategy).

    filter_groups            DAPO dynamic sampling (verl `algorithm.filter_groups`): drop groups
    (dynamic_sampling)       of 2+ rows whose `metric` column has one value on every row (std 0)
    dynamic_filtering        OpenRLHF `--dynamic_filtering`: keep groups whose mean `metric` lies
                             strictly inside `dynamic_filtering_reward_range`
    mask_response_truncated  Trinity-RFT's operator (TRL `mask_truncated_completions`): rows whose
    (mask_truncated_completions)
                             `truncate_status` is "response_truncated" (or true) keep their place
                             in the group statistics but get advantages 0 and an all-zero
                             `action_mask`; with `drop`, they are dropped before scoring instead
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from rescore.transforms.strategies.base import GroupedRows, Scores, audit_rows, group_reasons
from rescore.transforms.strategies.catalog import (
    DynamicFilteringParams,
    FilterGroupsParams,
    MaskResponseTruncatedParams,
    PassRateBandParams,
)
from rescore.transforms.strategies.hashing import string_key
from rescore.transforms.strategies.segments import group_stats, masked_group_stats, per_row, population_var, segment_sum

TRUNCATED = "response_truncated"


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


class FilterGroups(_MetricFilter, FilterGroupsParams):
    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        _, offsets, g, _ = audit_rows(rows)
        values = _metric(rows, self.metric).detach().cpu().numpy().astype(np.float64)
        _, _, std = masked_group_stats(values, offsets, reached)
        return group_reasons(g, dropped, lambda i: f"{self.name}: {self.metric} std {std[i]:.6g} <= 0")

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        sizes = rows.offsets[1:] - rows.offsets[:-1]
        return (sizes == 1) | (population_var(_metric(rows, self.metric), rows.offsets) > 0)


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
    """(n,) bool from the light column: a hash of the status string, or a bool as 0/1."""
    if column_is_hash:
        return values == string_key(TRUNCATED)
    return values != 0


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


class PassRateBand(_Filter, PassRateBandParams):
    """Per group (no `task_stats`): the group's own pass rate. With `task_stats`: the task's
    pass rate over its whole history, looked up by the task's fixed hash; a task missing from
    the table is kept or dropped by `unseen`. The table is read once per process."""

    needs: tuple[str, ...] = ()

    def _history(self) -> tuple[np.ndarray, np.ndarray]:
        # I/O where the strategy runs, not math: the row layer reads the table (Arrow)
        from rescore.transforms.rows.task_stats import history_pass_rates

        return history_pass_rates(self.task_stats)

    def _group_rates(self, rows: GroupedRows) -> tuple[np.ndarray, np.ndarray]:
        """(G,) float64 pass rates and (G,) bool known (False: a task missing from the table)."""
        offsets = rows.offsets.detach().cpu()
        if self.task_stats is None:
            p = pass_rates(rows.reward.detach().cpu(), offsets, self.threshold).numpy()
            return p, np.ones(len(p), dtype=bool)
        keys, rates = self._history()
        first = rows.task_key.detach().cpu().numpy()[offsets[:-1].numpy()]
        at = np.clip(np.searchsorted(keys, first), 0, max(len(keys) - 1, 0))
        known = (keys[at] == first) if len(keys) else np.zeros(len(first), dtype=bool)
        p = np.where(known, rates[at] if len(keys) else 0.0, np.nan)
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
