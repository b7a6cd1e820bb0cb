"""A progress line on stderr while the pipeline runs: the work of THIS run, step by step.

The driver cannot see inside every runner's workers while they run, but every worker can write
the run's staging directory: each step drops an empty mark there as it finishes a piece of work
(transforms/files/progress_marks.py: a read unit read, a shuffle bucket scored, a read unit
written). Counting the marks shows how far the job is, the same way locally, on Flink or on
Dataflow, and never counts an earlier run's files (an --overwrite rerun starts at 0 %). The
percentage is the mean of the three steps' fractions.

On a terminal the line is rewritten in place every half second. Elsewhere (cron, Airflow, CI
logs) a plain line is printed every --progress-seconds seconds (default 15), the first
after that long, so a quick run or a quick failure prints nothing more. --quiet prints none.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from rescore.pipelines.wording import plural, run_clock_origin
from rescore.transforms.files import progress_marks
from rescore.transforms.files.layout import staging_dir

DEFAULT_INTERVAL = 15.0
"""Seconds between two progress lines where stderr is not a terminal, where the caller gives
none (a run gives its --progress-seconds, pipelines/options.py)."""


class Progress:
    def __init__(self, output: str, units: int, rows: int, files: int, *, stream=None, enabled: bool = True,
                 interval: float | None = None, detail=None):
        """detail: a callable that says what the runner is doing where the marks cannot (on a
        Flink cluster: the job server starting, the job's tasks; pipelines/flink_job.py), added
        to each line; '' adds nothing."""
        self._detail = detail
        self._marks = progress_marks.progress_dir(staging_dir(output))
        self._units = units
        self._rows = rows
        self._files = files
        self._stream = stream or sys.stderr
        self._tty = hasattr(self._stream, "isatty") and self._stream.isatty()
        self._enabled = enabled
        self._interval = 0.5 if self._tty else (DEFAULT_INTERVAL if interval is None else interval)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The command's clock (pipelines/wording.py), which the summary's wall time reads too:
        # its seconds count the imports and the plan before the pipeline, as the summary's do.
        origin = run_clock_origin()
        self._started = time.monotonic() if origin is None else origin
        self._last = ""
        self._printed = 0
        self._seen = (0, 0, 0)
        self._valid_rows: int | None = None  # the rows that passed validation, once every unit is read

    def counts(self) -> tuple[int, int, int, int]:
        """(units read, rows scored, rows to score, units written) as the marks say."""
        try:
            read, scored, written = progress_marks.count(self._marks)
        except Exception:  # noqa: BLE001  (a progress line must never break the run)
            read, scored, written = {}, 0, set()
        # Until every unit is read, the rows to score are the planned rows; then the valid ones.
        if len(read) >= self._units:
            self._valid_rows = sum(read.values())
        to_score = self._rows if self._valid_rows is None else self._valid_rows
        now = (min(len(read), self._units), min(scored, to_score), min(len(written), self._units))
        # Never backwards: publishing removes the marks with the staging directory.
        self._seen = tuple(max(a, b) for a, b in zip(self._seen, now))
        return self._seen[0], self._seen[1], to_score, self._seen[2]

    def _line(self, done: bool = False) -> str:
        """The line now; `done`: the pipeline finished, every step did all its work."""
        if done:
            read = written = self._units
            scoring = "scored all rows" if self._valid_rows is None else f"scored {self._valid_rows:,}/{plural(self._valid_rows, 'row')}"
            pct = 100.0
        else:
            read, scored, to_score, written = self.counts()
            units = max(self._units, 1)
            fractions = (read / units, scored / to_score if to_score else float(read >= self._units), written / units)
            pct = 100.0 * sum(fractions) / 3 if self._units else 100.0
            scoring = f"scored {scored:,}/{plural(to_score, 'row')}"
        detail = "" if done or self._detail is None else self._detail()
        return (
            f"rescore: {plural(self._rows, 'row')} in {plural(self._files, 'file')}: "
            f"read {read:,}/{plural(self._units, 'unit')}, {scoring}, "
            f"written {written:,}/{plural(self._units, 'unit')} ({pct:.0f}%), "
            f"{time.monotonic() - self._started:.{1 if done else 0}f} s"
            + (f"; {detail}" if detail else "")
        )

    def _emit(self, line: str, final: bool = False) -> None:
        try:
            if self._tty:
                self._stream.write("\r\x1b[K" + line + ("\n" if final else ""))
            else:
                self._stream.write(line + "\n")
            self._stream.flush()
        except Exception:  # noqa: BLE001  (a closed pipe must not break the run)
            pass
        self._last = line
        self._printed += 1

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._emit(self._line())

    def __enter__(self) -> "Progress":
        if not self._enabled:
            return self
        # A terminal, or a log at --log-level INFO/DEBUG, gets the plan at once; a plain log
        # gets its first line after one interval.
        if self._tty or logging.getLogger().isEnabledFor(logging.INFO):
            self._emit(
                f"rescore: planned {plural(self._rows, 'row')} in {plural(self._files, 'file')} "
                f"({plural(self._units, 'read unit')}); running"
            )
        self._thread = threading.Thread(target=self._loop, name="rescore-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join(timeout=5)
        if exc[0] is None:
            # The pipeline finished: every step did all of its work (finalize has removed the
            # marks with the staging directory). A log that had lines ends on the last one.
            if self._tty or self._printed:
                self._emit(self._line(done=True), final=True)
        elif self._tty and self._last:
            self._emit(self._last, final=True)
