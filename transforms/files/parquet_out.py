"""How an output file is encoded: polars' Parquet writer (zstd level 1, columns encoded in
parallel) wherever it writes the table's schema exactly as pyarrow would; pyarrow's writer,
with the options Rescore used before, otherwise.

Why polars: pyarrow encodes a file on one thread and dictionary-encodes every column, which
cost ~1.4 CPU-s per 49,152-row scored file of the benchmark (most of it the token column's
dictionary); polars writes the same table, zero-copy from Arrow, in ~0.45 CPU-s, and zstd level 1
makes the file ~3 % smaller than pyarrow's snappy + dictionary.

What stays the same: the values; the Parquet schema (column paths, types, repetition); the Arrow
schema readers see (pyarrow's own `ARROW:schema` footer entry, so field types, nullability and
field metadata read back as before); the file-level key-value metadata (rescore.*); one row group
per file (up to pyarrow's default cap of 1,048,576 rows). Whether polars qualifies is decided once
per schema: every column's type must be one whose values polars is known to write exactly
(integers, float32/64, booleans, strings, binary, dates, timestamps, and lists and structs of
those), and an empty table written both ways must give the same Parquet schema and the same
Arrow schema read back. Anything else (a non-nullable field, a map, a decimal, a fixed-size list,
a dictionary column, ...) keeps the whole file on pyarrow. Both writers are deterministic: the same table gives the same bytes on every
run and with any number of threads.
"""

from __future__ import annotations

import io
import os
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from rescore.transforms.files import storage

ZSTD_LEVEL = 1
MAX_ROW_GROUP_ROWS = 1 << 20
"""pyarrow's default cap on rows per row group; both writers cut row groups there."""
ARROW_SCHEMA_KEY = "ARROW:schema"


@dataclass(frozen=True)
class Encoding:
    """How files of one schema are written."""

    metadata: dict[str, str] | None
    """polars: the footer's key-value metadata (pyarrow's ARROW:schema and the schema's own
    entries); None: polars cannot write this schema exactly, pyarrow writes it."""
    use_dictionary: bool | list[str] = True
    """pyarrow only: the columns it dictionary-encodes."""

    @property
    def writer(self) -> str:
        return "pyarrow" if self.metadata is None else "polars"


_encodings: dict[tuple[bytes, tuple[str, ...]], Encoding] = {}
_lock = threading.Lock()


def encoding_for(schema: pa.Schema, plain: tuple[str, ...] = ()) -> Encoding:
    """The Encoding of `schema` (memoised per schema). `plain`: top-level columns pyarrow writes
    without a dictionary (polars dictionary-encodes no numeric column in any case)."""
    key = (schema.serialize().to_pybytes(), tuple(plain))
    with _lock:
        found = _encodings.get(key)
    if found is None:
        found = _decide(schema, tuple(plain))
        with _lock:
            _encodings[key] = found
    return found


def _footer(data: bytes) -> pq.ParquetFile:
    return pq.ParquetFile(pa.BufferReader(data))


def _plain_type(t: pa.DataType) -> bool:
    """Types whose values polars writes exactly as pyarrow does (checked value by value in
    tests/files/test_files_parquet_out.py). An empty table cannot show how values are written, so
    every other type (decimals, fixed-size lists, maps, dictionaries, ...) stays on pyarrow."""
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _plain_type(t.value_type)
    if pa.types.is_struct(t):
        return all(_plain_type(t.field(i).type) for i in range(t.num_fields))
    return (
        pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t) or pa.types.is_boolean(t)
        or pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)
        or pa.types.is_date32(t) or pa.types.is_timestamp(t)
    )


def _decide(schema: pa.Schema, plain: tuple[str, ...]) -> Encoding:
    empty = schema.empty_table()
    sink = pa.BufferOutputStream()
    pq.write_table(empty, sink)
    expected = _footer(sink.getvalue().to_pybytes())
    use_dictionary = storage.dictionary_columns(schema, plain) if plain else True
    metadata = {k.decode(): v.decode() for k, v in (expected.metadata.metadata or {}).items()}
    if not all(_plain_type(field.type) for field in schema):
        return Encoding(None, use_dictionary)
    try:
        buffer = io.BytesIO()
        _polars_write(empty, buffer, metadata)
        written = _footer(buffer.getvalue())
        # Compared with pyarrow's own file read back (not `schema`: pyarrow reads a list's child
        # as "element" whatever it was called in memory).
        exact = written.schema.equals(expected.schema) and written.schema_arrow.equals(expected.schema_arrow, check_metadata=True)
    except Exception:  # noqa: BLE001  (a type polars cannot take: pyarrow writes this schema)
        exact = False
    return Encoding(metadata if exact else None, use_dictionary)


def _polars_write(table: pa.Table, sink, metadata: dict[str, str]) -> None:
    import polars as pl  # only where a file is written: start-up stays free of it

    # rechunk=False: the frame shares the table's buffers (a rechunk would copy every column).
    frame = pl.from_arrow(table, rechunk=False)
    frame.write_parquet(
        sink, compression="zstd", compression_level=ZSTD_LEVEL, statistics=True,
        row_group_size=max(1, min(table.num_rows, MAX_ROW_GROUP_ROWS)), metadata=metadata,
    )


def write_table(table: pa.Table, path: str, *, plain: tuple[str, ...] = ()) -> str:
    """Write `table` to `path` in one go (callers write to a staging name, then rename); returns
    the writer used ("polars" or "pyarrow")."""
    encoding = encoding_for(table.schema, plain)
    local = storage.is_local(path)
    if local:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    if encoding.metadata is not None:
        if local:
            _polars_write(table, path, encoding.metadata)
        else:
            with storage.create(path) as f:
                _polars_write(table, f, encoding.metadata)
    else:
        storage.write_parquet(table, path, use_dictionary=encoding.use_dictionary)
    return encoding.writer
