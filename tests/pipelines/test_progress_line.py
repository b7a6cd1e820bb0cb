"""The progress line tells the truth: under a pipe step by step, never backwards, from 0 % on an
--overwrite rerun (only this run's progress marks count), with worker processes; in a log the
first line waits one interval."""

from __future__ import annotations

import glob
import io
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from batched import rescore_process as _cli
from conftest import RUNNER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LINE = re.compile(r"read (\d+)/(\d+) units?, scored ([\d,]+)/([\d,]+) rows?, written (\d+)/(\d+) units? \((\d+)%\)")


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
        # this run's work only: the rerun does not start at 100 % (or with any unit written); its
        # first line may come after every unit was read and scored (GRPO on numpy scores these
        # 512 rows before the first interval ends): 67 %, nothing written
        assert lines[0][4] == 0 and lines[0][6] <= 67, run.stderr
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
    # one clock: the last progress line's seconds are the summary's wall time but for what ran
    # between them (publishing the output), not the imports and the plan left out (4 s vs 10 s)
    for run in (first, second):
        last = [line for line in run.stderr.splitlines() if LINE.search(line)][-1]
        seconds = float(re.search(r"\(100%\), (\d+\.\d) s$", last).group(1))
        wall = float(next(line for line in run.stderr.splitlines() if "wall time" in line).split()[2].rstrip("s"))
        assert wall - 1.0 <= seconds <= wall + 0.05, (seconds, wall, run.stderr)


@pytest.mark.slow
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


def test_progress_counts_this_runs_marks_not_an_earlier_runs_files(tmp_path, caplog):
    """An --overwrite rerun: the finished earlier run's scored files are in the output; the line
    counts only the marks this run's steps dropped (transforms/files/progress_marks.py)."""
    from rescore.pipelines.progress import Progress
    from rescore.transforms.files import progress_marks

    caplog.set_level(logging.INFO)  # a non-terminal stream gets the plan line at once only at INFO

    out = tmp_path / "out"
    marks = out / "_staging" / "_progress"
    marks.mkdir(parents=True)
    for name in ("scored-00000-of-00004.parquet", "scored-00001-of-00004.parquet", "_SUCCESS"):
        (out / name).write_bytes(b"")  # the earlier run
    for name in (progress_marks.read_mark(0, 25), progress_marks.read_mark(2, 20), progress_marks.score_mark(7, 30),
                 progress_marks.write_mark(2)):
        (marks / name).write_bytes(b"")
    stream = io.StringIO()
    progress = Progress(str(out), 4, 100, 1, stream=stream, interval=0.05)
    assert progress.counts() == (2, 30, 100, 1)  # two units read; 30 of the 100 planned rows scored
    with progress:
        time.sleep(0.3)
        for name in (progress_marks.read_mark(1, 25), progress_marks.read_mark(3, 25)):
            (marks / name).write_bytes(b"")
        time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "rescore: planned 100 rows in 1 file (4 read units); running"
    # read 2/4 (50%), scored 30/100 (30%), written 1/4 (25%): 35%
    assert lines[1].startswith("rescore: 100 rows in 1 file: read 2/4 units, scored 30/100 rows, written 1/4 units (35%)")
    # every unit read: 95 rows passed validation, 30 of them scored
    assert any(line.startswith("rescore: 100 rows in 1 file: read 4/4 units, scored 30/95 rows, written 1/4 units (52%)")
               for line in lines), lines
    assert lines[-1].startswith("rescore: 100 rows in 1 file: read 4/4 units, scored 95/95 rows, written 4/4 units (100%)")


@pytest.mark.slow
def test_progress_advances_with_multi_processing(sample_input, tmp_path):
    out = str(tmp_path / "mp")
    p = _cli("--input", sample_input, "--output", out, RUNNER, "--strategy", "grpo", "--shard-rows", "16",
             "--direct_running_mode=multi_processing", "--direct_num_workers=2", "--log-level", "INFO", timeout=400)
    assert p.returncode == 0, p.stderr
    progress = [line for line in p.stderr.splitlines() if ", written " in line]
    assert len(glob.glob(os.path.join(out, "scored-*.parquet"))) == 4
    assert progress and progress[-1].split(": ")[2].startswith("read 4/4 units, scored "), p.stderr
    assert "written 4/4 units (100%)" in progress[-1], p.stderr
