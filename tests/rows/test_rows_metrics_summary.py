"""metrics.summarize computes every batch's summary at once (numpy per-key sums); here it is
checked against the definition written out batch by batch: each batch's slice of the group, row
and copy tables summarised on its own, the totals over everything, rows of no batch last."""

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rescore.transforms.rows.metrics import COPY_METRICS, GROUP_METRICS, MEAN_KEY, ROW_METRICS, STD_KEY, STAGE_KINDS, summarize
from rescore.transforms.rows.outcomes import DUPLICATED, FILTERED, REJECTED, SCORED

STAGES = [
    ("filter", "reward_variance_filter", {}, "dropped_groups"),
    ("advantage", "grpo", {}, None),
    ("duplicate", "polaris", {}, None),
]


def one_summary(groups: pa.Table, rows: pa.Table, copies: pa.Table, stages) -> dict:
    """The summary of one batch (or of everything), from its own rows, loop by loop."""
    def rows_with(code):
        return sum(r["rows"] for r in rows.to_pylist() if r["status"] == code)

    g = groups.to_pylist()
    written, duplicated = rows_with(SCORED), rows_with(DUPLICATED)
    reasons = {}
    for r in rows.to_pylist():
        if r["category"] is not None:
            reasons[r["category"]] = reasons.get(r["category"], 0) + r["rows"]
    out = {
        "rows_read": written + rows_with(FILTERED) + rows_with(REJECTED),
        "rows_written": written + duplicated,
        "rows_written_original": written,
        "rows_duplicated": duplicated,
        "rows_filtered": rows_with(FILTERED),
        "rows_rejected": rows_with(REJECTED),
        "groups": len(g),
        "groups_filtered": sum(1 for x in g if sum(x[f"{k}_rows"] for k in STAGE_KINDS) == x["size"]),
        "groups_duplicated": sum(c["groups_duplicated"] or 0 for c in copies.to_pylist()),
        "groups_zero_std": sum(1 for x in g if x["reward_std"] == 0),
        MEAN_KEY: math.fsum(x["reward_mean"] for x in g) / len(g) if g else None,
        STD_KEY: math.fsum(x["reward_std"] for x in g) / len(g) if g else None,
        "reject_reasons": dict(sorted(reasons.items())),
    }
    strategies, gone = {}, [0] * len(g)
    for kind, name, _, metric in stages:
        whole = 0
        for i, x in enumerate(g):
            gone[i] += x[f"{kind}_rows"]
            whole += x[f"{kind}_rows"] > 0 and gone[i] == x["size"]
        strategies[name] = {"filtered_count": sum(x[f"{kind}_rows"] for x in g), "filtered_groups": whole}
        if metric:
            strategies[name][metric] = whole
        if kind == "duplicate":
            strategies[name].update(duplicated_count=duplicated, duplicated_groups=out["groups_duplicated"])
    out["strategies"] = strategies
    return out


def random_tables(seed: int):
    rng = np.random.default_rng(seed)
    n_groups, n_rows = int(rng.integers(0, 60)), int(rng.integers(0, 80))
    size = rng.integers(1, 9, n_groups)
    dropped = {k: np.where(rng.random(n_groups) < 0.3, rng.integers(0, 9, n_groups) % (size + 1), 0) for k in STAGE_KINDS}
    groups = pa.Table.from_arrays([
        pa.array(rng.integers(0, 12, n_groups), pa.int64()),
        pa.array(size, pa.int64()),
        pa.array(rng.normal(size=n_groups) * 1e3, pa.float64()),
        pa.array(np.where(rng.random(n_groups) < 0.2, 0.0, rng.random(n_groups)), pa.float64()),
        *(pa.array(dropped[k], pa.int64()) for k in STAGE_KINDS),
    ], schema=GROUP_METRICS)
    status = rng.choice([SCORED, DUPLICATED, FILTERED, REJECTED], n_rows)
    category = [rng.choice(["bad_reward", "empty_tokens", "mask_mismatch"]) if s == REJECTED else None for s in status]
    batch = [None if rng.random() < 0.1 else int(b) for b in rng.integers(0, 14, n_rows)]
    rows = pa.Table.from_arrays([
        pa.array(batch, pa.int64()), pa.array(status, pa.int8()), pa.array(category, pa.string()),
        pa.array(rng.integers(1, 1000, n_rows), pa.int64()),
    ], schema=ROW_METRICS)
    n_copies = int(rng.integers(0, 6))
    copies = pa.Table.from_arrays([
        pa.array(rng.integers(0, 16, n_copies), pa.int64()),  # some batches with copies only
        pa.array([None if rng.random() < 0.2 else int(v) for v in rng.integers(0, 5, n_copies)], pa.int64()),
        pa.array(rng.integers(0, 50, n_copies), pa.int64()),
    ], schema=COPY_METRICS)
    return groups, rows, copies


def split(table: pa.Table, parts: int) -> list[pa.Table]:
    """The table in `parts` pieces, as the metrics of several units or buckets arrive."""
    cuts = np.linspace(0, table.num_rows, parts + 1).astype(int)
    return [table.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]


@pytest.mark.parametrize("seed", range(40))
def test_every_batch_and_the_totals_match_the_definition(seed):
    groups, rows, copies = random_tables(seed)
    doc = summarize(split(groups, 3), split(rows, 2), split(copies, 2), STAGES)
    known = sorted(set(groups["batch"].to_pylist()) | {b for b in rows["batch"].to_pylist() if b is not None})

    def of(table, b):
        return table.filter(pc.equal(table["batch"], b)) if b is not None else table.filter(table["batch"].is_null())

    expected = [{"batch": b, **one_summary(of(groups, b), of(rows, b), of(copies, b), STAGES)} for b in known]
    if rows["batch"].null_count:
        expected.append({"batch": None, **one_summary(groups.slice(0, 0), of(rows, None), copies.slice(0, 0), STAGES)})
    assert doc["batches"] == expected
    assert doc["totals"] == one_summary(groups, rows, copies, STAGES)
    assert list(doc["totals"]) == list(expected[0] if expected else doc["totals"])[1 if expected else 0:]  # key order
    assert doc["totals"]["rows_read"] == sum(rows["rows"].to_pylist()) - sum(
        r["rows"] for r in rows.to_pylist() if r["status"] == DUPLICATED
    )


def test_no_metrics_at_all():
    doc = summarize([], [], [], STAGES)
    assert doc["batches"] == [] and doc["totals"]["rows_read"] == 0 and doc["totals"][MEAN_KEY] is None
