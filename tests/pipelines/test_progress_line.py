"""A newcomer's first hour, round 2 (issue 34): progress that tells the truth under a pipe and on
--overwrite reruns, a wall time that counts only Rescore's own run, quiet multi-process logs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from conftest import RUNNER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINE = re.compile(r"read (\d+)/(\d+) units?, scored ([\d,]+)/([\d,]+) rows?, written (\d+)/(\d+) units? \((\d+)%\)")


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    from rescore.pipelines.sample import main as sample_main

    d = tmp_path_factory.mktemp("first-hour")
    assert sample_main(["--output", str(d / "data")]) == 0
    return str(d / "data" / "*.parquet")


def _progress(stderr: str) -> list[tuple[int, ...]]:
    return [tuple(int(g.replace(",", "")) for g in m.groups()) for m in map(LINE.search, stderr.splitlines()) if m]


@pytest.mark.slow
def test_progress_under_a_pipe_step_by_step_and_on_an_overwrite_rerun(sample, tmp_path):
    """stderr a pipe (cron, Airflow, CI): a plain line every RESCORE_PROGRESS_SECONDS; the line
    goes read -> scored -> written as the steps do their work, never backwards, and an
    --overwrite rerun starts from 0 % (an earlier run's files are not this run's work). The
    rerun starts after `sleep 3` in the same shell line: its wall time must not count the sleep."""
    out = str(tmp_path / "out")
    env = {**os.environ, "RESCORE_PROGRESS_SECONDS": "0.2", "RESCORE_TEST_INJECT_FAULT": "slow_write:0.3"}
    argv = [sys.executable, "-m", "rescore", "--input", sample, "--output", out, RUNNER, "--strategy", "grpo",
            "--shard-rows", "64", "--io-threads", "1"]
    first = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    # bash runs the last command of -c by exec, in the process that ran the sleep
    started = time.monotonic()
    second = subprocess.run(["bash", "-c", "sleep 3 && " + " ".join(f"'{a}'" for a in [*argv, "--overwrite"])],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=300)
    elapsed = time.monotonic() - started
    assert second.returncode == 0, second.stderr

    for run in (first, second):
        lines = _progress(run.stderr)
        assert len(lines) >= 3, run.stderr
        n = lines[0][1]  # read units of the plan
        assert n >= 4 and all(line[1] == line[5] == n for line in lines), run.stderr
        # this run's work only: the rerun does not start at 100 % (or with any unit written)
        assert lines[0][4] == 0 and lines[0][6] < 67, run.stderr
        # step by step: every unit read and every row scored while units are still being written
        assert any(r == n and s == t == 512 and w < n for r, _, s, t, w, _, _ in lines), run.stderr
        # never backwards, and it ends on everything done
        for column in (0, 2, 4, 6):
            assert [line[column] for line in lines] == sorted(line[column] for line in lines), run.stderr
        assert lines[-1] == (n, n, 512, 512, n, n, 100), run.stderr
        # the summary comes after the last progress line
        assert run.stderr.rstrip().splitlines()[-9].startswith("rescore: grpo done"), run.stderr

    wall = float(next(line for line in second.stderr.splitlines() if "wall time" in line).split()[2].rstrip("s"))
    assert 0.5 < wall <= elapsed - 3, (wall, elapsed)


def test_progress_in_a_log_waits_one_interval(sample, tmp_path):
    """A quick run whose stderr is not a terminal prints no progress line (the first comes after
    one interval, 15 s by default): a quick failure is just its error line."""
    from batched import run_many

    out = str(tmp_path / "quick")
    [(code, err), (code2, err2)] = run_many(str(tmp_path / "err"), [
        (["--input", sample, "--output", out, RUNNER, "--strategy", "grpo"], {"RESCORE_PROGRESS_SECONDS": None}),
        ["--input", sample, "--output", out, RUNNER, "--strategy", "grpo"],  # a finished run: refused
    ])
    assert code == 0 and "wall time" in err and not _progress(err), err
    assert code2 == 2 and err2.strip().splitlines() == [
        f"rescore: error: {out} already holds a finished run (_SUCCESS); pass --overwrite to replace it"], err2


@pytest.mark.slow
def test_a_multi_process_run_prints_only_its_summary(sample, tmp_path):
    """The README's --direct_num_workers=2 example: Beam's worker logs (relayed to the driver, or
    written to the stderr the workers inherit) are not shown at the default log level."""
    out = str(tmp_path / "mp")
    env = {**os.environ, "RESCORE_PROGRESS_SECONDS": "1000"}
    p = subprocess.run([sys.executable, "-m", "rescore", "--input", sample, "--output", out, "--strategy", "grpo",
                        "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
                       cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=400)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.rstrip("\n").splitlines()
    assert lines[0] == f"rescore: grpo done -> {out}", p.stderr
    assert len(lines) == 9 and all(line.startswith("  ") for line in lines[1:]), p.stderr


def test_worker_log_lines_are_dropped_from_what_other_processes_wrote():
    from rescore.pipelines.rescore import _without_worker_logs

    spilled = (b"INFO:apache_beam.runners.worker.sdk_worker_main:Python sdk harness starting\n"
               b"I0000 00:00:1700000000.000000 12 fork_posix.cc:77] Other threads are currently calling into gRPC\n"
               b"WARNING:root:No semi_persistent_directory found\n"
               b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: y\n"
               b"a line of the user's own verifier\n")
    assert _without_worker_logs(spilled) == b"a line of the user's own verifier\n"


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
    assert code == 2 and err.startswith("rescore: error: unknown strategy 'GRPO' (did you mean 'grpo'?); valid strategies: ")
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
    from rescore.pipelines.rescore import main

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


def test_shipped_configs_are_found_from_any_directory(sample, tmp_path, monkeypatch):
    from rescore.errors import ConfigError
    from rescore.pipelines.config import parse_args, shipped_configs

    monkeypatch.chdir(tmp_path)  # no run_configs/ here
    assert set(shipped_configs()) >= {"local", "local_multiprocess", "portable", "flink", "dataflow", "dataflow_gpu"}
    for given in ("local", "local.yaml", "run_configs/local_multiprocess.yaml"):
        cfg = parse_args(["--config", given, "--input", sample, "--output", "out"])
        assert cfg.strategies == ["grpo"] or cfg.strategies == ("grpo",), given
    assert "--direct_running_mode=multi_processing" in " ".join(
        parse_args(["--config", "local_multiprocess", "--input", sample, "--output", "out"]).beam_args)
    with pytest.raises(ConfigError, match=r"cannot read config nope.yaml: .*\(shipped configs: dataflow, "):
        parse_args(["--config", "nope.yaml", "--input", sample, "--output", "out"])


def test_dataflow_and_sample_models_without_their_extras(sample, tmp_path, monkeypatch, capsys):
    """Without the [gcp] extra a Dataflow dry run is one line naming it (exit 2); without
    [models] `python -m rescore.pipelines.sample_models` is one line naming that."""
    from rescore.errors import ConfigError
    from rescore.pipelines import sample_models
    from rescore.pipelines.config import parse_args

    monkeypatch.setitem(sys.modules, "apache_beam.runners.dataflow.internal.apiclient", None)
    with pytest.raises(ConfigError, match=r"^--runner DataflowRunner needs the \[gcp\] extra .*pip install 'rescore\[gcp\]'"):
        parse_args(["--config", "dataflow_gpu", "--project=p", "--temp_location=gs://b/tmp", "--no_auth",
                    "--dry_run=True", "--input", sample, "--output", "gs://b/out"])
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert sample_models.main([str(tmp_path / "models")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rescore: error: the tiny models need the [models] extra") and len(err.splitlines()) == 1
    assert not (tmp_path / "models").exists()


def test_sample_removes_stale_files_and_counts_right(tmp_path, capsys):
    from rescore.pipelines.sample import main as sample_main

    out = tmp_path / "s"
    assert sample_main(["--output", str(out), "--files", "3"]) == 0
    (out / "notes.parquet").write_text("mine")
    assert sample_main(["--output", str(out), "--files", "1"]) == 0
    assert sorted(os.listdir(out)) == ["experience-000.parquet", "notes.parquet"]
    assert capsys.readouterr().err.splitlines()[-1] == f"wrote 512 rows to 1 file in {out}"


def test_log_level_has_help():
    from rescore.pipelines.config import _parser

    text = _parser().format_help()
    assert "--log-level" in text and "streams the log" in " ".join(text.split())
