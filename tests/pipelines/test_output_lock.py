"""One run at a time per output (transforms/files/lock.py) through the real CLI: a second run is
refused naming the holder, --wait-for-lock runs after the holder finishes, a killed run's lock
and leftovers do not block the next run and foreign files stay."""

from __future__ import annotations

import json
import os
import signal
import socket
import time

import pytest
from cli_runs import cli_many, data, finish, one_error, run_here, sorted_scored, start, wait_for  # noqa: F401  (data: fixture)


@pytest.mark.slow
def test_a_second_run_into_the_same_output_is_refused_naming_the_holder(data, tmp_path):
    out, pause = str(tmp_path / "out"), tmp_path / "pause"
    pause.mkdir()
    first = start("--input", data["glob"], "--output", out, "--strategy", "grpo", "--quiet", fault=f"pause_readback:{pause}")
    try:
        wait_for(pause / "paused")
        (code, lines), (code2, lines2) = cli_many(
            tmp_path,
            ["--input", data["glob"], "--output", out, "--strategy", "opmd", "--quiet"],
            ["--input", data["glob"], "--output", out, "--strategy", "opmd", "--wait-for-lock", "0.5"],
        )
        line = one_error(lines)
        assert code == 2
        assert f"pid {first.pid} on host {socket.gethostname()}, started 20" in line and "--wait-for-lock" in line
        assert code2 == 2 and "after waiting 0.5 s" in one_error(lines2)
        assert not os.path.exists(os.path.join(out, "_SUCCESS"))
    finally:
        (pause / "resume").touch()
        code, lines = finish(first)
    assert code == 0, lines
    assert sorted_scored(out).equals(sorted_scored(data["clean"]))  # only the first run's rows
    assert not os.path.exists(os.path.join(out, "_rescore.lock"))  # released


@pytest.mark.slow
def test_wait_for_lock_runs_after_the_holder_finishes(data, tmp_path):
    out, pause = str(tmp_path / "out"), tmp_path / "pause"
    pause.mkdir()
    first = start("--input", data["glob"], "--output", out, "--strategy", "opmd", "--quiet", fault=f"pause_readback:{pause}")
    wait_for(pause / "paused")
    second = start("--input", data["glob"], "--output", out, "--strategy", "grpo", "--quiet", "--overwrite", "--wait-for-lock", "120")
    time.sleep(3)
    assert second.poll() is None, finish(second)  # still waiting
    (pause / "resume").touch()
    assert finish(first)[0] == 0
    code, lines = finish(second)
    assert code == 0, lines
    assert json.load(open(os.path.join(out, "metrics.json")))["strategy"] == "grpo"
    assert sorted_scored(out).equals(sorted_scored(data["clean"]))


@pytest.mark.slow
def test_a_killed_runs_lock_and_leftovers_do_not_block_and_foreign_files_stay(data, tmp_path):
    out, pause = tmp_path / "out", tmp_path / "pause"
    out.mkdir()
    pause.mkdir()
    (out / "notes.txt").write_text("mine")
    first = start("--input", data["glob"], "--output", str(out), "--strategy", "grpo", "--shard-rows", "10",
                  fault=f"pause_readback:{pause}")
    wait_for(pause / "paused")
    time.sleep(0.5)  # let other units stage their files
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    lock = out / "_rescore.lock"
    assert str(first.pid) in lock.read_text()  # left behind, naming a dead process
    assert not (out / "_SUCCESS").exists()
    assert run_here("--input", data["glob"], "--output", str(out), "--strategy", "grpo", "--quiet") == 0
    assert sorted_scored(str(out)).equals(sorted_scored(data["clean"]))
    assert not lock.exists() and not (out / "_staging").exists()
    assert (out / "notes.txt").read_text() == "mine"
