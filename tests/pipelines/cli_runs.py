"""Helpers of the tests that run the real CLI adversarially (concurrent runs, inputs rewritten
mid-run, foreign outputs, signals) and read what a user would see: an exit status and the lines
of a real process's stderr (batched.py runs several in one child process). `data` is a fixture:
a small input and a clean run of it, once per test module that imports it.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest
from batched import run_many
from conftest import RUNNER
from data import random_rows, read_output, write_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = [(k, "ascending") for k in ("batch", "task", "run", "step")]
FAULT = "RESCORE_TEST_INJECT_FAULT"


def _cmd(*args):
    return [sys.executable, "-m", "rescore", *args, RUNNER]


def _env(fault=None):
    env = {k: v for k, v in os.environ.items() if k != FAULT}
    if fault:
        env[FAULT] = fault
    return env


def run_here(*args):
    """A run in this process, where only its outcome matters (no stderr, exit status of a
    process or signal to check): the exit code `rescore` would exit with."""
    from rescore.pipelines.cli import main

    return main([*args, RUNNER])


def cli_many(tmp_path, *runs, timeout=180):
    """Several CLI runs in one subprocess (batched.py: imports once, each run with its own fd 2):
    [(exit code, non-empty stderr lines)]. A run is an argv list or (argv, fault): the fault is
    armed for that run only."""
    jobs = [(run, None) if isinstance(run, list) else run for run in runs]
    results = run_many(tmp_path, [([*argv, RUNNER], {FAULT: fault}) for argv, fault in jobs], cwd=ROOT, timeout=timeout)
    return [(code, [line for line in err.splitlines() if line.strip()]) for code, err in results]


def start(*args, fault=None):
    return subprocess.Popen(
        _cmd(*args), cwd=ROOT, env=_env(fault), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def finish(proc, timeout=120):
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def wait_for(path, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def one_error(lines):
    assert len(lines) == 1, lines
    assert lines[0].startswith("rescore: error: "), lines
    return lines[0]


def snapshot(directory):
    """{name: sha256} of every file under `directory` (what must stay intact)."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def sorted_scored(out):
    return read_output(out).sort_by(KEYS)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("trust")
    rows = random_rows(seed=13, batches=4)
    glob = write_parquet(rows, str(base / "in"), files=3, row_group_size=6)
    clean = str(base / "clean")
    assert run_here("--input", glob, "--output", clean, "--strategy", "grpo", "--quiet") == 0
    return {"glob": glob, "rows": len(rows), "clean": clean, "base": base}
