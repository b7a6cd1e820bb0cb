"""Small helpers for the text Rescore prints: counts with the right plural, process wall time."""

from __future__ import annotations

import os
import time

_IMPORTED = time.time()


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 file', '2 files', '1,024 read units' ('words' for an irregular plural)."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def process_seconds() -> float:
    """Wall seconds since this process started (the interpreter and its imports included).

    Linux: from /proc/self/stat (start time in clock ticks after boot) and /proc/uptime;
    elsewhere, from when this module was first imported.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as f:
            stat = f.read()
        # Fields after the command name (which may hold spaces) start at field 3; starttime is 22.
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
        return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return time.time() - _IMPORTED
