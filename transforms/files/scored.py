"""One way to read any Rescore output: `load_scored(path)` -> the current scored rows.

    import rescore
    table = rescore.load_scored("out")  # a pyarrow.Table

(`rescore.load_scored` and `rescore.pipelines.load` hand on the names of this module, which
sits below both: a reader of outputs needs the file layer, never the launcher.)

`path` is either a one-shot output directory (`scored-*.parquet` + `_SUCCESS`) or the Delta
Lake table that `rescore --incremental` keeps. A directory without `_SUCCESS` (a run in
progress or failed) is refused rather than read half-written.

`path` may be on an object store (`gs://`, `s3://`): the one-shot files are read through
Beam's filesystems, a table through delta-rs, both with the settings the environment gives
Beam (STORAGE_EMULATOR_HOST, AWS_ENDPOINT_URL, credentials; transforms/files/store_options.py).

This module imports neither Beam nor torch (training code imports it), and reads a local
Delta table's files with pyarrow itself: delta-rs gives the list of files of the latest
version, pyarrow reads them. (Reading through delta-rs's own pyarrow file system in a process
that has imported torch can abort the interpreter at exit.)
"""

from __future__ import annotations

import glob
import os

import pyarrow as pa
import pyarrow.parquet  # noqa: F401  (pa.parquet)

from rescore.errors import NotFinishedOutputError, first_line
from rescore.transforms.files.delta_table import (
    LEGACY_MANIFEST,
    batch_counts,
    check_table_path,
    local_files,
    open_table,
    state_of,
    verify_rows,
)
from rescore.transforms.files.layout import DELTA_LOG, SCORED_FILES, SUCCESS

OutputError = NotFinishedOutputError
"""The name users catch (`from rescore.pipelines.load import OutputError`, `rescore.errors.NotFinishedOutputError`)."""

__all__ = ["load_scored", "OutputError", "kind_of", "open_table", "check_table_path", "input_files"]

def _local(path: str) -> bool:
    return "://" not in path


def _exists(path: str) -> bool:
    if _local(path):
        return os.path.exists(path)
    from rescore.transforms.files import storage

    return storage.exists(path)


def _holds_objects(path: str) -> bool:
    """An object store's "directory" exists where an object's name starts with it."""
    from rescore.transforms.files import storage

    return bool(storage.child_names(path)) or storage.exists(path)


def _join(base: str, name: str) -> str:
    return os.path.join(base, name) if _local(base) else base.rstrip("/") + "/" + name


def kind_of(path: str, storage_options: dict | None = None) -> str:
    """'table' (incremental Delta table), 'oneshot' (finished one-shot run), or raises OutputError."""
    if _local(path):
        if os.path.isdir(os.path.join(path, DELTA_LOG)):
            return "table"
    else:
        from deltalake import DeltaTable

        from rescore.transforms.files.delta_table import options_for

        try:
            if DeltaTable.is_deltatable(path.rstrip("/"), storage_options=options_for(path, storage_options)):
                return "table"
        except Exception as e:  # noqa: BLE001  (delta-rs raises OSError, DeltaError... for a store it cannot reach)
            raise OutputError(f"{path}: cannot be reached ({first_line(e)})") from None
    if _exists(_join(path, SUCCESS)):
        return "oneshot"
    if _exists(_join(path, LEGACY_MANIFEST)):
        raise OutputError(
            f"{path} is an incremental output of an earlier Rescore (_manifest.json); read each run=*/ with _SUCCESS, "
            "or rescore into a new --output"
        )
    if not (_exists(path) if _local(path) else _holds_objects(path)):
        raise OutputError(f"{path} does not exist")
    raise OutputError(f"{path} is not a finished Rescore output (no _SUCCESS, no Delta table)")


