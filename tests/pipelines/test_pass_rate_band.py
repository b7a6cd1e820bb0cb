"""The pass_rate_band filter: the tasks it keeps, per group and over the task's history (a
`rescore task-stats` table), against polars; the prompt list of `task-stats --band`."""

import glob
import os

import polars as pl
import pytest

from batched import run_many
from test_task_stats_cli import _write_experience


@pytest.mark.slow
def test_band_keeps_the_tasks_polars_finds(tmp_path):
    exp = str(tmp_path / "exp")
    df = _write_experience(exp, seed=21, files=3, tasks=12, batches=4, runs=8).filter(pl.col("reward").is_not_nan())
    nan_free = str(tmp_path / "clean")
    os.makedirs(nan_free)
    df.write_parquet(os.path.join(nan_free, "all.parquet"))
    stats, group, history = (str(tmp_path / n) for n in ("stats", "group", "history"))
    prompts = str(tmp_path / "next.txt")
    band = ["--set", "pass_rate_band.lo=0.25", "--set", "pass_rate_band.hi=0.75"]
    results = run_many(tmp_path / "logs", [
        ["--input", f"{nan_free}/*.parquet", "--output", group, "--strategy", "pass_rate_band,grpo", *band,
         "--set", "pass_rate_band.threshold=0.5", "--keep-filtered", "--quiet"],
        ["task-stats", "--input", nan_free, "--output", stats, "--threshold", "0.5", "--band", "0.25,0.75",
         "--prompt-list", prompts, "--quiet"],
        ["--input", f"{nan_free}/*.parquet", "--output", history, "--strategy", "pass_rate_band,grpo", *band,
         "--set", f"pass_rate_band.task_stats={stats}", "--keep-filtered", "--quiet"],
        ["--input", f"{nan_free}/*.parquet", "--output", str(tmp_path / "bad"), "--strategy", "pass_rate_band,grpo",
         "--set", f"pass_rate_band.task_stats={tmp_path / 'nowhere'}"],
    ])
    assert [c for c, _ in results[:3]] == [0, 0, 0], results
    assert results[3][0] == 2 and "not a `rescore task-stats` output" in results[3][1] and results[3][1].count("\n") == 1

    per_group = df.group_by("batch", "task").agg(p=(pl.col("reward") >= 0.5).mean())
    want_groups = sorted(per_group.filter((pl.col("p") > 0.25) & (pl.col("p") < 0.75)).select("batch", "task").rows())
    per_task = df.group_by("task").agg(p=(pl.col("reward") >= 0.5).mean())
    want_tasks = sorted(per_task.filter((pl.col("p") > 0.25) & (pl.col("p") < 0.75))["task"].to_list())
    assert 0 < len(want_tasks) < per_task.height and 0 < len(want_groups) < per_group.height  # the band cuts

    def kept(out):
        return pl.read_parquet(glob.glob(os.path.join(out, "scored-*.parquet")))

    assert sorted(kept(group).select("batch", "task").unique().rows()) == want_groups
    assert sorted(kept(history)["task"].unique().to_list()) == want_tasks
    for out in (group, history):  # every row accounted for: kept or filtered, never both
        filtered = pl.read_parquet(glob.glob(os.path.join(out, "filtered-*.parquet")))
        assert kept(out).height + filtered.height == df.height
        assert filtered["filter_reason"].str.starts_with("pass_rate_band: ").all()
    assert [int(t) for t in open(prompts).read().split()] == want_tasks
