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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import Tensor

from rescore.transforms.strategies.base import FILTER, GroupedRows, Scores
from rescore.transforms.strategies.registry import ConfigError, flag, number, register
from rescore.transforms.strategies.segments import group_stats, per_row, population_var, segment_sum

TRUNCATED = "response_truncated"


def _metric(rows: GroupedRows, metric: str) -> Tensor:
    return rows.reward if metric == "reward" else rows.columns[metric].to(torch.float64)


def _column(strategy: str, key: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{strategy}: parameter {key!r} must be a column name, got {value!r}")
    return value


@dataclass(frozen=True)
class _Filter:
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    kind = FILTER
    batch_level = False

    def _keep_groups(self, rows: GroupedRows) -> Tensor:  # pragma: no cover - overridden
        raise NotImplementedError

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = per_row(self._keep_groups(rows), rows.offsets)
        return Scores(None, keep, *group_stats(rows.reward, rows.offsets))


@dataclass(frozen=True)
class FilterGroups(_Filter):
    metric: str = "acc"

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        sizes = rows.offsets[1:] - rows.offsets[:-1]
        return (sizes == 1) | (population_var(_metric(rows, self.metric), rows.offsets) > 0)


@dataclass(frozen=True)
class DynamicFiltering(_Filter):
    low: float = 0.0
    high: float = 1.0
    metric: str = "reward"

    def _keep_groups(self, rows: GroupedRows) -> Tensor:
        values = _metric(rows, self.metric)
        mean = segment_sum(values, rows.offsets) / (rows.offsets[1:] - rows.offsets[:-1]).to(values.dtype)
        return (mean > self.low) & (mean < self.high)


def truncated_flags(values: Tensor, column_is_hash: bool) -> Tensor:
    """(n,) bool from the light column: a hash of the status string, or a bool as 0/1."""
    if column_is_hash:
        from rescore.transforms.rows.keys import task_hash

        target = int(task_hash(pa.array([TRUNCATED])).view(np.int64)[0])
        return values == target
    return values != 0


@dataclass(frozen=True)
class MaskResponseTruncated(_Filter):
    column: str = "truncate_status"
    drop: bool = False

    def flagged(self, rows: GroupedRows) -> Tensor:
        values = rows.columns[self.column]
        return truncated_flags(values, not values.is_floating_point())

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = ~self.flagged(rows) if self.drop else torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return Scores(None, keep, *group_stats(rows.reward, rows.offsets))

    def masked(self, rows: GroupedRows) -> Tensor | None:
        """(n,) bool rows whose advantages the plan zeroes (masking mode), or None."""
        return None if self.drop else self.flagged(rows)

    def table_flags(self, table: pa.Table) -> np.ndarray:
        """(n,) bool: the rows of an output table that are masked."""
        column = table[self.column]
        if pa.types.is_boolean(column.type) or pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
            return np.asarray(pc.fill_null(pc.cast(column, pa.float64()), 0.0).to_numpy(), dtype=np.float64) != 0
        return np.asarray(pc.fill_null(pc.equal(column.cast(pa.string()), TRUNCATED), False).to_numpy(zero_copy_only=False), dtype=bool)

    def output_fields(self, input_schema: pa.Schema) -> list[pa.Field]:
        if self.drop or "action_mask" not in input_schema.names:
            return []
        return [input_schema.field("action_mask")]

    def output_columns(self, table: pa.Table, fields: list[pa.Field]) -> list[pa.Array]:
        """`action_mask` with every value of a masked row set to 0 (Trinity zeroes the mask)."""
        mask = table["action_mask"].combine_chunks()
        flags = self.table_flags(table)
        lengths = np.asarray(pc.fill_null(pc.list_value_length(mask), 0).to_numpy(), dtype=np.int64)
        zero = np.repeat(flags, lengths)
        values = mask.flatten()
        new_values = pc.if_else(pa.array(zero), pa.scalar(False if pa.types.is_boolean(values.type) else 0, values.type), values)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        rebuilt = pa.ListArray.from_arrays(pa.array(offsets), new_values, mask=mask.is_null())
        return [rebuilt.cast(fields[0].type)]


def _register_filter_groups(name: str):
    @register(
        name,
        kind=FILTER,
        defaults={"metric": "acc"},
        summary="DAPO dynamic sampling: drop groups of 2+ rows whose `metric` column has no spread",
    )
    def make(metric) -> FilterGroups:
        metric = _column(name, "metric", metric)
        return FilterGroups(name=name, params={"metric": metric}, needs=() if metric == "reward" else (metric,), metric=metric)

    return make


make_filter_groups = _register_filter_groups("filter_groups")
make_dynamic_sampling = _register_filter_groups("dynamic_sampling")


@register(
    "dynamic_filtering",
    kind=FILTER,
    defaults={"dynamic_filtering_reward_range": [0.0, 1.0], "metric": "reward"},
    summary="OpenRLHF dynamic filtering: keep groups whose mean `metric` lies strictly inside the range",
)
def make_dynamic_filtering(dynamic_filtering_reward_range, metric) -> DynamicFiltering:
    name = "dynamic_filtering"
    bounds = dynamic_filtering_reward_range
    if not isinstance(bounds, (list, tuple)) or len(bounds) != 2:
        raise ConfigError(f"{name}: parameter 'dynamic_filtering_reward_range' must be [low, high], got {bounds!r}")
    low, high = (number(name, "dynamic_filtering_reward_range", b) for b in bounds)
    if not low < high:
        raise ConfigError(f"{name}: 'dynamic_filtering_reward_range' needs low < high, got {[low, high]}")
    metric = _column(name, "metric", metric)
    params = {"dynamic_filtering_reward_range": [low, high], "metric": metric}
    return DynamicFiltering(name=name, params=params, needs=() if metric == "reward" else (metric,), low=low, high=high, metric=metric)


def _register_mask(name: str):
    @register(
        name,
        kind=FILTER,
        defaults={"truncate_status_key": "truncate_status", "drop": False},
        summary="truncated responses (truncate_status): advantages 0 and action_mask zeroed, or dropped with drop=true",
    )
    def make(truncate_status_key, drop) -> MaskResponseTruncated:
        column = _column(name, "truncate_status_key", truncate_status_key)
        params = {"truncate_status_key": column, "drop": flag(name, "drop", drop)}
        return MaskResponseTruncated(name=name, params=params, needs=(column,), column=column, drop=params["drop"])

    return make


make_mask_response_truncated = _register_mask("mask_response_truncated")
make_mask_truncated_completions = _register_mask("mask_truncated_completions")
