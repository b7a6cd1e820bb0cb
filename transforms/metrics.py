"""Run metrics as data: small Arrow tables from the scoring and writing steps, summarised once
into metrics.json.

Counting in the data (not only in Beam counters) makes metrics.json exact on every runner. Group
means are summed with math.fsum (exactly rounded), so the file does not depend on the order in
which the pieces arrive.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms.records import FILTERED, REJECTED, SCORED

MEAN_KEY = "group_advantages/reward_mean/mean"
STD_KEY = "group_advantages/reward_std/mean"

GROUP_METRICS = pa.schema(
    [("batch", pa.int64()), ("reward_mean", pa.float64()), ("reward_std", pa.float64()), ("filtered", pa.bool_())]
)
"""One row per task group: the statistics the strategy used, and whether it was dropped."""

ROW_METRICS = pa.schema(
    [("batch", pa.int64()), ("status", pa.int8()), ("category", pa.string()), ("rows", pa.int64())]
)
"""Row counts by (batch, outcome, reject category); batch is null where it could not be read."""


def group_metrics(batch: np.ndarray, mean: np.ndarray, std: np.ndarray, filtered: np.ndarray) -> pa.Table:
    return pa.Table.from_arrays(
        [pa.array(batch, pa.int64()), pa.array(mean, pa.float64()), pa.array(std, pa.float64()), pa.array(filtered, pa.bool_())],
        schema=GROUP_METRICS,
    )


def row_metrics(batch: pa.Array, status: np.ndarray, category: list) -> pa.Table:
    """Counts of rows per (batch, status, category) for one read unit."""
    rows = pa.Table.from_arrays(
        [batch, pa.array(status, pa.int8()), pa.array(category, pa.string()), pa.array(np.ones(len(status), np.int64))],
        schema=ROW_METRICS,
    )
    counted = rows.group_by(["batch", "status", "category"], use_threads=False).aggregate([("rows", "sum")])
    return counted.rename_columns({"rows_sum": "rows"}).select(ROW_METRICS.names).cast(ROW_METRICS)


def _batch_summary(groups: pa.Table, rows: pa.Table) -> dict[str, Any]:
    status = rows["status"].to_numpy()
    count = rows["rows"].to_numpy()

    def total(code: int) -> int:
        return int(count[status == code].sum())

    written = total(SCORED)
    out = {
        "rows_read": int(count.sum()),
        "rows_written": written,
        "rows_written_original": written,
        "rows_duplicated": 0,
        "rows_filtered": total(FILTERED),
        "rows_rejected": total(REJECTED),
        "groups": groups.num_rows,
        "groups_filtered": int(pc.sum(groups["filtered"]).as_py() or 0),
    }
    n = groups.num_rows
    out[MEAN_KEY] = math.fsum(groups["reward_mean"].to_pylist()) / n if n else None
    out[STD_KEY] = math.fsum(groups["reward_std"].to_pylist()) / n if n else None
    reasons: dict[str, int] = {}
    for category, c in zip(rows["category"].to_pylist(), count.tolist()):
        if category is not None:
            reasons[category] = reasons.get(category, 0) + c
    out["reject_reasons"] = dict(sorted(reasons.items()))
    return out


def _by_batch(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Rows with a known batch, sorted by batch, and their sorted batch ids."""
    known = table.filter(table["batch"].is_valid())
    batch = known["batch"].to_numpy()
    order = np.argsort(batch, kind="stable")
    return known.take(pa.array(order)), batch[order]


def summarize(group_tables: Iterable[pa.Table], row_tables: Iterable[pa.Table]) -> dict[str, Any]:
    """{"totals": {...}, "batches": [{"batch": id, ...}, ...]} for metrics.json."""
    groups = pa.concat_tables([GROUP_METRICS.empty_table(), *group_tables])
    rows = pa.concat_tables([ROW_METRICS.empty_table(), *row_tables])
    sorted_groups, group_batch = _by_batch(groups)
    sorted_rows, row_batch = _by_batch(rows)
    per_batch = []
    for b in np.union1d(group_batch, row_batch).tolist():
        g0, g1 = np.searchsorted(group_batch, [b, b + 1])
        r0, r1 = np.searchsorted(row_batch, [b, b + 1])
        g = sorted_groups.slice(g0, g1 - g0)
        r = sorted_rows.slice(r0, r1 - r0)
        per_batch.append({"batch": int(b), **_batch_summary(g, r)})
    unknown = rows.filter(rows["batch"].is_null())
    if unknown.num_rows:
        per_batch.append({"batch": None, **_batch_summary(groups.slice(0, 0), unknown)})
    return {"totals": _batch_summary(groups, rows), "batches": per_batch}
