"""Decoded read units kept between the two reads of a unit, when the same worker process does both.

Rescore reads each read unit twice: once for its light rows (validation, scoring keys) and once
where its scored rows are written, so token columns never cross the shuffle. On one machine the
process that decoded a unit for the first read is often the one that writes it: the first read
offers its table here, the second takes it instead of decoding the file again. The second read
is only skipped, never changed:

- the input is checked exactly as a read checks it (`fingerprint.verify`: stat and footer hash,
  before anything is used), so a file rewritten between the passes fails the run as it always did;
- a unit is taken once (the entry is dropped), and only a table with every column the second
  read needs is served; columns the first read left out are read from the file then;
- the cache is bounded by bytes (`budget`) and nothing is evicted to make room for a later unit.
  What it keeps is chosen by decode time saved per byte held: the columns that cost the most
  to decode for their size (scalars, then lists by the width of their values: an int8 action
  mask decodes through int32 and repetition levels, ~30 % of a unit's decode for ~10 % of its
  bytes) are kept for every unit of the run where they fit in the budget all together (room for
  the units still to come is reserved as units are offered); whole units are kept on top while
  that reserve allows. The whole units kept are the first ones read, which the in-process runner
  also writes first, so their memory is handed back early in the write step.

Read-ahead: once every unit of the run has been offered (the read step is over), a thread reads
the columns of the first read that the partial entries lack, in unit order (the order the
in-process write step takes them), while the shuffle and the scoring keep one core busy and
leave the other idle. It stops
at the write step's first take (from then on both cores are busy writing, and it would only
compete with them) and holds at most `ahead` bytes over the budget (the run setting
read_ahead_mb, default a sixth of the budget). A completed entry is served like a whole one; a write that
comes for a unit being completed waits for that read instead of starting its own. A read-ahead
that fails leaves the entry as it was: the write step's own read then fails or succeeds as it
always did, and the fingerprint check at `read_back` covers what was read ahead too.

Multi-process and remote runners simply miss (the second read runs in another process). The
cache of a run is part of its UnitStore (transforms/unit_store.py), which the read and write
steps are given; the store's offer/expect/read_back use it. Nothing here imports Beam.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import pyarrow as pa

from rescore.transforms.files import storage

DEFAULT_FRACTION = 1 / 8
"""The cache's default size: this fraction of physical memory, at most DEFAULT_CAP."""
DEFAULT_CAP = 3 << 30  # 3 GiB
AHEAD_FRACTION = 1 / 6
"""The read-ahead's default room over the budget: this fraction of the budget."""


def budget_bytes(cache_mb: float | None) -> int:
    """Bytes the cache may hold: `cache_mb` MB (the run setting unit_cache_mb; 0 turns it off),
    else (None) DEFAULT_FRACTION of this machine's physical memory, at most DEFAULT_CAP."""
    if cache_mb is not None:
        return max(0, int(float(cache_mb) * (1 << 20)))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0
    return int(min(DEFAULT_CAP, memory * DEFAULT_FRACTION))


def ahead_bytes(read_ahead_mb: float | None, budget: int) -> int:
    """Bytes the read-ahead may hold over `budget`: `read_ahead_mb` MB (the run setting
    read_ahead_mb; 0 turns it off), else (None) AHEAD_FRACTION of the budget."""
    if read_ahead_mb is not None:
        return max(0, int(float(read_ahead_mb) * (1 << 20)))
    return int(budget * AHEAD_FRACTION)


@dataclass
class Stats:
    offered: int = 0
    kept: int = 0
    partial: int = 0
    """Of the kept, those held as some of their columns (the rest is read again)."""
    hits: int = 0
    misses: int = 0
    ahead: int = 0
    """Of the partial, those completed by the read-ahead before the write step took them."""
    waits: int = 0
    """Takes that waited for a read-ahead in flight."""


