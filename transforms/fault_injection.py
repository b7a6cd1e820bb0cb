"""Fault injection for the reliability tests: a seam that production runs do not pay for.

Tests arm one fault through the environment variable RESCORE_TEST_INJECT_FAULT (`KIND:ARG`),
named so that no real run sets it by accident (docs/reliability.md, "Fault injection"):

    fail_once:PATH     the scoring step raises for its first bucket while PATH does not exist,
                       creating PATH first, so a retry or a rerun goes through
    slow_write:SECONDS every write step sleeps this long after staging a file, so a test can
                       kill the job while output is half written
    pause_readback:DIR the write step, before it reads a unit back, creates DIR/paused and
                       waits (up to 120 s) for DIR/resume, so a test can change an input file
                       between the two reads
    pause_finalize:DIR the same, at the start of the publishing step (every unit written)
    hold:DIR           while DIR/hold-PHASE exists, the read (PHASE `read`, per unit), scoring
                       (`score`, per bucket) and write (`write`, per unit, after its scored
                       file is staged) steps create DIR/held-PHASE-PID and wait (up to 600 s)
                       for it to go: a cluster test kills a TaskManager with the job held there
    kill_at:STEP       an --incremental run SIGKILLs itself at STEP: locked, planned,
                       before_commit, after_commit (pipelines/incremental.py)
    fail_insert:ANY    writing a Trinity SQL buffer (--output-db) raises after the first file's
                       rows are inserted (transforms/sql_buffer.py)

The variable is read once when this module is imported (a worker process of a multi-process
run inherits it) and again at the start of each run (`refresh()`, from pipelines/job.py
`run()`, so that one process can run several jobs), never per bucket or unit: with no fault
armed every hook below returns after one check of a module global.
"""

from __future__ import annotations

import os
import time

from rescore.errors import InjectedFault

ENV = "RESCORE_TEST_INJECT_FAULT"

_armed: tuple[str, str] | None = None
"""(kind, arg) of the armed fault; None in every production run."""


def refresh() -> None:
    """Arm the fault the environment names, or none."""
    global _armed
    kind, _, arg = os.environ.get(ENV, "").partition(":")
    _armed = (kind, arg) if kind else None


def _arg(kind: str) -> str:
    """The armed fault's argument if `kind` is armed, else ''."""
    return _armed[1] if _armed is not None and _armed[0] == kind else ""


def maybe_fail_once(where: str) -> None:
    if _armed is None or not (path := _arg("fail_once")):
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise InjectedFault(f"injected fault in {where} ({ENV}=fail_once:{path})")


def maybe_slow_write() -> None:
    if _armed is not None and (seconds := _arg("slow_write")):
        time.sleep(float(seconds))


def maybe_pause_readback() -> None:
    if _armed is not None:
        _pause("pause_readback")


def maybe_pause_finalize() -> None:
    if _armed is not None:
        _pause("pause_finalize")


def maybe_hold(phase: str) -> None:
    """hold:DIR: wait here while DIR/hold-`phase` exists, saying so in DIR/held-`phase`-PID."""
    directory = _arg("hold") if _armed is not None else ""
    if not directory or not os.path.exists(hold := os.path.join(directory, f"hold-{phase}")):
        return
    open(os.path.join(directory, f"held-{phase}-{os.getpid()}"), "a").close()
    deadline = time.monotonic() + 600
    while os.path.exists(hold) and time.monotonic() < deadline:
        time.sleep(0.05)


def maybe_kill_at(step: str) -> None:
    """SIGKILL this process at an incremental run's `step`: the tests' way to crash it there."""
    if _armed is not None and _arg("kill_at") == step:
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def maybe_fail_insert(path: str) -> None:
    if _armed is not None and _armed[0] == "fail_insert":
        raise InjectedFault(f"injected fault after inserting {path} ({ENV})")


def _pause(name: str) -> None:
    directory = _arg(name)
    if not directory:
        return
    open(os.path.join(directory, "paused"), "a").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(directory, "resume")) and time.monotonic() < deadline:
        time.sleep(0.05)


refresh()
