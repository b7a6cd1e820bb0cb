"""What one process keeps of a run's read units, and the one handle the steps reach it by.

Rescore reads each read unit twice (docs/architecture.md, "The flow of one row"); on one machine
three things make the second read, and the first, cheaper, and they share state between steps:

- the prefetch (`Prefetch`): the first units of a plain local run decoded on a thread while the
  launcher imports Beam and torch; the read step takes them instead of reading them;
- the unit cache and its read-ahead (transforms/files/unit_cache.py): the read step offers each
  decoded unit, the write step takes it instead of reading the unit again;
- the column decoders of sliced row groups (transforms/files/row_group_slices.py), which
  continue where the last slice's read stopped.

A `UnitStore` holds the three for one run in one process. The steps are given a
`UnitStoreHandle`, created once per run where the job is built (pipelines/job.py: build_job,
or build()), with Beam's `Shared` idiom: a pickled handle carries only a key and the run's
settings, and `acquire()` in a step's setup returns the store of that process. Where every step
runs in the launcher's process (the in-process runner), that is the one store the launcher made
(with the prefetch it started) and holds for the run; a worker of another runner builds its own,
whose cache simply misses (the write step reads the unit again), and gives its process the
Arrow memory pool the `rescore` command gives its own (`keep_freed_pages`). Nothing here is a process
global: a run's store is closed at its end (prefetched tables not taken, cached units, open
decoders dropped), and the next run makes a new one.

The store is also the in-process result channel: the finalize step leaves the document it
published (`published`) for the launcher, which reads metrics.json back only where the finalize
step ran elsewhere.

Correctness never depends on the store: each of the three serves a table only when it is the
one a read of the unit would give now (fingerprints checked), else the unit is read.
Nothing here imports Beam but `UnitStoreHandle` (when one is created), so pipelines/early.py
can start the prefetch before Beam is imported.
"""

from __future__ import annotations

import glob
import logging
import os
import threading
from concurrent.futures import Future
from typing import Any

import pyarrow as pa

from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import storage
from rescore.transforms.files.row_group_slices import SliceDecoders
from rescore.transforms import memory
from rescore.transforms.files.unit_cache import UnitCache, ahead_bytes, budget_bytes, unit_key, with_columns
from rescore.transforms.input_plan import ReadUnit, planned_file_units
from rescore.transforms.rows.keys import light_columns
from rescore.transforms.unit_read import read_unit

log = logging.getLogger(__name__)

PREFETCH_UNITS_PER_THREAD = 4
"""Units queued for the prefetch per read thread. The prefetch thread decodes them one after the
other while the command imports and builds the job; the read step cancels those not started
yet and reads them itself, so a long queue costs nothing. Two per thread left the prefetch
thread idle for the last ~0.6 s of the imports at 1,024,000 rows (2 cores); with four it had
decoded 6 of the 8 when the read step began."""


