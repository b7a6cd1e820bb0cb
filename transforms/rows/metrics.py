"""Run metrics as data: small Arrow tables from the scoring, copy-plan and writing steps,
summarised once into metrics.json.

Counting in the data (not only in Beam counters) makes metrics.json exact on every runner. Group
means are summed with math.fsum (exactly rounded), so the file does not depend on the order in
which the pieces arrive.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.transforms.rows.outcomes import DUPLICATED, FILTERED, REJECTED, SCORED

MEAN_KEY = "group_advantages/reward_mean/mean"
STD_KEY = "group_advantages/reward_std/mean"
STAGE_KINDS = ("filter", "advantage", "duplicate")

GROUP_METRICS = pa.schema(
    [
        ("batch", pa.int64()),
        ("size", pa.int64()),
        ("reward_mean", pa.float64()),
        ("reward_std", pa.float64()),
        ("filter_rows", pa.int64()),
        ("advantage_rows", pa.int64()),
        ("duplicate_rows", pa.int64()),
    ]
)
"""One row per task group: its rows, the statistics the strategy used, and the rows each
stage dropped."""

COPY_METRICS = pa.schema([("batch", pa.int64()), ("groups_duplicated", pa.int64()), ("rows_duplicated", pa.int64())])
"""One row per batch with copies: what the copy plan asked for."""

ROW_METRICS = pa.schema(
    [("batch", pa.int64()), ("status", pa.int8()), ("category", pa.string()), ("rows", pa.int64())]
)
"""Row counts by (batch, outcome, reject category); batch is null where it could not be read."""


def group_metrics(batch: np.ndarray, size: np.ndarray, mean: np.ndarray, std: np.ndarray, dropped: dict[str, np.ndarray]) -> pa.Table:
    zeros = np.zeros(len(batch), dtype=np.int64)
    return pa.Table.from_arrays(
        [
            pa.array(batch, pa.int64()),
            pa.array(size, pa.int64()),
            pa.array(mean, pa.float64()),
            pa.array(std, pa.float64()),
            *(pa.array(dropped.get(kind, zeros), pa.int64()) for kind in STAGE_KINDS),
        ],
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


def _stage_summary(groups: pa.Table, stages: Sequence[tuple[str, str, dict, str | None]]) -> dict[str, dict[str, int]]:
    size = groups["size"].to_numpy()
    gone = np.zeros(len(size), dtype=np.int64)
    out = {}
    for kind, name, params, dropped_groups_metric in stages:
        dropped = groups[f"{kind}_rows"].to_numpy()
        gone = gone + dropped
        whole = int(((dropped > 0) & (gone == size)).sum())
        entry = {"filtered_count": int(dropped.sum()), "filtered_groups": whole}
        if dropped_groups_metric:
            entry[dropped_groups_metric] = whole
        out[name] = entry
    return out


def _batch_summary(groups: pa.Table, rows: pa.Table, copies: pa.Table, stages) -> dict[str, Any]:
    status = rows["status"].to_numpy()
    count = rows["rows"].to_numpy()

    def total(code: int) -> int:
        return int(count[status == code].sum())

    written, duplicated = total(SCORED), total(DUPLICATED)
    size = groups["size"].to_numpy()
    dropped = sum(groups[f"{k}_rows"].to_numpy() for k in STAGE_KINDS) if groups.num_rows else np.zeros(0)
    out = {
        "rows_read": written + total(FILTERED) + total(REJECTED),
        "rows_written": written + duplicated,
        "rows_written_original": written,
        "rows_duplicated": duplicated,
        "rows_filtered": total(FILTERED),
        "rows_rejected": total(REJECTED),
        "groups": groups.num_rows,
        "groups_filtered": int((dropped == size).sum()) if groups.num_rows else 0,
        "groups_duplicated": int(pc.sum(copies["groups_duplicated"]).as_py() or 0),
        "groups_zero_std": int((groups["reward_std"].to_numpy() == 0).sum()) if groups.num_rows else 0,
    }
    n = groups.num_rows
    out[MEAN_KEY] = math.fsum(groups["reward_mean"].to_pylist()) / n if n else None
    out[STD_KEY] = math.fsum(groups["reward_std"].to_pylist()) / n if n else None
    reasons: dict[str, int] = {}
    for category, c in zip(rows["category"].to_pylist(), count.tolist()):
        if category is not None:
            reasons[category] = reasons.get(category, 0) + c
    out["reject_reasons"] = dict(sorted(reasons.items()))
    stage_summary = _stage_summary(groups, stages)
    for kind, name, *_ in stages:
        if kind == "duplicate":
            stage_summary[name]["duplicated_count"] = duplicated
            stage_summary[name]["duplicated_groups"] = out["groups_duplicated"]
    out["strategies"] = stage_summary
    return out


def _by_batch(table: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Rows with a known batch, sorted by batch, and their sorted batch ids."""
    known = table.filter(table["batch"].is_valid())
    batch = known["batch"].to_numpy()
    order = np.argsort(batch, kind="stable")
    return known.take(pa.array(order)), batch[order]


