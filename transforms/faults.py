"""Fault injection for the reliability tests (never set in production).

The environment variable RESCORE_FAULT selects one fault; worker processes inherit it:

    fail_once:PATH     the scoring step raises for its first bucket while PATH does not exist,
                       creating PATH first, so a retry or a rerun goes through
    slow_write:SECONDS every write step sleeps this long after staging a file, so a test can
                       kill the job while output is half written
    pause_readback:DIR the write step, before it reads a unit back, creates DIR/paused and
                       waits (up to 120 s) for DIR/resume, so a test can change an input file
                       between the two reads
    pause_finalize:DIR the same, at the start of the publishing step (every unit written)
    kill_at:STEP       an --incremental run SIGKILLs itself at STEP: locked, planned,
                       before_commit, after_commit (pipelines/incremental.py)
"""

from __future__ import annotations

import os
import time

ENV = "RESCORE_FAULT"


class InjectedFault(RuntimeError):
    pass


def _fault() -> tuple[str, str]:
    kind, _, arg = os.environ.get(ENV, "").partition(":")
    return kind, arg


def maybe_fail_once(where: str) -> None:
    kind, path = _fault()
    if kind != "fail_once" or not path:
        return
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    raise InjectedFault(f"injected fault in {where} ({ENV}=fail_once:{path})")


def maybe_slow_write() -> None:
    kind, seconds = _fault()
    if kind == "slow_write" and seconds:
        time.sleep(float(seconds))


def maybe_pause_readback() -> None:
    _pause("pause_readback")


def maybe_pause_finalize() -> None:
    _pause("pause_finalize")


def _pause(name: str) -> None:
    kind, directory = _fault()
    if kind != name or not directory:
        return
    open(os.path.join(directory, "paused"), "a").close()
    deadline = time.monotonic() + 120
    while not os.path.exists(os.path.join(directory, "resume")) and time.monotonic() < deadline:
        time.sleep(0.05)
