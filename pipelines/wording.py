"""Small helpers for the text Rescore prints: counts with the right plural, and the one clock a
command's progress lines and its summary's wall time both read."""

from __future__ import annotations

import time


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 file', '2 files', '1,024 read units' ('words' for an irregular plural)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def process_seconds() -> float:
    """Wall seconds since this process began to run Rescore: since the `rescore` package was
    first imported (the console script's and `python -m rescore`'s first import), so Beam's and
    torch's imports count and nothing before does.

    Not the process's start time (/proc/self/stat): a shell runs the last command of
    `bash -c 'sleep 10 && rescore ...'` by exec, in its own process, which then started with
    the sleep (and a pasted quickstart line with the pip install).
    """
    import rescore

    return max(0.0, time.monotonic() - rescore._STARTED)


_run_origin: float | None = None


def start_run_clock(origin: float | None = None, *, stop: bool = False) -> None:
    """Start the command's clock at `origin` (a time.monotonic() value; default now): the
    progress lines (pipelines/progress.py) and the summary's wall time both count from it, so
    the last progress line never says 4 s where the summary says 10 s. `stop`: the command
    ended; no clock until the next one starts."""
    global _run_origin
    _run_origin = None if stop else (time.monotonic() if origin is None else origin)


def run_clock_origin() -> float | None:
    """Where the command's clock started (start_run_clock), or None before any command."""
    return _run_origin


def run_seconds() -> float:
    """Wall seconds on the command's clock (since now where no command started it)."""
    return max(0.0, time.monotonic() - (_run_origin if _run_origin is not None else time.monotonic()))
