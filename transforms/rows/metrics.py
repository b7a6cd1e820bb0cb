"""Run metrics as data: small Arrow tables from the scoring, copy-plan and writing steps,
summarised once into metrics.json.

Counting in the data (not only in Beam counters) makes metrics.json exact on every runner. Group
means are summed with math.fsum (exactly rounded), so the file does not depend on the order in
which the pieces arrive. No input value can fail the summary: sums beyond the float range are
taken scaled (`exact_sum`), and metrics.json is strict JSON (`metrics_json`): a metric whose
value is not a finite float (verl's ppl_ratio of a log-ratio of 800 is e^800) is null, and its
place is listed under `non_finite_metrics`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

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

OFFPOLICY_PREFIX = "offpolicy/"
"""Optional group-metric columns of a rollout_correction run: per group, the sums of verl's
off-policy metric terms (transforms/strategies/offpolicy.py METRIC_SUMS) and log_ppl_diff's max
and min; summarised per batch as `rollout_correction` in metrics.json."""

COPY_METRICS = pa.schema([("batch", pa.int64()), ("groups_duplicated", pa.int64()), ("rows_duplicated", pa.int64())])
"""One row per batch with copies: what the copy plan asked for."""

ROW_METRICS = pa.schema(
    [("batch", pa.int64()), ("status", pa.int8()), ("category", pa.string()), ("rows", pa.int64())]
)
"""Row counts by (batch, outcome, reject category); batch is null where it could not be read."""


_SCALE = 2.0**-600
"""Values are scaled by this power of two where their sum passes the float range: exact for
every value above 2^-422 (the rest are far below one ulp of such a sum)."""


def exact_sum(values) -> float:
    """math.fsum of `values` (exactly rounded, any order the same float) that never raises:
    finite values whose sum passes the float range give +-inf, NaN or +inf with -inf give NaN."""
    values = list(values)
    try:
        return math.fsum(values)
    except OverflowError:  # finite values whose partial sums pass the float range
        return math.fsum(v * _SCALE for v in values) / _SCALE  # +-inf where the true sum is out of range
    except ValueError:  # +inf and -inf
        return math.nan


def metrics_json(document: dict) -> str:
    """`document` as strict JSON text (no NaN, no Infinity: json.dumps(allow_nan=False)): every
    non-finite float becomes null, and the path of each is listed (sorted) under
    `non_finite_metrics` (absent where there is none)."""
    try:  # every number finite (the usual case): no walk over the document first
        return json.dumps(document, indent=2, allow_nan=False, default=_plain_number) + "\n"
    except ValueError:  # a NaN or an infinity somewhere: found and listed below
        pass
    found: list[str] = []

    def clean(value, path: str):
        if isinstance(value, float) and not math.isfinite(value):
            found.append(path)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{path}/{k}" if path else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{path}/{i}") for i, v in enumerate(value)]
        if isinstance(value, np.floating):
            return clean(float(value), path)
        if isinstance(value, np.integer):
            return int(value)
        return value

    cleaned = clean(document, "")
    if found:
        cleaned["non_finite_metrics"] = sorted(found)
    return json.dumps(cleaned, indent=2, allow_nan=False) + "\n"


def _plain_number(value):
    """json.dumps' `default`: a numpy scalar as the Python number metrics_json's walk makes of it."""
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.integer):
        return int(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


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


def _per_key(n: int, key: np.ndarray, values: np.ndarray) -> np.ndarray:
    """(n,) int64 sums of `values` by `key` (0..n-1)."""
    out = np.zeros(n, dtype=np.int64)
    np.add.at(out, key, values.astype(np.int64, copy=False))
    return out


def _summaries(n: int, groups: tuple[np.ndarray, pa.Table], rows: tuple[np.ndarray, pa.Table],
               copies: tuple[np.ndarray, pa.Table], stages) -> list[dict[str, Any]]:
    """The summary of each of `n` keys at once: each table comes with the key (0..n-1) of each
    of its rows. Sums are per key with numpy; the reward means and stds of a key's groups are
    summed with math.fsum (exactly rounded: any order gives the same float)."""
    g_key, g = groups
    r_key, r = rows
    c_key, c = copies
    status = r["status"].to_numpy()
    count = r["rows"].to_numpy()

    def total(code: int) -> np.ndarray:
        chosen = status == code
        return _per_key(n, r_key[chosen], count[chosen])

    written, duplicated, filtered, rejected = total(SCORED), total(DUPLICATED), total(FILTERED), total(REJECTED)
    size = g["size"].to_numpy()
    dropped_by_kind = {k: g[f"{k}_rows"].to_numpy() for k in STAGE_KINDS}
    dropped = sum(dropped_by_kind.values())
    n_groups = np.bincount(g_key, minlength=n)
    groups_filtered = np.bincount(g_key[dropped == size], minlength=n)
    zero_std = np.bincount(g_key[g["reward_std"].to_numpy() == 0], minlength=n)
    groups_duplicated = _per_key(n, c_key, c["groups_duplicated"].fill_null(0).to_numpy())
    order = np.argsort(g_key, kind="stable")
    bounds = np.searchsorted(g_key[order], np.arange(n + 1))
    means = g["reward_mean"].take(pa.array(order)).to_pylist()
    stds = g["reward_std"].take(pa.array(order)).to_pylist()
    reasons: list[dict[str, int]] = [{} for _ in range(n)]
    categories = r["category"]
    for i in np.flatnonzero(categories.is_valid().to_numpy(zero_copy_only=False)).tolist():
        found = reasons[r_key[i]]
        category = categories[i].as_py()
        found[category] = found.get(category, 0) + int(count[i])
    stage_sums = []  # per stage: (filtered rows, whole groups dropped) per key
    gone = np.zeros(len(size), dtype=np.int64)
    for kind, _name, _params, _metric in stages:
        d = dropped_by_kind.get(kind, np.zeros_like(size))  # a shaping stage drops nothing
        gone = gone + d
        stage_sums.append((_per_key(n, g_key, d), np.bincount(g_key[(d > 0) & (gone == size)], minlength=n)))
    offpolicy = _offpolicy_summaries(n, g_key, g)
    out = []
    for k in range(n):
        lo, hi, groups_k = int(bounds[k]), int(bounds[k + 1]), int(n_groups[k])
        summary = {
            "rows_read": int(written[k] + filtered[k] + rejected[k]),
            "rows_written": int(written[k] + duplicated[k]),
            "rows_written_original": int(written[k]),
            "rows_duplicated": int(duplicated[k]),
            "rows_filtered": int(filtered[k]),
            "rows_rejected": int(rejected[k]),
            "groups": groups_k,
            "groups_filtered": int(groups_filtered[k]),
            "groups_duplicated": int(groups_duplicated[k]),
            "groups_zero_std": int(zero_std[k]),
            MEAN_KEY: _mean(means[lo:hi]) if groups_k else None,
            STD_KEY: _mean(stds[lo:hi]) if groups_k else None,
            "reject_reasons": dict(sorted(reasons[k].items())),
        }
        strategies: dict[str, dict[str, int]] = {}
        for (kind, name, _params, metric), (rows_dropped, whole) in zip(stages, stage_sums):
            entry = {"filtered_count": int(rows_dropped[k]), "filtered_groups": int(whole[k])}
            if metric:
                entry[metric] = int(whole[k])
            strategies[name] = entry
        for kind, name, *_ in stages:
            if kind == "duplicate":
                strategies[name]["duplicated_count"] = summary["rows_duplicated"]
                strategies[name]["duplicated_groups"] = summary["groups_duplicated"]
        summary["strategies"] = strategies
        if offpolicy is not None and offpolicy[k] is not None:
            summary["rollout_correction"] = offpolicy[k]
        out.append(summary)
    return out


def _mean(values: list) -> float:
    """The mean of `values` (None counts as NaN): exactly rounded where the sum fits a float,
    else from the sum scaled by a power of two, so a mean of finite values is finite."""
    values = [math.nan if v is None else v for v in values]
    total = exact_sum(values)
    if math.isinf(total) and all(math.isfinite(v) for v in values):
        return exact_sum(v * _SCALE for v in values) / len(values) / _SCALE
    return total / len(values)


def _offpolicy_summaries(n: int, g_key: np.ndarray, g: pa.Table) -> list[dict[str, float] | None] | None:
    """Per key, verl's off-policy metrics from the groups' offpolicy/ sums (exactly rounded
    sums, so arrival order does not matter); None without them."""
    if OFFPOLICY_PREFIX + "rows" not in g.column_names:
        return None
    from rescore.transforms.strategies.offpolicy_verl import METRIC_SUMS, metrics_from_sums

    present = np.asarray(g[OFFPOLICY_PREFIX + "rows"].is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    values = {
        k: g[OFFPOLICY_PREFIX + k].fill_null(0.0).to_numpy(zero_copy_only=False).astype(np.float64)
        for k in METRIC_SUMS
        if OFFPOLICY_PREFIX + k in g.column_names
    }
    high = g[OFFPOLICY_PREFIX + "log_ppl_diff_max"].fill_null(-np.inf).to_numpy().astype(np.float64)
    low = g[OFFPOLICY_PREFIX + "log_ppl_diff_min"].fill_null(np.inf).to_numpy().astype(np.float64)
    out: list[dict[str, float] | None] = []
    for k in range(n):
        chosen = (g_key == k) & present
        sums = {name: exact_sum(v[chosen].tolist()) for name, v in values.items()}
        if sums["rows"] == 0 or sums["tokens"] == 0:
            out.append(None)
            continue
        out.append({name: float(v) for name, v in metrics_from_sums(sums, float(high[chosen].max()), float(low[chosen].min())).items()})
    return out


def summarize(
    group_tables: Iterable[pa.Table],
    row_tables: Iterable[pa.Table],
    copy_tables: Iterable[pa.Table] = (),
    stages: Sequence[tuple[str, str, dict, str | None]] = (),
) -> dict[str, Any]:
    """{"totals": {...}, "batches": [{"batch": id, ...}, ...]} for metrics.json.

    `stages`: (kind, name, params, dropped-groups counter or None) of each stage of the run, in
    order (StrategyChain.stage_metrics). Batches in increasing order, then (batch null) the rows
    whose batch could not be read; copies of a batch with no group or row are in the totals only.
    """
    tables = {  # one chunk per column: a table per read unit or bucket makes thousands of chunks
        "groups": pa.concat_tables([GROUP_METRICS.empty_table(), *group_tables], promote_options="default").combine_chunks(),
        "rows": pa.concat_tables([ROW_METRICS.empty_table(), *row_tables]).combine_chunks(),
        "copies": pa.concat_tables([COPY_METRICS.empty_table(), *copy_tables]).combine_chunks(),
    }
    known = {k: t.filter(t["batch"].is_valid()) for k, t in tables.items()}
    ids = np.union1d(known["groups"]["batch"].to_numpy(), known["rows"]["batch"].to_numpy())
    keyed = {}  # each table's rows of a batch in `ids`, with the batch's position there
    for k, t in known.items():
        batch = t["batch"].to_numpy()
        at = np.searchsorted(ids, batch)
        present = np.zeros(len(batch), dtype=bool)
        inside = at < len(ids)
        present[inside] = ids[at[inside]] == batch[inside]
        keyed[k] = (at[present].astype(np.int64), t.filter(pa.array(present)))
    per_batch = [
        {"batch": int(b), **summary}
        for b, summary in zip(ids.tolist(), _summaries(len(ids), keyed["groups"], keyed["rows"], keyed["copies"], stages))
    ]
    rows = tables["rows"]
    unknown = rows.filter(rows["batch"].is_null())
    if unknown.num_rows:
        empty = {k: (np.zeros(0, np.int64), t.slice(0, 0)) for k, t in tables.items()}
        (summary,) = _summaries(1, empty["groups"], (np.zeros(unknown.num_rows, np.int64), unknown), empty["copies"], stages)
        per_batch.append({"batch": None, **summary})
    everything = {k: (np.zeros(t.num_rows, np.int64), t) for k, t in tables.items()}
    (totals,) = _summaries(1, everything["groups"], everything["rows"], everything["copies"], stages)
    return {"totals": totals, "batches": per_batch}


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
