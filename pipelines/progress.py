"""A progress line on stderr while the pipeline runs: read units written so far.

The driver cannot see inside every runner's workers while they run, but every runner writes
staged files named by read unit, so counting the units in `_staging/scored-*` shows how far the job is, the
same way locally, on Flink or on Dataflow. On a terminal the line is rewritten in place every
half second; elsewhere (cron, CI logs), with --log-level INFO or DEBUG, a line is printed every
15 s when it has changed.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from rescore.pipelines.wording import plural
from rescore.transforms.files import storage
from rescore.transforms.files.layout import SCORED_FILES, staging_dir


class Progress:
    def __init__(self, output: str, units: int, rows: int, files: int, *, stream=None, enabled: bool = True):
        self._output = output
        self._staging = staging_dir(output)
        self._units = units
        self._rows = rows
        self._files = files
        self._stream = stream or sys.stderr
        self._tty = hasattr(self._stream, "isatty") and self._stream.isatty()
        self._enabled = enabled
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        self._last = ""

    def _done(self) -> int:
        try:
            # A unit larger than --shard-rows is staged as parts: count units, not files.
            # Finalize moves staged files into the output directory (cleared of an earlier run
            # before this one starts): count both, or a fast write step reads as 0 written.
            staged = storage.list_dir(self._staging, SCORED_FILES) + storage.list_dir(self._output, SCORED_FILES)
            return len({p.rsplit("/", 1)[-1].split("-of-")[0] for p in staged})
        except Exception:  # noqa: BLE001  (a progress line must never break the run)
            return 0

    def _line(self) -> str:
        done = min(self._done(), self._units)
        pct = 100.0 * done / self._units if self._units else 100.0
        return (
            f"rescore: {plural(self._rows, 'row')} in {plural(self._files, 'file')}: {done}/{plural(self._units, 'read unit')} "
            f"written ({pct:.0f}%), {time.monotonic() - self._started:.0f} s"
        )

    def _emit(self, line: str, final: bool = False) -> None:
        if self._tty:
            self._stream.write("\r\x1b[K" + line + ("\n" if final else ""))
        elif line != self._last:
            self._stream.write(line + "\n")
        self._stream.flush()
        self._last = line

    def _loop(self) -> None:
        interval = 0.5 if self._tty else 15.0
        while not self._stop.wait(interval):
            self._emit(self._line())

    def __enter__(self) -> "Progress":
        # In logs (not a terminal) only at --log-level INFO or DEBUG: by default a failure is one line.
        if self._enabled and (self._tty or logging.getLogger().isEnabledFor(logging.INFO)):
            self._emit(
                f"rescore: planned {plural(self._rows, 'row')} in {plural(self._files, 'file')} "
                f"({plural(self._units, 'read unit')}); running"
            )
            self._thread = threading.Thread(target=self._loop, name="rescore-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join(timeout=5)
            if exc[0] is None:
                # The last units may land between two ticks (on a multi-process runner every unit
                # is written in the last seconds): end on the count as it stands, not the last tick.
                self._emit(self._line(), final=True)
            elif self._tty:
                self._emit(self._last, final=True)
