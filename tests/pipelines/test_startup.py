"""Start-up: the launcher's path (option parsing, --help, a bad command line, planning) never
imports torch; only the scoring shells do, when a pipeline is built (issue 18)."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _modules_after(code: str) -> dict:
    probe = code + "\nimport json, sys\nprint(json.dumps({m: m in sys.modules for m in ('torch', 'apache_beam')}))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_help_loads_beam_but_not_torch():
    loaded = _modules_after(
        "import contextlib, io\n"
        "from rescore.pipelines.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n"
        "        main(['--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
    )
    assert loaded == {"torch": False, "apache_beam": True}


@pytest.mark.slow
def test_planning_and_the_read_shell_do_not_load_torch():
    loaded = _modules_after("import rescore.transforms.read, rescore.transforms.rows.keys, rescore.transforms.device")
    assert loaded["torch"] is False


@pytest.mark.slow
def test_building_the_scoring_shells_loads_torch():
    # the check above must be able to fail: the shells that score do load torch
    assert _modules_after("import rescore.transforms.score")["torch"] is True


def _command(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rescore", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT, **env}, timeout=120)


@pytest.mark.slow
def test_a_bad_arrow_decay_is_one_line_and_exit_2():
    proc = _command({"RESCORE_ARROW_DECAY_MS": "3s"}, "--help")
    assert proc.returncode == 2
    assert proc.stderr == "rescore: error: RESCORE_ARROW_DECAY_MS must be a whole number of milliseconds (-1: never), got '3s'\n"


@pytest.mark.slow
def test_the_arrow_decay_is_set_on_jemalloc_only(monkeypatch):
    import pyarrow as pa

    from rescore.pipelines import cli

    calls = []
    monkeypatch.setattr(pa, "jemalloc_set_decay_ms", calls.append)
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    monkeypatch.delenv(cli.DECAY_ENV, raising=False)
    monkeypatch.delenv("RESCORE_MEMORY_MB", raising=False)
    from rescore.transforms import memory

    monkeypatch.setattr(memory, "container_limit", lambda: None)
    cli.keep_freed_pages([])
    cli.keep_freed_pages(["--input", "x", "--memory-mb", "2048"])  # under a budget: freed pages go back at once
    monkeypatch.setattr(memory, "container_limit", lambda: 2 << 30)
    cli.keep_freed_pages([])  # a container's limit is a budget too
    monkeypatch.setenv(cli.DECAY_ENV, "-1")
    cli.keep_freed_pages(["--memory-mb=2048"])  # the variable wins
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "mimalloc")
    cli.keep_freed_pages([])  # another pool: left alone
    assert calls == [cli.DEFAULT_DECAY_MS, 0, 0, -1]
    assert _command({"RESCORE_ARROW_DECAY_MS": "-1"}, "--help").returncode == 0
