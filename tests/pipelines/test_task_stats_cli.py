"""`rescore task-stats` end to end: many files, many batches, two worker processes, compared
with an independent polars computation; a finished output as the source; one-line errors."""

import math
import os
from fractions import Fraction

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batched import run_many


def _write_experience(d, seed=5, files=6, tasks=9, batches=5, runs=8, string_tasks=False):
    """Every (batch, task) group spread over several files, in shuffled order, with some rows
    a run can not use (NaN reward)."""
    rng = np.random.default_rng(seed)
    rows = [(b, t, r) for b in range(batches) for t in range(tasks) for r in range(int(rng.integers(1, runs + 1)))]
    order = rng.permutation(len(rows))
    ease = rng.random(tasks)
    reward = [float(rng.random() < ease[rows[i][1]]) if rng.random() < 0.8 else float(np.round(rng.normal(), 3)) for i in order]
    reward[3] = float("nan")
    table = pa.table({
        "batch": [rows[i][0] for i in order],
        "task": [f"t{rows[i][1]}" if string_tasks else rows[i][1] for i in order],
        "run": [rows[i][2] for i in order], "step": [0] * len(order), "reward": reward,
    })
    os.makedirs(d, exist_ok=True)
    cuts = np.linspace(0, table.num_rows, files + 1).astype(int)
    for i in range(files):
        pq.write_table(table.slice(cuts[i], cuts[i + 1] - cuts[i]), os.path.join(d, f"part-{i}.parquet"), row_group_size=17)
    return pl.from_arrow(table)


def _pass_at_k(n, c, k):
    return None if n < k else 1 - math.comb(n - c, k) / math.comb(n, k)


def _expected(df, threshold, ks):
    df = df.filter(pl.col("reward").is_not_nan())
    groups = df.group_by("task", "batch").agg(
        n=pl.len(), c=(pl.col("reward") >= threshold).sum(), runs=pl.col("run").n_unique(),
        mean=pl.col("reward").mean(), std=pl.col("reward").std())
    for k in ks:
        groups = groups.with_columns(pl.struct("n", "c").map_elements(
            lambda s, k=k: _pass_at_k(s["n"], s["c"], k), return_dtype=pl.Float64).alias(f"pass_at_{k}"))
    tasks = df.group_by("task").agg(
        rows=pl.len(), passes=(pl.col("reward") >= threshold).sum(), batches=pl.col("batch").n_unique(),
        first_batch=pl.col("batch").min(), last_batch=pl.col("batch").max(),
        reward_mean=pl.col("reward").mean(), reward_std=pl.col("reward").std(),
    ).join(groups.group_by("task").agg(runs=pl.col("runs").sum(), **{f"pass_at_{k}": pl.col(f"pass_at_{k}").mean() for k in ks}),
           on="task")
    return tasks.with_columns(pass_rate=pl.col("passes") / pl.col("rows")).sort("task"), groups.sort("task", "batch")


def _check(out, df, threshold, ks):
    tasks, groups = _expected(df, threshold, ks)
    got = pl.read_parquet(os.path.join(out, "task_stats.parquet"))
    assert got["task"].to_list() == tasks["task"].to_list()
    for col in ("rows", "passes", "batches", "first_batch", "last_batch", "runs"):
        assert got[col].to_list() == tasks[col].to_list(), col
    for col in ("pass_rate", "reward_mean", "reward_std", *(f"pass_at_{k}" for k in ks)):
        assert np.allclose(got[col].to_numpy(), tasks[col].to_numpy(), rtol=1e-12, atol=1e-12, equal_nan=True), col
    got_groups = pl.read_parquet(os.path.join(out, "task_batch_stats.parquet"))
    assert got_groups.select("task", "batch").rows() == groups.select("task", "batch").rows()
    assert got_groups["rows"].to_list() == groups["n"].to_list()
    assert got_groups["passes"].to_list() == groups["c"].to_list()
    assert np.allclose(got_groups["reward_std"].to_numpy(), groups["std"].to_numpy(), rtol=1e-12, equal_nan=True)
    return got


