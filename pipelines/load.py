"""One way to read any Rescore output: `load_scored(path)` -> the current scored rows.

    from pipelines.load import load_scored
    table = load_scored("out")          # a pyarrow.Table

`path` is either a one-shot output directory (`scored-*.parquet` + `_SUCCESS`) or the Delta
Lake table that `rescore --incremental` keeps. A directory without `_SUCCESS` (a run in
progress or failed) is refused rather than read half-written.
"""

from __future__ import annotations

import pyarrow as pa

from transforms import storage
from transforms.write import SUCCESS

__all__ = ["load_scored", "OutputError", "kind_of"]


class OutputError(ValueError):
    """`path` is not a finished Rescore output (one-line message)."""


def kind_of(path: str) -> str:
    """'table' (incremental Delta table), 'oneshot' (finished one-shot run), or raises OutputError."""
    from pipelines import incremental

    if incremental.is_table(path):
        return "table"
    if storage.exists(storage.join(path, SUCCESS)):
        return "oneshot"
    if storage.exists(storage.join(path, incremental.LEGACY_MANIFEST)):
        raise OutputError(
            f"{path} is an incremental output of an earlier Rescore (_manifest.json); read each run=*/ with _SUCCESS, "
            "or rescore into a new --output"
        )
    if not storage.exists(path):
        raise OutputError(f"{path} does not exist")
    raise OutputError(f"{path} is not a finished Rescore output (no _SUCCESS, no Delta table)")


def load_scored(path: str, *, columns: list[str] | None = None, storage_options: dict | None = None) -> pa.Table:
    """The current scored rows of a Rescore output as a pyarrow.Table.

    One-shot directory: every `scored-*.parquet`, in file-name order. Incremental table: the
    table's latest version (a commit replaces rescored batches atomically, so this is never a
    mix of two versions). `columns` selects columns; `storage_options` go to delta-rs for
    object stores (credentials, endpoints).
    """
    if kind_of(path) == "table":
        from deltalake import DeltaTable

        from pipelines.incremental import table_uri

        dt = DeltaTable(table_uri(path), storage_options=storage_options)
        return dt.to_pyarrow_dataset().to_table(columns=columns)
    files = sorted(storage.list_dir(path, "scored-*.parquet"))
    tables = [storage.open_parquet(f).read(columns=columns) for f in files]
    if not tables:
        return _empty(columns)
    return pa.concat_tables(tables, promote_options="default")


def _empty(columns: list[str] | None) -> pa.Table:
    """A finished run that wrote no scored row (every group filtered, say): an empty table, with
    only the id columns, since there is no file to take the full schema from."""
    schema = pa.schema([("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64()), ("step", pa.int64())])
    table = schema.empty_table()
    return table.select([c for c in columns if c in schema.names]) if columns else table