def load_scored(path: str, *, columns: list[str] | None = None, storage_options: dict | None = None) -> pa.Table:
    """The current scored rows of a Rescore output as a pyarrow.Table.

    One-shot directory: every `scored-*.parquet`, in file-name order. Incremental table: the
    table's latest version (a commit replaces rescored batches atomically, so this is never a
    mix of two versions). `columns` selects columns; `storage_options` go to delta-rs for
    object stores (credentials, endpoints).
    """
    if kind_of(path, storage_options) == "table":
        return _read_table(path, columns, storage_options)
    if _local(path):
        files = sorted(glob.glob(os.path.join(glob.escape(path), SCORED_FILES)))
        tables = [pa.parquet.read_table(f, columns=columns) for f in files]
    else:
        from rescore.transforms.files import storage

        files = sorted(storage.list_dir(path, SCORED_FILES))
        tables = [storage.open_parquet(f).read(columns=columns) for f in files]
    if not tables:
        return _empty(columns)
    return pa.concat_tables(tables, promote_options="default")


def input_files(source: str) -> list[str]:
    """The Parquet files a source on an object store names, sorted: a finished Rescore output's
    current scored files (a Delta table's live files, a one-shot run's scored-*.parquet), a
    glob, one file, or a directory's *.parquet. OutputError for an unfinished output."""
    from rescore.transforms.files import storage

    if any(ch in source for ch in "*?["):
        return sorted(p for p, _ in storage.match(source))
    if storage.match(source):  # one object
        return [source]
    if kind_of_or_none(source) == "table":
        dt = open_table(source, error=OutputError)
        if dt.protocol().reader_features or dt.metadata().partition_columns:
            raise OutputError(f"{source}: a Delta table with reader features or partitions; read it with delta-rs first")
        return sorted(dt.file_uris())
    if _exists(_join(source, SUCCESS)):
        return sorted(storage.list_dir(source, SCORED_FILES))
    if storage.list_dir(source, SCORED_FILES):
        raise OutputError(f"{source} is not a finished Rescore output (no _SUCCESS, no Delta table)")
    return sorted(storage.list_dir(source, "*.parquet"))


def kind_of_or_none(path: str) -> str | None:
    try:
        return kind_of(path)
    except OutputError:
        return None


def _read_table(path: str, columns: list[str] | None, storage_options: dict | None) -> pa.Table:
    import pyarrow.dataset as pads

    dt = open_table(path, storage_options=storage_options, error=OutputError)
    read = None if columns is None or "batch" in columns else [*columns, "batch"]
    try:
        files = local_files(path, dt)
        if files is None:  # deletion vectors, column mapping, partitions or an object store: delta-rs reads it
            table = dt.to_pyarrow_dataset().to_table(columns=read or columns)
        else:
            schema = pa.schema(dt.schema().to_arrow())
            if not files:
                table = schema.empty_table().select(read or columns) if columns else schema.empty_table()
            else:
                table = pads.dataset(files, schema=schema, format="parquet").to_table(columns=read or columns)
    except (OSError, ValueError, pa.ArrowException, RuntimeError) as e:
        if isinstance(e, OutputError):
            raise
        raise OutputError(f"{path}: the Delta table's files cannot be read ({first_line(e)})") from None
    _check_rows(path, dt, table)
    return table.drop_columns(["batch"]) if read else table


def _check_rows(path: str, dt, table: pa.Table) -> None:
    """The rows read are those the table's latest Rescore commit recorded, batch by batch: a
    `_delta_log` damaged so that a replaced file is live again (or a live one is dropped) is an
    error, never rows published twice or lost."""
    from rescore.errors import InputError

    try:
        state = state_of(path, dt, required=False)
    except InputError as e:
        raise OutputError(str(e)) from None
    problem = verify_rows(path, state, counts=batch_counts(table["batch"]))
    if problem:
        raise OutputError(problem)




def _empty(columns: list[str] | None) -> pa.Table:
    """A finished run that wrote no scored row (every group filtered, say): an empty table, with
    only the id columns, since there is no file to take the full schema from."""
    schema = pa.schema([("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64()), ("step", pa.int64())])
    table = schema.empty_table()
    return table.select([c for c in columns if c in schema.names]) if columns else table