class Prefetch:
    """The first read units of a local in-process run, decoded on a thread while the launcher
    imports Beam and torch and builds the pipeline (GIL-bound work that leaves a core idle).

    What is decoded is exactly what the read step would decode first: `read_unit` of the
    contract's light columns, with its fingerprint checks; the read step takes a unit's table
    instead of reading it (reading any column a strategy needs besides), or reads it as before
    when the unit was not prefetched, not started yet, or failed (a read error is then raised by
    the read step's own read, where it always was). Units are matched by file, fingerprint and
    row groups, so a unit of a file changed after the prefetch is never taken: it is read.
    `slices`: the decoders its reads of sliced row groups leave open, which the run's store
    adopts (the read step continues them).
    """

    def __init__(self, units: list[ReadUnit], columns: list[str], threads: int = 1):
        self.slices = SliceDecoders()
        self._columns = columns
        self._threads = max(1, threads)
        self._queue = list(units)
        self._queue_lock = threading.Lock()
        self._futures = {unit_key(u): Future() for u in units}
        self._more: list[threading.Thread] = []
        # One thread, at a lower priority, while the launcher imports (its imports are the
        # critical path and keep a core; the prefetch takes what is left); `threads` from
        # `imports_done()` on.
        self._start(low=True)
        self.units = len(units)
        """Units queued."""
        self.taken = 0
        """Units the read step took."""

    def _start(self, *, low: bool) -> None:
        name = f"rescore-prefetch_{len(self._more)}"
        # Not a daemon: a Python caller's interpreter waits for a decode under way at its exit (a
        # daemon thread still in Arrow's C++ code then aborts the process: "terminate called
        # without an active exception"); the console script ends with os._exit.
        thread = threading.Thread(target=self._decode_queued, args=(low,), name=name)
        self._more.append(thread)
        thread.start()

    def _decode_queued(self, low: bool) -> None:
        if low:
            _lower_priority()
        while True:
            with self._queue_lock:
                if not self._queue:
                    return
                unit = self._queue.pop(0)
            future = self._futures.get(unit_key(unit))
            if future is None or not future.set_running_or_notify_cancel():  # the read step reads it
                continue
            try:
                future.set_result(read_unit(unit, self._columns, use_threads=False, slices=self.slices))
            except BaseException as e:  # noqa: BLE001  (the read step reads the unit itself and reports)
                future.set_exception(e)

    def imports_done(self) -> None:
        """The launcher has imported what it runs with: the units not started yet decode on
        `threads` threads. On the one thread alone, the last of 4 units at 204,800 rows was
        still decoding (~0.45 s a unit) ~0.4 s after the read step began, with a core idle
        (benchmarks/README.md, issue 42)."""
        with self._queue_lock:
            more = self._threads - len(self._more) if self._queue else 0
        for _ in range(max(0, more)):
            self._start(low=False)

    def take(self, unit: ReadUnit) -> pa.Table | None:
        future = self._futures.pop(unit_key(unit), None)
        if future is None or future.cancel():  # not prefetched, or not started: read it now
            return None
        try:
            table = future.result()
        except Exception:  # noqa: BLE001  (the read step reads the unit itself and reports)
            return None
        self.taken += 1
        return table

    def wait(self) -> None:
        """Wait for every queued unit to be decoded (tests)."""
        for future in list(self._futures.values()):
            try:
                future.result()
            except Exception:  # noqa: BLE001
                pass

    def close(self) -> None:
        with self._queue_lock:
            self._queue.clear()
        for future in self._futures.values():
            future.cancel()
        self._futures.clear()


def _lower_priority() -> None:
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # this thread only (Linux)
    except (AttributeError, OSError):  # pragma: no cover - elsewhere: normal priority
        pass


def _local_files(pattern: str) -> list[str]:
    """The regular files a local pattern matches (a directory: its *.parquet), without Beam."""
    if os.path.isdir(pattern):
        pattern = os.path.join(pattern, "*.parquet")
    found = glob.glob(pattern, recursive=True) if glob.has_magic(pattern) else [pattern]
    return [p for p in found if os.path.isfile(p)]


def start_prefetch(patterns: list[str], *, shard_rows: int, threads: int, memory_mb: float | None = None) -> Prefetch | None:
    """Start decoding the first read units of the first local input file (up to
    PREFETCH_UNITS_PER_THREAD per read thread, one at a time; under a memory budget, at most
    the units that fit in its prefetch share, transforms/memory.py); None where the input is not
    local files. Never raises: planning the run reports any problem with the input."""
    try:
        if not patterns or not all(storage.is_local(p) for p in patterns):
            return None
        files = [f for pattern in patterns for f in _local_files(pattern)]
        if not files:
            return None
        units = planned_file_units(min(files), shard_rows)[: max(1, threads) * PREFETCH_UNITS_PER_THREAD]
        budget = memory.budget_mb(memory_mb)
        if budget is not None:
            units = units[: memory.prefetch_units(budget, [memory.unit_bytes(u) for u in units])]
    except Exception:  # noqa: BLE001
        return None
    return Prefetch(units, light_columns(()), threads) if units else None


WORKER_DECAY_MS = 3000
"""How long Arrow's jemalloc keeps freed pages in a runner's worker: the `rescore` command's
default (pipelines/cli.py, DEFAULT_DECAY_MS, which says why)."""


