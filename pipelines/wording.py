"""Small helpers for the text Rescore prints: counts with the right plural, process wall time."""

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
