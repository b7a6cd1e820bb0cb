"""A user's first mistakes each get one line that says what to do (a typo's "did you mean", what
an input folder holds instead of Parquet, a pipeline failure that leaves no empty output folder),
and the listings `rescore strategies` and `rescore configs`; each on its real stderr."""

from __future__ import annotations

import os

import pytest

from batched import forked_run as _forked
from conftest import RUNNER


@pytest.mark.slow
def test_set_typo_says_did_you_mean(forked, tmp_path):
    p = _forked(forked, "--input", str(tmp_path / "x.parquet"), "--output", str(tmp_path / "o"), "--strategy", "grpo",
             "--set", "epsilonn=1")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "rescore: error: unknown parameter 'epsilonn' for strategy 'grpo' (did you mean 'epsilon'?); "
        "valid parameters: epsilon, rank_penalty, std_cal_level, std_threshold"
    ]


@pytest.mark.slow
def test_first_hour_smalls(sample, tmp_path, monkeypatch, capsys):
    """Item 7 of issue 34, each on its real stderr (run_many: a child process, one stderr each)."""
    from batched import run_many

    csvs = tmp_path / "csvs"
    csvs.mkdir()
    for name in ("a.csv", "b.csv"):
        (csvs / name).write_text("batch,task\n")
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for path in __import__("glob").glob(sample):
        os.symlink(path, mixed / os.path.basename(path))
    (mixed / "bad.parquet").write_text("junk")
    fresh = tmp_path / "fresh" / "out"
    runs = run_many(str(tmp_path / "err"), [
        ["--input", str(csvs), "--output", str(tmp_path / "o1"), RUNNER, "--strategy", "grpo"],
        ["--input", sample, "--output", str(tmp_path / "o2"), RUNNER, "--strategy", "GRPO"],
        ["--input", sample, "--output", str(tmp_path / "o3"), RUNNER, "--algorithm", "Multi_Step_GRPO"],
        ["--input", str(mixed / "*.parquet"), "--output", str(tmp_path / "o4"), RUNNER, "--strategy", "grpo", "--skip-bad-files"],
        # a pipeline failure (a group over --max-group-rows) into a folder the run created
        ["--input", sample, "--output", str(fresh), RUNNER, "--strategy", "grpo", "--max-group-rows", "2"],
        ["strategies", "grpo"],
        ["strategies", "GRPO"],
        ["strategies"],
        ["configs"],
    ])
    (code, err) = runs[0]
    assert code == 2 and err.strip() == (
        f"rescore: error: no input files match '{csvs}': {csvs} holds 2 other files (.csv: a.csv, b.csv); "
        "Rescore reads Parquet files (*.parquet), or --input-table / --input-format for SQL buffers and verl dumps")
    (code, err) = runs[1]
    assert code == 2 and err.startswith("rescore: error: unknown strategy 'GRPO' (did you mean 'grpo'?); `rescore strategies` lists all ")
    (code, err) = runs[2]
    assert code == 2 and "unknown algorithm 'Multi_Step_GRPO' (did you mean 'multi_step_grpo'?)" in err, err
    (code, err) = runs[3]
    assert code == 0, err
    assert err.count("bad.parquet") == 1 and "  skipped file     " in err and "WARNING" not in err, err
    (code, err) = runs[4]
    assert code == 1 and err.startswith("rescore: error: ") and len(err.strip().splitlines()) == 1, err
    assert not fresh.exists() and (tmp_path / "fresh").exists()  # no folder holding only the file list
    (code, err) = runs[5]
    assert code == 0
    (code, err) = runs[6]
    assert code == 2 and err.strip().startswith("rescore: error: unknown strategy 'GRPO' (did you mean 'grpo'?)")

    # the listings go to stdout: run them in this process
    from rescore.pipelines.cli import main

    capsys.readouterr()
    assert main(["strategies", "grpo"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("grpo (advantage): ")
    assert "  epsilon: float = 1e-06" in out and "  std_cal_level: group|batch = 'group'" in out
    assert main(["strategies"]) == 0
    out = capsys.readouterr().out
    assert "filter:\n" in out and "\n  dynamic_filtering " in out and "\nadvantage:\n" in out and "\n  reward_variance " in out
    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    assert "local  " in out.replace("local_multiprocess", "") and "dataflow_gpu" in out