def summarize(
    group_tables: Iterable[pa.Table],
    row_tables: Iterable[pa.Table],
    copy_tables: Iterable[pa.Table] = (),
    stages: Sequence[tuple[str, str, dict, str | None]] = (),
) -> dict[str, Any]:
    """{"totals": {...}, "batches": [{"batch": id, ...}, ...]} for metrics.json.

    `stages`: (kind, name, params, dropped-groups counter or None) of each stage of the run, in
    order (StrategyChain.stage_metrics).
    """
    tables = {
        "groups": pa.concat_tables([GROUP_METRICS.empty_table(), *group_tables]),
        "rows": pa.concat_tables([ROW_METRICS.empty_table(), *row_tables]),
        "copies": pa.concat_tables([COPY_METRICS.empty_table(), *copy_tables]),
    }
    by_batch = {k: _by_batch(t) for k, t in tables.items()}
    per_batch = []
    for b in np.union1d(by_batch["groups"][1], by_batch["rows"][1]).tolist():
        parts = {}
        for k, (table, batch) in by_batch.items():
            lo, hi = np.searchsorted(batch, [b, b + 1])
            parts[k] = table.slice(lo, hi - lo)
        per_batch.append({"batch": int(b), **_batch_summary(parts["groups"], parts["rows"], parts["copies"], stages)})
    rows = tables["rows"]
    unknown = rows.filter(rows["batch"].is_null())
    if unknown.num_rows:
        empty = {k: t.slice(0, 0) for k, t in tables.items()}
        per_batch.append({"batch": None, **_batch_summary(empty["groups"], unknown, empty["copies"], stages)})
    return {"totals": _batch_summary(tables["groups"], rows, tables["copies"], stages), "batches": per_batch}


def check_accounting(totals: dict, units_written: list[int], units: int, rows_read: int, copy_tables: Iterable[pa.Table]) -> None:
    """RuntimeError unless the run accounts for everything: every read unit written once,
    `read = written_original + filtered + rejected` for the `rows_read` rows of the plan, and
    as many copied rows written as the copy plans (COPY_METRICS tables) asked for."""
    if sorted(units_written) != list(range(units)):
        missing = sorted(set(range(units)) - set(units_written))
        raise RuntimeError(f"internal error: read units {missing[:10]} produced no output")
    if totals["rows_read"] != rows_read:
        raise RuntimeError(
            f"internal error: input has {rows_read} rows, metrics account for "
            f"{totals['rows_read']} written/filtered/rejected"
        )
    planned = sum(int(t["rows_duplicated"].to_numpy().sum()) for t in copy_tables)
    if planned != totals["rows_duplicated"]:
        raise RuntimeError(
            f"internal error: the copy plan asked for {planned} copied rows, {totals['rows_duplicated']} were written"
        )


def reject_budget_failure(totals: dict, max_fraction: float) -> str | None:
    """The one-line reason the run fails its reject budget, or None."""
    read, rejected = totals["rows_read"], totals["rows_rejected"]
    if read == 0 or rejected / read <= max_fraction:
        return None
    top = ", ".join(f"{k} {v:,}" for k, v in sorted(totals["reject_reasons"].items(), key=lambda kv: -kv[1])[:3])
    return (
        f"{rejected:,} of {read:,} rows ({rejected / read:.1%}) were rejected ({top}), more than "
        f"--max-reject-fraction={max_fraction:g}"
    )