def keep_freed_pages(memory_mb: float | None) -> None:
    """In a runner's worker process (Flink's, Prism's, Dataflow's SDK workers: started by Beam's
    boot, not by the `rescore` command, so none of its allocator settings apply): Arrow's jemalloc
    pool with freed pages kept WORKER_DECAY_MS for the next read (0 under a memory budget), as the
    command sets it for an in-process run, unless ARROW_DEFAULT_MEMORY_POOL chose a pool.

    pyarrow's default there, mimalloc, hands a read unit's large buffers back to the kernel as
    they are freed, so every join of a unit's decoded batches and every output column landed on
    fresh pages: in a worker forked from a process that has imported torch, the two reads of 4
    benchmark units took ~1.3 s more system time than with this pool (benchmarks/README.md, "Flink
    against in-process"). Only where buffers are placed changes, never a value; buffers the old
    pool made are freed by it."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return
    try:
        if pa.default_memory_pool().backend_name == "jemalloc":
            return
        pa.jemalloc_set_decay_ms(0 if memory.budget_mb(memory_mb) is not None else WORKER_DECAY_MS)
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowException):  # a pyarrow built without jemalloc: its default pool
        pass


class UnitStore:
    """One process's prefetch, unit cache (with its read-ahead) and slice decoders for one run,
    and the document its finalize step published (module docstring). Thread-safe.

    cache_mb / read_ahead_mb: the run settings unit_cache_mb and read_ahead_mb (None: the
    defaults of transforms/files/unit_cache.py, from this machine's memory); memory_mb: the run
    setting memory_mb (None: a share of the container's memory limit where there is one, else no
    budget), which `fit` applies to them and to the steps' threads."""

    def __init__(
        self, cache_mb: float | None = None, read_ahead_mb: float | None = None, *, prefetch: Prefetch | None = None,
        memory_mb: float | None = None,
    ):
        budget = budget_bytes(cache_mb)
        self.cache = UnitCache(budget, ahead_bytes(read_ahead_mb, budget))
        self.memory_mb = memory.budget_mb(memory_mb)
        """The budget in MB: memory_mb, else a share of the container's limit; None: no budget."""
        self.memory: memory.MemoryPlan | None = None
        """The plan `fit` made under memory_mb (None: none yet, or no budget)."""
        self._fitted: tuple | None = None
        self._fit_lock = threading.Lock()
        self.prefetch = prefetch
        self.slices = prefetch.slices if prefetch is not None else SliceDecoders()
        self.decoded_again = 0
        """Units read_back decoded from their file (not kept by the cache)."""
        self.published: tuple[dict[str, Any], str] | None = None
        """(metrics.json's document, where it was written), set by the finalize step."""

    def read(self, unit: ReadUnit, columns: list[str] | None = None, *, joined: bool = True) -> pa.Table:
        """read_unit with this run's slice decoders."""
        return read_unit(unit, columns, slices=self.slices, joined=joined)

    def first_read(self, unit: ReadUnit, columns: list[str], *, kept: bool = True) -> pa.Table:
        """The read step's read of `unit`: the prefetched table (plus any column it lacks), else
        read. kept=False: the table is not offered to the cache (the write step runs in another
        process), so its columns are left in the chunks they were decoded in (read_unit's
        `joined`): the same values without the join's copy of every column."""
        table = self.prefetch.take(unit) if self.prefetch is not None and unit.model_file is None else None
        if table is None:
            return self.read(unit, columns, joined=kept)
        return with_columns(table, unit, columns, self.read)

    def fit(self, units, threads: int) -> int:
        """The read units a step of this run may have in flight (`threads` without a memory
        budget). Under one, the first call (the first step's setup: imports done, nothing held
        but prefetched tables) plans the process's memory for the run's `units`
        (transforms/memory.py): the threads, and the cache and read-ahead lowered to fit; later
        calls for the same units return the same plan."""
        if self.memory_mb is None:
            return threads
        units = tuple(units)
        key = hash(tuple(unit_key(u) for u in units))
        with self._fit_lock:
            if self._fitted is None or self._fitted[0] != key:
                plan = memory.plan(
                    int(self.memory_mb * memory.MB), base=memory.process_base(), unit=memory.largest_unit(units),
                    threads=threads, cache=self.cache.budget, ahead=self.cache.ahead,
                )
                self.cache.resize(plan.cache, plan.ahead)
                self.memory = plan
                self._fitted = (key, plan.threads)
                if not plan.fits:
                    log.warning(
                        "the memory budget (%s MB: --memory-mb, or %d%% of the container's limit) is below what this "
                        "process needs for one read unit (~%d MB of its own, ~%.1f MB per unit in flight); running with "
                        "the least it can use: one unit at a time, no unit cache", f"{self.memory_mb:,.0f}",
                        memory.CONTAINER_SHARE * 100, plan.base // memory.MB, plan.unit * memory.UNIT_FACTOR / memory.MB,
                    )
            return min(threads, self._fitted[1])

    def expect(self, units) -> None:
        """The run reads these read units: the cache keeps room for the cheap columns of all of them."""
        if self.cache.budget > 0:
            units = tuple(units)
            self.cache.expect(hash(tuple(unit_key(u) for u in units)), sum(u.num_rows for u in units))

    def offer(self, unit: ReadUnit, table: pa.Table) -> None:
        """After the first read of `unit`: keep its decoded table for the second read, if it fits;
        what a partial entry lacks may be read ahead.

        Only units with a planned fingerprint are kept: the second read must be able to prove the
        file unchanged (read_unit has just checked it before and after the first read).
        """
        if unit.fingerprint is None or self.cache.budget <= 0:
            return
        # A unit with a model stage's side file keeps all or nothing: a re-read of missing
        # columns reads the input file alone.
        # The read-ahead completes the columns of `table` that a partial entry lacks, no more:
        # what it adds to the bytes held is known before it reads (columns the first read left
        # out are read by the write step itself, as for a unit kept whole).
        columns = table.column_names

        def complete(part: pa.Table) -> pa.Table:
            return with_columns(part, unit, columns, self.read)

        self.cache.offer(unit_key(unit), table, partial=unit.model_file is None, order=unit.index, complete=complete)

    def read_back(self, unit: ReadUnit) -> pa.Table:
        """The unit's rows with every column, for the second read: the table the first read kept
        (after the same fingerprint check a read makes, plus any column it did not read), else
        read(unit)."""
        table = self.cache.take(unit_key(unit)) if unit.fingerprint is not None else None
        if table is None:
            self.decoded_again += 1
            return self.read(unit)
        fingerprints.verify(unit.path, unit.fingerprint)  # raises InputChanged, as read_unit does
        return with_columns(table, unit, None, self.read)

    def close(self) -> None:
        """The end of the run: drop what was prefetched and not taken, every cached unit and every
        open decoder (`published` and the counters stay)."""
        if self.prefetch is not None:
            self.prefetch.close()
        self.cache.clear()
        self.slices.clear()


class UnitStoreHandle:
    """The steps' way to the run's UnitStore (module docstring): created once per run on the
    launcher, which holds its store (with `prefetch`, if one was started) until `close()`;
    pickled into the steps, it carries only Beam's `Shared` key and the settings, and
    `acquire()` returns the store of the process it runs in."""

    def __init__(
        self, cache_mb: float | None = None, read_ahead_mb: float | None = None, *, prefetch: Prefetch | None = None,
        memory_mb: float | None = None,
    ):
        from apache_beam.utils.shared import Shared

        self._shared = Shared()
        self._settings = (cache_mb, read_ahead_mb, memory_mb)
        # Shared keeps a weak reference: the launcher's strong one keeps this store for the run.
        self._store: UnitStore | None = self._shared.acquire(
            lambda: UnitStore(cache_mb, read_ahead_mb, prefetch=prefetch, memory_mb=memory_mb)
        )

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_store": None}  # a step gets the key and the settings, never the tables

    def acquire(self) -> UnitStore:
        """The run's store in this process: the launcher's where the step runs there, else one
        of its own (made on the first call)."""
        if self._store is not None:
            return self._store
        cache_mb, read_ahead_mb, memory_mb = self._settings

        def worker_store() -> UnitStore:  # a process the launcher's store is not in: a runner's worker
            keep_freed_pages(memory_mb)
            return UnitStore(cache_mb, read_ahead_mb, memory_mb=memory_mb)

        return self._shared.acquire(worker_store)

    @property
    def store(self) -> UnitStore | None:
        """The launcher's store (None in a step's copy)."""
        return self._store

    def published(self) -> tuple[dict[str, Any], str] | None:
        """(metrics.json's document, its path) where the finalize step ran in this process;
        None where it ran elsewhere (or has not run)."""
        return None if self._store is None else self._store.published

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
