"""Overlap a DoFn's per-element work inside a bundle: one read unit is decoded, scored or encoded
on a small thread pool while the next one is handed over.

Parquet decoding and encoding, Arrow kernels and torch all release the GIL, so a read or write
step over several read units uses more than one core without a second process (a second
process costs a Python start-up and a copy of every element). Results are emitted in the order
elements arrived, each with its own element's window and timestamp: a step gives the same
outputs with any number of threads.

At most `threads` elements are in flight, so memory stays bounded (process() waits for the
oldest before it returns). A failure is raised in the bundle's thread once every running job
has stopped: a retried bundle never races a leftover write to the same staged file.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any


MAX_AUTO_THREADS = 4


def resolve_threads(choice: int) -> int:
    """`choice` threads, or for 0 (auto) one per core of this worker, at most MAX_AUTO_THREADS."""
    if choice > 0:
        return choice
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_AUTO_THREADS, cores))


def _windowed(outputs: Iterable[Any], windows, timestamp) -> Iterator[Any]:
    from apache_beam.pvalue import TaggedOutput  # (Beam-free at import: resolve_threads serves the launcher)
    from apache_beam.utils.windowed_value import WindowedValue

    for out in outputs:
        if isinstance(out, TaggedOutput):
            yield TaggedOutput(out.tag, WindowedValue(out.value, timestamp, windows))
        else:
            yield WindowedValue(out, timestamp, windows)


class Overlap:
    """Runs `work(*args)` for each element on up to `threads` threads; `done(result)` (called in
    the bundle's own thread, where Beam metrics count) turns a result into the outputs."""

    def __init__(self, threads: int, done: Callable[[Any], Iterable[Any]]):
        self.threads = threads
        self._done = done
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="rescore-overlap") if threads > 1 else None
        self._pending: deque[tuple[Future, Any, Any]] = deque()

    def submit(self, work: Callable[..., Any], *args, window, timestamp) -> Iterator[Any]:
        """Start one element's work; yields the outputs of elements that are finished."""
        windows = (window,)
        if self._pool is None:
            yield from _windowed(self._done(work(*args)), windows, timestamp)
            return
        self._pending.append((self._pool.submit(work, *args), windows, timestamp))
        while len(self._pending) > self.threads:
            yield from self._collect()

    def drain(self) -> Iterator[Any]:
        """The outputs of every element still in flight (call from finish_bundle)."""
        while self._pending:
            yield from self._collect()

    def _collect(self) -> Iterator[Any]:
        future, windows, timestamp = self._pending.popleft()
        try:
            result = future.result()
        except BaseException:
            self.abandon()
            raise
        yield from _windowed(self._done(result), windows, timestamp)

    def abandon(self) -> None:
        """Drop queued work and wait for running work to stop (a failed bundle)."""
        for future, _, _ in self._pending:
            future.cancel()
        wait([f for f, _, _ in self._pending])
        self._pending.clear()

    def close(self) -> None:
        self.abandon()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
