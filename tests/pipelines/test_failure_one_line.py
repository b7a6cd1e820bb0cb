"""A failed or interrupted run is exactly one stderr line (`rescore: error: ...` or the
interrupted line); --log-level DEBUG shows the traceback; Beam's worker processes' tracebacks are
dropped; Ctrl-C publishes nothing and releases the lock."""

from __future__ import annotations

import shutil
import signal

import pytest
from cli_runs import cli_many, data, finish, one_error, snapshot, start, wait_for  # noqa: F401  (data: fixture)


@pytest.mark.slow
def test_a_pipeline_failure_is_one_line_and_debug_shows_the_traceback(data, tmp_path):
    out = str(tmp_path / "out")
    (code, lines), (code2, lines2) = cli_many(
        tmp_path,
        (["--input", data["glob"], "--output", out, "--strategy", "grpo"], f"fail_once:{tmp_path / 'm1'}"),
        (["--input", data["glob"], "--output", out, "--strategy", "grpo", "--log-level", "DEBUG"], f"fail_once:{tmp_path / 'm2'}"),
    )
    assert code == 1 and "pipeline failed: injected fault in ScoreGroups" in one_error(lines)
    code, lines = code2, lines2
    assert code == 1 and any("Traceback" in line for line in lines)
    assert lines[-1].startswith("rescore: error: pipeline failed: injected fault")


@pytest.mark.slow
def test_a_failure_in_worker_processes_is_one_line(data, tmp_path):
    """Beam's worker processes write their tracebacks to the stderr they inherit; the console
    script (a process of its own: batched.py calls main(), not it) drops them after a failure."""
    code, lines = finish(start("--input", data["glob"], "--output", str(tmp_path / "out"), "--strategy", "grpo",
                               "--direct_running_mode=multi_processing", "--direct_num_workers=2",
                               "--progress-seconds", "3600",  # a loaded machine: no progress line before the error
                               fault=f"fail_once:{tmp_path / 'marker'}"))
    assert code == 1 and "injected fault in ScoreGroups" in one_error(lines)


@pytest.mark.slow
def test_ctrl_c_prints_the_interrupted_line(data, tmp_path):
    out = str(tmp_path / "out")
    shutil.copytree(data["clean"], out)
    before = snapshot(out)
    pause = tmp_path / "pause"
    pause.mkdir()
    proc = start("--input", data["glob"], "--output", out, "--strategy", "opmd", "--overwrite",
                 fault=f"pause_readback:{pause}")
    wait_for(pause / "paused")
    proc.send_signal(signal.SIGINT)
    code, lines = finish(proc, timeout=60)
    assert code == 1 and lines == [
        "rescore: interrupted; this run published nothing (an earlier finished run in the output is left as it was)"
    ], lines
    after = snapshot(out)
    assert {k: v for k, v in after.items() if not k.startswith(("_staging", "_rescore.lock"))} == before
    # The lock went with the process: the next run can take it at once.
    from rescore.transforms.files.lock import acquire

    acquire(out).release()