@pytest.mark.slow
def test_task_stats_match_polars_on_two_worker_processes(tmp_path):
    df = _write_experience(str(tmp_path / "exp"))
    strings = _write_experience(str(tmp_path / "exp_str"), seed=9, string_tasks=True)
    one, two, three = (str(tmp_path / n) for n in ("one", "two", "three"))
    results = run_many(tmp_path / "logs", [
        ["task-stats", "--input", str(tmp_path / "exp" / "*.parquet"), "--output", one, "--threshold", "1", "--k", "1,3,8"],
        ["task-stats", "--input", str(tmp_path / "exp"), "--output", two, "--threshold", "1", "--k", "1,3,8",
         "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
        ["task-stats", "--input", str(tmp_path / "exp_str"), "--output", three, "--threshold", "0.5", "--k", "2"],
    ])
    assert [c for c, _ in results] == [0, 0, 0], results
    assert "1 without a usable reward" in results[0][1]
    a = _check(one, df, 1.0, (1, 3, 8))
    b = _check(two, df, 1.0, (1, 3, 8))
    assert a.equals(b)  # identical, bit for bit, on one or two worker processes
    _check(three, strings, 0.5, (2,))
    for out in (one, two, three):
        assert sorted(os.listdir(out)) == ["_SUCCESS", "_rescore_files.json", "task_batch_stats.parquet", "task_stats.json", "task_stats.parquet"]


@pytest.mark.slow
def test_task_stats_errors_are_one_line_and_write_nothing(tmp_path):
    _write_experience(str(tmp_path / "exp"), files=1)
    pq.write_table(pa.table({"batch": [0], "task": [0]}), tmp_path / "bad.parquet")
    out = str(tmp_path / "out")
    results = run_many(tmp_path / "logs", [
        ["task-stats", "--input", str(tmp_path / "exp"), "--output", out, "--k", "0"],
        ["task-stats", "--input", str(tmp_path / "none*.parquet"), "--output", out],
        ["task-stats", "--input", str(tmp_path / "bad.parquet"), "--output", out],
        ["task-stats", "--input", str(tmp_path / "exp"), "--output", out, "--lamb", "2"],
        ["task-stats", "--output", out],
        ["task-stats", "--input", str(tmp_path / "exp"), "--output", out, "--quiet"],
        ["task-stats", "--input", str(tmp_path / "exp"), "--output", out],
    ])
    for code, err in results[:5]:
        assert code == 2 and err.startswith("rescore: error: ") and err.count("\n") == 1, err
    assert "--k" in results[0][1] and "matches no Parquet file" in results[1][1]
    assert "missing column(s) run, reward" in results[2][1] and "--lamb" in results[3][1]
    assert results[5] == (0, "")
    assert results[6][0] == 2 and "--overwrite" in results[6][1]


@pytest.mark.slow
def test_incremental_table_rescans_only_touched_batches_and_equals_a_one_shot_run(tmp_path):
    df = _write_experience(str(tmp_path / "all"), seed=13, files=1, tasks=5, batches=4)
    exp = tmp_path / "exp"
    os.makedirs(exp)

    def put(batch, frame):
        frame.filter(pl.col("batch") == batch).write_parquet(exp / f"batch-{batch}.parquet")

    for b in (0, 1):
        put(b, df)
    table, oneshot = str(tmp_path / "table"), str(tmp_path / "oneshot")
    inc = ["task-stats", "--incremental", "--input", str(exp), "--output", table, "--k", "1,2"]
    changed = df.with_columns(reward=pl.when(pl.col("batch") == 0).then(1.0 - pl.col("reward")).otherwise(pl.col("reward")))

    def step(action):
        action()
        return run_many(tmp_path / "logs", [inc, ["task-stats", "--input", str(exp), "--output", oneshot, "--k", "1,2",
                                                  "--overwrite", "--quiet"]])

    first = step(lambda: None)
    second = step(lambda: None)
    third = step(lambda: (put(2, df), put(3, df)))
    fourth = step(lambda: (put(0, changed), os.remove(exp / "batch-1.parquet")))
    for results in (first, second, third, fourth):
        assert [c for c, _ in results] == [0, 0], results
    assert "rescanned 2 batches" in first[0][1] and "nothing new" in second[0][1]
    assert "rescanned 2 batches" in third[0][1] and "table version 1" in third[0][1]
    assert "rescanned 2 batches" in fourth[0][1] and "table version 2" in fourth[0][1]  # batch 0 changed, batch 1 gone
    got = pl.read_parquet(os.path.join(table, "_task_stats", "task_stats.parquet"))
    assert got.equals(pl.read_parquet(os.path.join(oneshot, "task_stats.parquet")))
    current = changed.filter(pl.col("batch") != 1)
    _check(os.path.join(table, "_task_stats"), current, 1.0, (1, 2))
    assert sorted(got["first_batch"].unique().to_list()) == [0]
    # the band filter reads the table's task view
    results = run_many(tmp_path / "logs2", [
        ["--input", str(exp / "*.parquet"), "--output", str(tmp_path / "band"), "--strategy", "pass_rate_band,grpo",
         "--set", f"pass_rate_band.task_stats={table}", "--set", "pass_rate_band.lo=0.3", "--quiet"]])
    assert results[0][0] == 0, results
    kept = pl.read_parquet(str(tmp_path / "band" / "scored-*.parquet"))["task"].unique().sort().to_list()
    assert kept == got.filter((pl.col("pass_rate") > 0.3) & (pl.col("pass_rate") < 1.0))["task"].sort().to_list()
