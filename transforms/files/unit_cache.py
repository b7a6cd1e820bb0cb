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
- the cache is bounded by bytes (`budget`); a unit that does not fit is not kept, and nothing is
  evicted to make room for a later one: the units kept are the first ones read, which the
  in-process runner also writes first, so their memory is handed back early in the write step.

Multi-process and remote runners simply miss (the second read runs in another process). Nothing
here imports Beam.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace

import pyarrow as pa

from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import storage

BUDGET_ENV = "RESCORE_UNIT_CACHE_MB"
"""Cache size in MB (0 turns it off); default: DEFAULT_FRACTION of physical memory, at most DEFAULT_CAP."""
DEFAULT_FRACTION = 1 / 32
DEFAULT_CAP = 1 << 30


def default_budget() -> int:
    """Bytes the cache may hold: RESCORE_UNIT_CACHE_MB, else 1/32 of physical memory (at most 1 GiB)."""
    chosen = os.environ.get(BUDGET_ENV, "").strip()
    if chosen:
        return max(0, int(float(chosen) * (1 << 20)))
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return 0
    return int(min(DEFAULT_CAP, memory * DEFAULT_FRACTION))


@dataclass
class Stats:
    offered: int = 0
    kept: int = 0
    hits: int = 0
    misses: int = 0


class UnitCache:
    """Tables of read units by key, at most `budget` bytes in all; thread-safe."""

    def __init__(self, budget: int):
        self.budget = budget
        self.held = 0
        self.stats = Stats()
        self._entries: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def offer(self, key, table: pa.Table) -> bool:
        """Keep `table` under `key` if it fits in what is left of the budget."""
        size = table.nbytes
        with self._lock:
            self.stats.offered += 1
            if key in self._entries or self.held + size > self.budget:
                return False
            self._entries[key] = table
            self.held += size
            self.stats.kept += 1
            return True

    def take(self, key) -> pa.Table | None:
        """The table kept under `key`, removed from the cache; None when it is not held."""
        with self._lock:
            table = self._entries.pop(key, None)
            if table is None:
                self.stats.misses += 1
                return None
            self.held -= table.nbytes
            self.stats.hits += 1
            return table

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.held = 0


_cache: UnitCache | None = None
_cache_lock = threading.Lock()


def cache() -> UnitCache:
    """This process's cache (created on first use with default_budget())."""
    global _cache
    with _cache_lock:
        if _cache is None:
            _cache = UnitCache(default_budget())
        return _cache


def reset(budget: int | None = None) -> UnitCache:
    """A fresh process cache (tests; a run that wants another budget)."""
    global _cache
    with _cache_lock:
        _cache = UnitCache(default_budget() if budget is None else budget)
        return _cache


def _key(unit) -> tuple:
    # The file as planned (path, fingerprint) and which of its rows: a unit of another plan, or
    # of a file that was replaced, never matches.
    return (unit.path, tuple(unit.row_groups), unit.num_rows, unit.fingerprint, unit.model_file)


def offer(unit, table: pa.Table) -> None:
    """After the first read of `unit`: keep its decoded table for the second read, if it fits.

    Only units with a planned fingerprint are kept: the second read must be able to prove the
    file unchanged (read_unit has just checked it before and after the first read).
    """
    if unit.fingerprint is not None and cache().budget > 0:
        cache().offer(_key(unit), table)


def read_back(unit, read: Callable[..., pa.Table]) -> pa.Table:
    """The unit's rows with every column, for the second read: the table the first read kept
    (after the same fingerprint check a read makes, plus any column it did not read), else
    `read(unit)` (transforms/read.read_unit)."""
    if unit.fingerprint is None:
        return read(unit)
    table = cache().take(_key(unit))
    if table is None:
        return read(unit)
    fingerprints.verify(unit.path, unit.fingerprint)  # raises InputChanged, as read_unit does
    names = storage.open_parquet(unit.path).schema_arrow.names
    missing = [n for n in names if n not in table.column_names]
    if missing:
        extra = read(replace(unit, model_file=None), missing)
        for name in missing:
            table = table.append_column(extra.schema.field(name), extra[name])
    return table
