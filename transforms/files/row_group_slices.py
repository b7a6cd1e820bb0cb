"""Slices of a large row group, each column decoded once when the slices are read in order.

A row group larger than --shard-rows is planned as several read units, each a slice of its rows
(transforms/input_plan.file_units): no unit holds more than --shard-rows rows, and the slices are
read, scored and written side by side like the units of smaller row groups. A file written with
pyarrow's defaults holds up to 1,048,576 rows in one row group; read as one unit, 1,024,000 rows
of the benchmark took 46.7 s and 8.2 GB against the polars script's 22.0 s and 4.3 GB, and 16.9 s
and 3.3 GB read in slices (benchmarks/README.md).

Parquet cannot start reading inside a row group (pages are decoded from the column chunk's
first), so a slice read from scratch decodes every row before it. Here each column of a sliced
row group keeps one decoder open between reads, and a read continues where the last one
stopped: slices read in order (as the prefetch, the read step, the read-ahead and the write step
of an in-process run ask for them) decode every row once. Each column has its own decoder, so
two threads reading consecutive slices decode different columns at once instead of queueing
behind one reader.

A read of a slice ahead of its decoder passes the rows between; it keeps them for their own
read if they are at most KEEP_SLICES slices' worth (the other read thread asks for that slice
next), else drops them. A read behind its decoder (a slice read twice, or the slices of one row
group spread over several workers) starts the column over, and pays for the rows before it once
more. The decoders live in a SliceDecoders: one per process and run (the run's UnitStore,
transforms/unit_store.py, holds it), at most MAX_DECODERS (the least recently used is
dropped), each closed once its row group is read to the end, all of them when the run ends.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa

KEEP_SLICES = 2
"""Rows passed on the way to a slice are kept while they are at most this many times its rows."""
MAX_DECODERS = 64
"""Open column decoders per SliceDecoders (each holds an open file, its read buffer and the rows it
decoded that no read has taken yet)."""


@dataclass
class Stats:
    decoded_rows: int = 0
    """Rows decoded, summed over columns."""
    restarts: int = 0
    """Column decoders started over for a read behind them."""
    dropped_rows: int = 0
    """Rows passed and not kept (summed over columns)."""


class _Column:
    """One column of one row group, decoded front to back on demand."""

    def __init__(self, rows: int, open_batches: Callable[[], Iterator[pa.RecordBatch]], count: Callable[..., None]):
        self.lock = threading.Lock()
        self._count = count
        self.rows = rows
        self._open = open_batches
        self._batches: Iterator[pa.RecordBatch] | None = None
        self._field: pa.Field | None = None
        self._metadata = None
        self._next = 0  # the first row the decoder has not yet decoded
        self._held: list[tuple[int, pa.Array]] = []  # decoded, not yet read: (first row, rows), in order

    @property
    def done(self) -> bool:
        return self._next >= self.rows and not self._held

    def read(self, start: int, stop: int) -> tuple[pa.Field, object, list[pa.Array]]:
        """(field, schema metadata, the arrays of rows [start, stop) in order)."""
        if not self._covered(start, min(stop, self._next)):
            if self._batches is not None:
                self._count(restarts=1)
            self.reset()
        if stop > self._next:
            held = sum(len(a) for _, a in self._held)
            keep = max(0, start - self._next) + held <= KEEP_SLICES * (stop - start)
            self._decode_to(stop, drop_before=None if keep else start)
        return self._field, self._metadata, self._take_held(start, stop)

    def _covered(self, start: int, stop: int) -> bool:
        """Whether the held arrays hold every row of [start, stop)."""
        have = sum(max(0, min(stop, first + len(a)) - max(start, first)) for first, a in self._held)
        return have == max(0, stop - start)

    def _take_held(self, start: int, stop: int) -> list[pa.Array]:
        """Rows [start, stop) out of the held arrays (held rows outside it stay held)."""
        if stop <= start:
            return []
        taken, kept = [], []
        for first, array in self._held:
            end = first + len(array)
            lo, hi = max(start, first), min(stop, end)
            if lo >= hi:
                kept.append((first, array))
                continue
            taken.append((lo, array.slice(lo - first, hi - lo)))
            if first < lo:
                kept.append((first, array.slice(0, lo - first)))
            if hi < end:
                kept.append((hi, array.slice(hi - first)))
        self._held = kept
        return [array for _, array in sorted(taken, key=lambda piece: piece[0])]

    def reset(self) -> None:
        """Start over at the row group's first row."""
        self._batches, self._next, self._held = None, 0, []

    def _decode_to(self, stop: int, drop_before: int | None) -> None:
        """Decode up to row `stop` (at least), holding what is decoded, less the rows before
        `drop_before`."""
        if self._batches is None:
            self._batches = self._open()
        while self._next < stop:
            batch = next(self._batches, None)
            if batch is None:
                raise ValueError(f"the row group ended after {self._next} rows, the footer says {self.rows}")
            if self._field is None:
                self._field, self._metadata = batch.schema.field(0), batch.schema.metadata
            self._count(decoded_rows=batch.num_rows)
            first, array = self._next, batch.column(0)
            self._next += batch.num_rows
            if drop_before is not None and first < drop_before:
                cut = min(drop_before - first, len(array))
                self._count(dropped_rows=cut)
                first, array = first + cut, array.slice(cut)
            if len(array):
                self._held.append((first, array))


