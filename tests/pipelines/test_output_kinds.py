"""Each command writes its own output: a scored run, `rescore task-stats` and `rescore export`
each refuse a directory another of them wrote (with --overwrite too: it replaces only the same
command's output), and the one line names what is there, instead of denying that Rescore wrote
it (issue 43: docs/models.md once wrote `--output out/stats` over docs/curating.md's task-stats)."""

from __future__ import annotations

import os

import pytest

from batched import run_many
from conftest import RUNNER

SCORED = "a scored run (written by `rescore --output`)"
TASK_STATS = "a task-stats output (written by `rescore task-stats`)"
EXPORT = "an export (written by `rescore export`)"


@pytest.mark.slow
def test_each_command_refuses_another_commands_output_naming_it(sample_input, tmp_path):
    stats, scored, sft = (str(tmp_path / n) for n in ("stats", "scored", "sft"))
    made = [
        ["task-stats", "--input", sample_input, "--output", stats, RUNNER, "--quiet"],
        ["--input", sample_input, "--output", scored, RUNNER, "--strategy", "grpo", "--quiet"],
        ["export", scored, "--output", sft, "--format", "sft", "--quiet"],
    ]
    refused = [
        (["--input", sample_input, "--output", stats, RUNNER, "--strategy", "grpo", "--overwrite"], stats, TASK_STATS),
        (["--input", sample_input, "--output", sft, RUNNER, "--strategy", "grpo"], sft, EXPORT),
        (["task-stats", "--input", sample_input, "--output", scored, RUNNER, "--overwrite"], scored, SCORED),
        (["task-stats", "--input", sample_input, "--output", sft, RUNNER], sft, EXPORT),
        (["export", scored, "--output", stats, "--format", "dpo", "--overwrite"], stats, TASK_STATS),
        (["export", sft, "--output", scored, "--format", "sft"], scored, SCORED),
    ]
    runs = run_many(str(tmp_path / "err"), [*made, *(argv for argv, _, _ in refused)])  # one process: imports once
    assert [code for code, _ in runs[:3]] == [0, 0, 0], runs[:3]
    for (argv, directory, found), (code, err) in zip(refused, runs[3:]):
        assert code == 2 and err.strip().splitlines() == [
            f"rescore: error: --output {directory} holds {found}: each command writes to a directory of its own; "
            "pick another --output"], (argv, err)
    # nothing was mixed in: each directory holds its own command's files only
    assert sorted(os.listdir(stats)) == ["_SUCCESS", "_rescore_files.json", "task_batch_stats.parquet", "task_stats.json", "task_stats.parquet"]
    assert sorted(os.listdir(sft)) == ["_SUCCESS", "_rescore_files.json", "export.json", "sft.parquet"]
    assert not {"task_stats.json", "export.json", "sft.parquet", "dpo.parquet"} & set(os.listdir(scored))
    assert "metrics.json" in os.listdir(scored) and "_SUCCESS" in os.listdir(scored)