def _keep_order(field: pa.Field) -> tuple[int, int]:
    """Which columns a partial entry keeps first: the most decode time saved per byte held.
    Scalars (a few bytes per row), then lists by the width of their values (narrow values cost
    as much to decode per value, in levels, as wide ones), then everything else."""
    t = field.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_nested(t)):
        return (0, 0)
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and not pa.types.is_nested(t.value_type):
        try:
            return (1, t.value_type.bit_width)
        except ValueError:  # strings, binary: no fixed width
            pass
    return (2, 0)


class UnitCache:
    """Tables of read units by key, at most `budget` bytes in all (plus `ahead` for the
    read-ahead); thread-safe.

    With `expect(plan, rows)` (the run's rows), the first unit offered decides the columns kept for
    every unit (`tier`: as many as fit, for all the run's rows, in `_keep_order`); each unit is
    then kept whole while the bytes held plus those columns' share of the units still to come fit,
    else as those columns only. Without it, a unit is kept whole if it fits, else as the columns
    of `tier` that fit.

    An offer with `complete` (a function from the part kept to the offered table) may be completed
    ahead: when the offered rows reach the expected rows, a thread completes partial entries in
    the order of `order` while what is held stays within budget + ahead, until the first take."""

    def __init__(self, budget: int, ahead: int | None = None):
        self.budget = budget
        self.ahead = ahead_bytes(None, budget) if ahead is None else ahead
        self.held = 0
        self.stats = Stats()
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._plan = None
        self._expected_rows = 0
        self._offered_rows = 0
        self._tier: tuple[str, ...] | None = None
        self._tier_row_bytes = 0.0
        self._pending: dict = {}
        """key -> (order, bytes the entry lacks, complete): partial entries the read-ahead may complete."""
        self._inflight: set = set()
        self._ahead_started = False
        self._ahead_thread: threading.Thread | None = None
        self._caught_up = False
        self._generation = 0
        """Bumped by a new plan and by clear(): a read-ahead of an older one stops."""

    def resize(self, budget: int, ahead: int) -> None:
        """Lower the budget and the read-ahead's room (a memory budget, transforms/memory.py),
        before the run offers its first unit; never raised."""
        with self._lock:
            self.budget = min(self.budget, max(0, int(budget)))
            self.ahead = min(self.ahead, max(0, int(ahead)))

    def expect(self, plan, rows: int) -> None:
        """The run of `plan` (any hashable naming the run's units) reads `rows` rows in all:
        reserve room for the kept columns of every unit. A new plan starts the accounting
        afresh (a process may run several jobs); the same plan again changes nothing."""
        with self._lock:
            if plan == self._plan:
                return
            self._plan = plan
            self._expected_rows = int(rows)
            self._offered_rows = 0
            self._tier = None
            self._tier_row_bytes = 0.0
            self._pending.clear()
            self._ahead_started = False
            self._caught_up = False
            self._generation += 1
            self._changed.notify_all()

    def _choose_tier(self, table: pa.Table) -> None:
        rows = max(self._expected_rows, table.num_rows, 1)
        per_row = {f.name: table.column(f.name).nbytes / max(table.num_rows, 1) for f in table.schema}
        chosen, total = [], 0.0
        for field in sorted(table.schema, key=_keep_order):  # sorted() is stable: schema order within a rank
            cost = per_row[field.name] * rows
            if total + cost <= self.budget:
                chosen.append(field.name)
                total += cost
        self._tier = tuple(chosen)
        self._tier_row_bytes = total / rows

    def offer(self, key, table: pa.Table, *, partial: bool = True, order=0,
              complete: Callable[[pa.Table], pa.Table] | None = None) -> bool:
        """Keep `table` (or, with `partial`, its tier columns) under `key` if it fits in what
        is left of the budget after the reserve for the units still to come. `complete` and
        `order`: how and when the read-ahead may complete a partial entry (class docstring)."""
        size = table.nbytes
        with self._lock:
            self.stats.offered += 1
            if key in self._entries or self.budget <= 0:
                return False
            if self._tier is None and partial:
                self._choose_tier(table)
            self._offered_rows += table.num_rows
            later = max(0, self._expected_rows - self._offered_rows)
            reserve = self._tier_row_bytes * later if partial else 0.0
            keep = None
            if self.held + size + reserve <= self.budget:
                keep = table
            elif partial and self._tier:
                names = [n for n in self._tier if n in table.column_names]
                part = table.select(names) if names else None
                if part is not None and self.held + part.nbytes + reserve <= self.budget:
                    keep = part
                    self.stats.partial += 1
                    if complete is not None and self.ahead > 0:
                        self._pending[key] = (order, size - part.nbytes, complete)
            if keep is not None:
                self._entries[key] = keep
                self.held += keep.nbytes
                self.stats.kept += 1
            if self._pending and not self._ahead_started and 0 < self._expected_rows <= self._offered_rows:
                self._ahead_started = True  # every unit offered: the read step is over
                self._ahead_thread = threading.Thread(
                    target=self._read_ahead, args=(self._generation,), name="rescore-read-ahead", daemon=True
                )
                self._ahead_thread.start()
            return keep is not None

    def _next_ahead(self, generation: int):
        """Under the lock: the next pending entry in order, if its completion fits in budget +
        ahead and the write step has not begun (nor the plan changed); else None."""
        if generation != self._generation or self._caught_up or not self._pending:
            return None
        key = min(self._pending, key=lambda k: self._pending[k][0])
        return key if self.held + self._pending[key][1] <= self.budget + self.ahead else None

    def _read_ahead(self, generation: int) -> None:
        """The read-ahead thread: complete pending entries in order (class docstring)."""
        while True:
            with self._lock:
                key = self._next_ahead(generation)
                if key is None:
                    return
                _, _, complete = self._pending.pop(key)
                part = self._entries[key]
                self._inflight.add(key)
            whole = None
            try:
                whole = complete(part)
            except Exception:  # the write step's own read reports it, or succeeds
                pass
            finally:  # a take waiting for this key is woken whatever happened
                with self._lock:
                    self._inflight.discard(key)
                    if whole is not None and self._entries.get(key) is part:
                        self._entries[key] = whole
                        self.held += whole.nbytes - part.nbytes
                        self.stats.ahead += 1
                    self._changed.notify_all()

    def take(self, key) -> pa.Table | None:
        """The table kept under `key`, removed from the cache; None when it is not held. Waits
        while the read-ahead completes it."""
        with self._lock:
            self._caught_up = True  # the write step has begun: from now on a read-ahead would compete with it
            if key in self._inflight:
                self.stats.waits += 1
                while key in self._inflight:
                    self._changed.wait()
            self._pending.pop(key, None)
            table = self._entries.pop(key, None)
            if table is None:
                self.stats.misses += 1
                return None
            self.held -= table.nbytes
            self.stats.hits += 1
            self._changed.notify_all()
            return table

    def join_ahead(self, timeout: float | None = None) -> None:
        """Wait for the read-ahead thread, if one was started, to finish (tests, benchmarks)."""
        thread = self._ahead_thread
        if thread is not None:
            thread.join(timeout)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._pending.clear()
            self.held = 0
            self._ahead_started = False
            self._caught_up = False
            self._generation += 1
            self._changed.notify_all()


def unit_key(unit) -> tuple:
    # The file as planned (path, fingerprint) and which of its rows: a unit of another plan, or
    # of a file that was replaced, never matches.
    return (unit.path, tuple(unit.row_groups), unit.rows, unit.num_rows, unit.fingerprint, unit.model_file)


def with_columns(table: pa.Table, unit, columns: list[str] | None, read: Callable[..., pa.Table]) -> pa.Table:
    """`table` (some of `unit`'s columns) with those of `columns` (None: all) that the unit's
    file has and `table` lacks, read from the file with `read(unit, names)` and appended."""
    names = storage.open_parquet(unit.path).schema_arrow.names
    missing = [n for n in (names if columns is None else columns) if n not in table.column_names and n in names]
    if missing:
        extra = read(replace(unit, model_file=None), missing)
        for name in missing:
            table = table.append_column(extra.schema.field(name), extra[name])
    return table