class SliceDecoders:
    """The open column decoders of sliced row groups, and what they decoded (`stats`);
    thread-safe. One per process and run: the run's UnitStore holds it, so the prefetch, the
    read step, the read-ahead and the write step of an in-process run continue each other's
    decoders, and `clear` (the store's close) drops them at the end of the run."""

    def __init__(self):
        self.stats = Stats()
        self._decoders: OrderedDict[tuple, _Column] = OrderedDict()
        self._lock = threading.Lock()
        self._stats_lock = threading.Lock()

    def _count(self, **added: int) -> None:
        with self._stats_lock:  # decoders of different columns count on several threads
            for name, value in added.items():
                setattr(self.stats, name, getattr(self.stats, name) + value)

    def _decoder(self, key: tuple, rows: int, open_batches: Callable[[], Iterator[pa.RecordBatch]]) -> _Column:
        with self._lock:
            found = self._decoders.pop(key, None) or _Column(rows, open_batches, self._count)
            self._decoders[key] = found  # the most recently used last
            while len(self._decoders) > MAX_DECODERS:
                self._decoders.popitem(last=False)
            return found

    def read(
        self, key: tuple, group_rows: int, start: int, stop: int, columns: list[str],
        open_column: Callable[[str], Iterator[pa.RecordBatch]],
    ) -> pa.Table:
        """Rows [start, stop) of a row group of `group_rows` rows, `columns` in that order: the
        table `read_row_group(...).slice(start, stop - start)` gives, one chunk per column.

        `key` names the row group as planned (file, fingerprint, row group); `open_column(name)`
        starts a decoder of one column from the row group's first row (record batches of that
        column alone)."""
        fields, arrays, metadata = [], [], None
        for name in columns:
            column = self._decoder((*key, name), group_rows, lambda name=name: open_column(name))
            with column.lock:
                try:
                    field, metadata, pieces = column.read(start, stop)
                except BaseException:
                    column.reset()  # a read that failed half-way: the next one starts the column over
                    raise
                if column.done:
                    with self._lock:
                        if self._decoders.get((*key, name)) is column:
                            del self._decoders[(*key, name)]
            fields.append(field)
            arrays.append(pa.concat_arrays(pieces) if len(pieces) != 1 else pieces[0])
        return pa.Table.from_arrays(arrays, schema=pa.schema(fields, metadata=metadata))

    def open(self) -> int:
        """Column decoders open now."""
        with self._lock:
            return len(self._decoders)

    def clear(self) -> None:
        """Close every decoder (the end of a run)."""
        with self._lock:
            self._decoders.clear()
