"""Odd files in input globs (directories, dangling symlinks, FIFOs, devices) stop the run in one
line or, with --skip-bad-files, are skipped and never block; values past int64 or float64 fail
naming the file and the column. Checked on a real process's stderr (cli_runs.py)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_runs import cli_many, data, one_error, run_here  # noqa: F401  (data: fixture)
from data import random_rows, read_output, write_parquet


@pytest.mark.slow
def test_odd_files_in_a_glob_stop_the_run_or_are_skipped_and_never_block(data, tmp_path):
    inp = tmp_path / "in"
    rows = [r for r in random_rows(seed=6) if len(r["tokens"]) > r["prompt_length"]]
    rows[0]["tokens"][-1] = None  # item 7: a null element is a null_value rejection
    write_parquet(rows, str(inp), files=1)
    os.mkfifo(inp / "pipe.parquet")
    (inp / "gone.parquet").symlink_to(tmp_path / "nowhere.parquet")
    (inp / "dir.parquet").mkdir()
    glob = str(inp / "*.parquet")
    out = str(tmp_path / "out")
    only_pipe = tmp_path / "pipe-only"
    only_pipe.mkdir()
    os.mkfifo(only_pipe / "p.parquet")
    results = cli_many(
        tmp_path,
        ["--input", glob, "--output", out, "--strategy", "grpo"],
        ["--input", str(inp / "gone.parquet"), "--output", out, "--strategy", "grpo"],
        ["--input", str(only_pipe), "--output", out, "--strategy", "grpo"],
        ["--input", "/dev/zero", "--output", out, "--strategy", "grpo"],
        ["--input", str(only_pipe), "--output", out, "--strategy", "grpo", "--skip-bad-files"],
        timeout=60,
    )
    expected = [
        f"{inp / 'dir.parquet'}: a directory, not a Parquet file",
        f"{inp / 'gone.parquet'}: a dangling symlink, not a Parquet file",
        f"{only_pipe / 'p.parquet'}: a FIFO (named pipe), not a Parquet file",
        "/dev/zero: a device, not a Parquet file",
        "no readable input files: all 1 were skipped",
    ]
    for (code, lines), message in zip(results, expected):
        assert code == 2 and message in one_error(lines)
    assert not os.path.exists(out)
    (inp / "dir.parquet").rmdir()

    assert run_here("--input", glob, "--output", out, "--strategy", "grpo", "--skip-bad-files", "--quiet") == 0
    skipped = json.load(open(os.path.join(out, "metrics.json")))["skipped_files"]
    assert [s["path"] for s in skipped] == [str(inp / "gone.parquet"), str(inp / "pipe.parquet")]
    assert "FIFO" in skipped[1]["reason"]
    rejected = read_output(out, "rejected")
    assert rejected.num_rows == 1 and rejected["reject_reason"][0].as_py() == "null_value: tokens has a null element"
    assert read_output(out).num_rows == len(rows) - 1


@pytest.mark.slow
def test_values_past_int64_or_float64_fail_naming_file_and_column(tmp_path):
    cases = [
        ("batch", [0, 2**63], pa.uint64(), "column 'batch' (uint64) holds 9223372036854775808"),
        ("run", [0, 2**64 - 1], pa.uint64(), "column 'run' (uint64) holds 18446744073709551615"),
        ("reward", [1, -(2**60)], pa.int64(), "column 'reward' holds the integer -1152921504606846976"),
    ]
    runs = []
    for i, (column, values, type_, _) in enumerate(cases):
        cols = {"batch": pa.array([0, 0], pa.int64()), "task": [1, 1], "run": pa.array([0, 1], pa.int64()), "reward": [0.0, 1.0]}
        cols[column] = pa.array(values, type_)
        path = tmp_path / f"in{i}" / "big.parquet"
        path.parent.mkdir()
        pq.write_table(pa.table(cols), path, write_statistics=i != 1)  # no statistics: the column is read
        runs.append(["--input", str(path), "--output", str(tmp_path / "out"), "--strategy", "grpo"])
    for (code, lines), run, (_, _, _, message) in zip(cli_many(tmp_path, *runs), runs, cases):
        line = one_error(lines)
        assert code == 2 and run[1] in line and message in line
