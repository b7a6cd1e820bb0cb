"""The incremental output's Delta Lake table: the bookkeeping its commits carry, and the commit.

    OUTPUT/                        a Delta Lake table: the current scored rows
      _delta_log/                  its transaction log; every Rescore commit carries the run's
                                   bookkeeping (STATE_KEY: input files, their fingerprints and
                                   batches, the runs, rows per batch)
      part-*.parquet               data files (written by delta-rs, referenced by the log)

`load_state` reads the bookkeeping of the latest Rescore commit (checked entry by entry, and the
table's rows against its record); `commit` replaces the touched batches' rows and records the new
bookkeeping in ONE commit made against the version the run started from, never retried, so a
concurrent commit makes it fail cleanly (ConflictError). A column's type only widens
(schemas/widening.py). No Beam: the readers (`rescore show`, `load_scored`) use it too.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import pyarrow as pa

from rescore.errors import ConflictError, InputError, NotFinishedOutputError, SchemaError, first_line
from rescore.transforms.files import storage
from rescore.transforms.files.layout import DELTA_LOG

STATE_KEY = "rescore.state"
STATE_VERSION = 2
LEGACY_MANIFEST = "_manifest.json"


def table_uri(output: str) -> str:
    return os.path.abspath(output) if storage.is_local(output) else output.rstrip("/")


def options_for(output: str, storage_options: dict | None) -> dict | None:
    """`storage_options` as given, else those the environment gives (transforms/files/store_options.py)."""
    if storage_options is not None or storage.is_local(output):
        return storage_options
    from rescore.transforms.files.store_options import delta_options

    return delta_options(output)


# --- opening the table ------------------------------------------------------------------------


def local_files(path: str, dt) -> list[str] | None:
    """The data files of table `dt` (at `path`) as local paths, for pyarrow to read; None where
    delta-rs must read the table itself (an object store, deletion vectors, column mapping,
    partitions)."""
    protocol = dt.protocol()
    if not storage.is_local(path) or protocol.reader_features or dt.metadata().partition_columns:
        return None
    # delta-rs gives local files as URL paths: percent-encoded (`my%20table`, `t%231`)
    return [unquote(u[len("file://"):] if u.startswith("file://") else u) for u in dt.file_uris()]


PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def check_table_path(path: str, error: type[Exception] = NotFinishedOutputError) -> None:
    """Refuse, in one line, a local table path that delta-rs cannot open: one holding a percent
    escape (`%41`), which delta-rs decodes when it reads the table back (it would write the
    table, then read `tA`). Spaces, '#', '%' not followed by two hex digits and any other
    Unicode work. Checked on the absolute and the real path (delta-rs resolves symlinks).
    In a bucket (gs://, s3://) delta-rs takes the path as a URL: a '#' or '?' in it starts the
    URL's fragment or query, so the table would be written at the path cut there, outside the
    output (s3://b/day #2 -> s3://b/day ); refused as well. Spaces and other Unicode work."""
    if not storage.is_local(path):
        odd = next((ch for ch in ("#", "?") if ch in path.split("://", 1)[-1]), None)
        m = PERCENT_ESCAPE.search(path)
        if odd or m:
            said = f"{odd!r}, which delta-rs reads as the start of a URL's {'fragment' if odd == '#' else 'query'} " \
                   "(it would write the table at the path cut there)" if odd else \
                   f"a percent escape ({m.group(0)!r}), which delta-rs decodes when it reads the table"
            raise error(f"{path}: a Delta table's path in a bucket cannot hold {said}; pick a path without "
                        "'#', '?' or '%' followed by two hex digits")
        return
    for spelt in {os.path.abspath(path), os.path.realpath(path)}:
        m = PERCENT_ESCAPE.search(spelt)
        if m:
            raise error(
                f"{path}: a Delta table's path cannot hold a percent escape ({m.group(0)!r} in {spelt}): delta-rs, "
                "the Delta Lake library, decodes it when it reads the table; pick a path without '%' followed by "
                "two hex digits"
            )


def open_table(path: str, *, version: int | None = None, storage_options: dict | None = None,
               error: type[Exception] = NotFinishedOutputError):
    """delta-rs's DeltaTable of the table at `path`, or `error` with one line: a path delta-rs
    cannot open (check_table_path), a missing, truncated or malformed `_delta_log` commit, a
    version that is gone, a checkpoint that cannot be read."""
    from deltalake import DeltaTable

    check_table_path(path, error)
    try:
        return DeltaTable(table_uri(path), version=version, storage_options=options_for(path, storage_options))
    except Exception as e:  # noqa: BLE001  (delta-rs raises DeltaError, its subclasses, OSError, ValueError...)
        raise error(f"{path}: the Delta table cannot be read ({first_line(e)}); its _delta_log is damaged or "
                    "incomplete") from None


def _open(output: str, *, version: int | None = None, storage_options: dict | None = None):
    """open_table for a run: a table it cannot read is InputError (exit 2, one line)."""
    return open_table(output, version=version, storage_options=storage_options, error=InputError)


def is_table(output: str, storage_options: dict | None = None) -> bool:
    if storage.is_local(output):
        return os.path.isdir(os.path.join(output, DELTA_LOG))
    from deltalake import DeltaTable  # object stores have no directories to look for

    try:
        return DeltaTable.is_deltatable(table_uri(output), storage_options=options_for(output, storage_options))
    except Exception as e:  # noqa: BLE001  (delta-rs raises OSError, DeltaError... for a store it cannot reach)
        raise InputError(f"{output}: cannot be reached ({first_line(e)})") from None


# --- the committed state --------------------------------------------------------------------


@dataclass
class State:
    version: int | None = None
    """the table version this state was read at (None: no table yet)"""
    config_hash: str | None = None
    strategy: str | None = None
    inputs: list[str] = field(default_factory=list)
    files: dict[str, dict] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)
    rows: list[list[int]] | None = None
    """rows per batch in the table after this commit, as [first batch, last batch, rows] runs
    (_count_ranges; None: a table of an earlier Rescore)"""
    latest: bool = False
    """the state is the latest commit's (no other writer committed after it)"""

    def document(self) -> dict:
        doc = {
            "version": STATE_VERSION,
            "config_hash": self.config_hash,
            "strategy": self.strategy,
            "inputs": self.inputs,
            "files": dict(sorted(self.files.items())),
            "runs": self.runs,
        }
        if self.rows is not None:
            doc["rows"] = self.rows
        return doc

    def total_rows(self) -> int | None:
        return None if self.rows is None else sum((hi - lo + 1) * n for lo, hi, n in self.rows)


def _count_ranges(counts: dict[int, int]) -> list[list[int]]:
    """{batch: rows} as [first, last, rows] runs of consecutive batches with equal rows."""
    out: list[list[int]] = []
    for b in sorted(counts):
        n = counts[b]
        if not n:
            continue
        if out and out[-1][1] == b - 1 and out[-1][2] == n:
            out[-1][1] = b
        else:
            out.append([b, b, n])
    return out


def batch_counts(column) -> dict[int, int]:
    """{batch: rows} of a `batch` column (nulls left out: they are never committed)."""
    import pyarrow.compute as pc

    counts = pc.value_counts(column.drop_null()) if len(column) else []
    return {int(v["values"].as_py()): int(v["counts"].as_py()) for v in counts}


def _bad_state(where: str, why: str) -> InputError:
    return InputError(f"{where}: malformed Rescore bookkeeping ({why}); start a new --output, or move this one away")


def parse_state(doc: Any, where: str) -> State:
    """The bookkeeping of a commit, every entry checked (a malformed one is a one-line exit 2)."""
    if not isinstance(doc, dict) or doc.get("version") != STATE_VERSION:
        raise _bad_state(where, f"version {doc.get('version') if isinstance(doc, dict) else doc!r}, expected {STATE_VERSION}")
    files = doc.get("files")
    if not isinstance(files, dict):
        raise _bad_state(where, "'files' is not a mapping")
    for key, entry in files.items():
        ok = (
            isinstance(entry, dict)
            and isinstance(entry.get("size"), int)
            and isinstance(entry.get("mtime"), (int, float))
            and isinstance(entry.get("footer"), str)
            and isinstance(entry.get("run"), str)
            and isinstance(entry.get("batches"), list)
            and all(
                isinstance(r, list) and len(r) == 2 and all(isinstance(v, int) and not isinstance(v, bool) for v in r)
                and r[0] <= r[1]
                for r in entry["batches"]
            )
        )
        if not ok:
            raise _bad_state(where, f"entry for {key!r} is not {{size, mtime, footer, run, batches}}")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not all(isinstance(r, dict) and isinstance(r.get("run"), str) for r in runs):
        raise _bad_state(where, "'runs' is not a list of runs")
    inputs = doc.get("inputs", [])
    if not isinstance(inputs, list) or not all(isinstance(i, str) for i in inputs):
        raise _bad_state(where, "'inputs' is not a list of patterns")
    rows = doc.get("rows")
    counts: list[list[int]] | None = None
    if rows is not None:
        ok = isinstance(rows, list) and all(
            isinstance(r, list) and len(r) == 3 and all(isinstance(v, int) and not isinstance(v, bool) for v in r)
            and r[0] <= r[1] and r[2] > 0
            for r in rows
        ) and all(a[1] < b[0] for a, b in zip(rows, rows[1:]))
        if not ok:
            raise _bad_state(where, "'rows' is not a sorted list of [first batch, last batch, rows]")
        counts = [list(r) for r in rows]
    return State(None, doc.get("config_hash"), doc.get("strategy"), inputs, dict(files), list(runs), counts)


def load_state(output: str, *, storage_options: dict | None = None) -> State:
    """The bookkeeping of the table's latest Rescore commit (an empty State without a table)."""
    if storage.exists(storage.join(output, LEGACY_MANIFEST)):
        raise InputError(
            f"{output} holds an incremental output of an earlier Rescore (_manifest.json, run=*/ directories); "
            "incremental runs now write a Delta Lake table: start a new --output"
        )
    if not is_table(output, storage_options):
        return State()
    dt = _open(output, storage_options=storage_options)
    state = state_of(output, dt)
    try:
        actions = pa.table(dt.get_add_actions(flatten=True))
        records = actions["num_records"].to_pylist() if "num_records" in actions.column_names else None
    except Exception:  # noqa: BLE001  (no statistics to check against: the readers count the rows)
        records = None
    if records is not None and all(isinstance(n, int) for n in records):
        problem = verify_rows(output, state, total=sum(records))
        if problem:
            raise InputError(problem)
    return state


def state_of(output: str, dt, *, required: bool = True) -> State:
    """The bookkeeping of the latest Rescore commit up to `dt`'s version (an empty State, when
    not `required`, for a table Rescore did not write)."""
    version = dt.version()
    for commit in commits(output, dt):
        text = commit.get(STATE_KEY)
        if text is None:
            continue
        where = f"{output} (table version {commit.get('version', version)})"
        try:
            doc = json.loads(text) if isinstance(text, str) else text
        except ValueError as e:
            raise _bad_state(where, f"not JSON: {e}") from None
        state = parse_state(doc, where)
        state.version = version
        state.latest = commit.get("version", version) == version
        return state
    if not required:
        return State(version)
    raise InputError(f"{output} is a Delta table that Rescore did not write (no {STATE_KEY} in its commits); pick another --output")


def commits(output: str, dt) -> Any:
    """The table's commit infos, newest first, each with its `version`. Local tables: read from
    `_delta_log/*.json` (delta-rs `history()` returns none for a path holding `#`)."""
    if not storage.is_local(output):
        yield from dt.history()
        return
    log_dir = os.path.join(table_uri(output), DELTA_LOG)
    for v in range(dt.version(), -1, -1):
        name = os.path.join(log_dir, f"{v:020d}.json")
        try:
            with open(name, "rb") as f:
                lines = f.read().split(b"\n")
        except FileNotFoundError:  # removed after a checkpoint: no commit info left
            return
        except OSError as e:
            raise InputError(f"{name}: cannot be read ({e.strerror or e}); the table's _delta_log is damaged") from None
        for line in lines:
            if not line.strip():
                continue
            try:
                action = json.loads(line)
            except ValueError as e:  # delta-rs read past it: never guess what the commit held
                raise InputError(f"{name}: a line is not JSON ({first_line(e)}); the table's _delta_log is damaged: "
                                 "restore it, or rescore into a new --output") from None
            if isinstance(action, dict) and isinstance(action.get("commitInfo"), dict):
                yield {**action["commitInfo"], "version": v}
                break


def verify_rows(where: str, state: State, counts: dict[int, int] | None = None, total: int | None = None) -> str | None:
    """Why the table's rows (per batch, or only their total) differ from what its latest Rescore
    commit recorded; None when they agree, or when there is nothing to check against (a table
    of an earlier Rescore, or a commit of another writer after Rescore's)."""
    if state.rows is None or not state.latest:
        return None
    if counts is not None:
        have = _count_ranges(counts)
        if have != state.rows:
            recorded = {b: n for lo, hi, n in state.rows for b in range(lo, min(hi, lo + 100_000) + 1)}
            diff = next(((b, counts.get(b, 0), recorded.get(b, 0)) for b in sorted(set(counts) | set(recorded))
                         if counts.get(b, 0) != recorded.get(b, 0)), None)
            detail = f"batch {diff[0]}: {diff[1]:,} rows, recorded {diff[2]:,}" if diff else "rows per batch differ"
            return (f"{where}: the table's rows differ from its last Rescore commit's record ({detail}); its _delta_log "
                    "is damaged (a commit edited, or a file brought back or lost): restore it, or rescore into a new "
                    "--output")
    if total is not None and total != state.total_rows():
        return (f"{where}: the table's files hold {total:,} rows, its last Rescore commit recorded {state.total_rows():,}; "
                "its _delta_log is damaged (a commit edited, or a file brought back or lost): restore it, or rescore "
                "into a new --output")
    return None


# --- the commit: column types only widen (schemas/widening.py) ------------------------------


def _predicate(batches: set[int]) -> str:
    return "batch IN (" + ", ".join(str(b) for b in sorted(batches)) + ")"


def table_schema(output: str, storage_options: dict | None = None) -> pa.Schema | None:
    """The Arrow schema of the table's latest version (None without a table)."""
    if not is_table(output, storage_options):
        return None
    return pa.schema(_open(output, storage_options=storage_options).schema().to_arrow())


def check_table_types(output: str, schemas: list[tuple[str, pa.Schema]], *, storage_options: dict | None = None) -> None:
    """Before any work: every column of every input file (path, schema) that the table also
    holds has a type the table's type widens with (schemas/widening.py); else SchemaError (exit 2)
    naming the file, the column, its type and the table's. Score columns are the run's own, not
    checked."""
    from rescore.schemas.experience import REJECT_REASON, SCORE_COLUMNS
    from rescore.schemas.widening import describe, widen

    have = table_schema(output, storage_options)
    if have is None:
        return
    own = {*SCORE_COLUMNS, REJECT_REASON}
    for path, schema in schemas:
        for f in schema:
            if f.name in own or f.name not in have.names:
                continue
            t = have.field(f.name).type
            if widen(t, f.type) is None:
                raise SchemaError(
                    f"{path}: column {f.name!r} is {describe(f.type)}, but the table {output} stores it as {describe(t)}, "
                    "and neither widens to the other (a column's type may only widen: int -> float, int32 -> int64, "
                    f"list<int32> -> list<int64>, ...); write it as {describe(t)}, or pass --overwrite to rescore every "
                    "batch with the new type, or use another --output"
                )


def commit_schema(have: pa.Schema | None, rows: pa.Schema) -> tuple[pa.Schema, bool]:
    """The schema a commit writes, and whether the table's own columns must widen: the table's
    columns (widened where this run's rows are wider) then this run's new ones, each in a type
    Delta stores without loss. A change that cannot widen raises SchemaError (checked before
    the work by check_table_types; here for what the run itself adds)."""
    from rescore.schemas.widening import storable_schema, widen_schemas

    rows = storable_schema(rows)
    if have is None:
        return rows, False
    try:
        target = storable_schema(widen_schemas([("the table", have), ("this run's rows", rows)]))
    except SchemaError as e:
        raise SchemaError(f"cannot commit to the table: {e}") from None
    target = pa.schema([f.with_nullable(True) for f in target])
    widened = any(target.field(f.name).type != f.type for f in have)
    return target, widened


def _converted(reader: pa.RecordBatchReader, schema: pa.Schema) -> pa.RecordBatchReader:
    """`reader`'s batches with exactly `schema` (columns widened, missing ones null)."""
    from rescore.schemas.widening import cast_table

    def batches():
        for rb in reader:
            for out in cast_table(pa.Table.from_batches([rb]), schema).to_batches():
                yield out

    return pa.RecordBatchReader.from_batches(schema, batches())


def _kept_rows(output: str, version: int, touched: set[int], schema: pa.Schema,
               storage_options: dict | None = None) -> pa.RecordBatchReader:
    """The rows of table version `version` outside the touched batches, converted to `schema`
    (a commit that widens a column rewrites them with the new type)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    dt = _open(output, version=version, storage_options=storage_options)
    have = pa.schema(dt.schema().to_arrow())
    files = local_files(output, dt)
    data = pads.dataset(files, schema=have, format="parquet") if files is not None else dt.to_pyarrow_dataset()
    keep = pa.array(sorted(touched), pa.int64())
    where = ~pc.field("batch").isin(keep) if touched else None
    columns = [n for n in schema.names if n in have.names]
    return _converted(data.scanner(columns=columns, filter=where, batch_size=65536).to_reader(), schema)


def commit(output: str, state: State, new_state: State, touched: set[int], data, *, rebuild: bool,
           storage_options: dict | None = None) -> int:
    """Replace the touched batches' rows by `data` and record `new_state`, in one Delta commit
    against the version `state` was read at (never retried). Returns the new table version."""
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError, DeltaError

    props = CommitProperties(custom_metadata={STATE_KEY: json.dumps(new_state.document(), separators=(",", ":"))},
                             max_commit_retries=0)
    uri = table_uri(output)
    storage_options = options_for(output, storage_options)
    have = None if state.version is None or rebuild else pa.schema(
        _open(output, version=state.version, storage_options=storage_options).schema().to_arrow())
    schema, widened = commit_schema(have, data.schema)
    data = _converted(data, schema)
    try:
        if state.version is None:
            write_deltalake(uri, data, mode="error", commit_properties=props, storage_options=storage_options)
        else:
            dt = _open(output, version=state.version, storage_options=storage_options)
            if widened:  # a column widens: every row is rewritten with its new type, in this one commit
                kept = _kept_rows(output, state.version, touched, schema, storage_options)
                both = pa.RecordBatchReader.from_batches(schema, (b for r in (kept, data) for b in r))
                write_deltalake(dt, both, mode="overwrite", schema_mode="overwrite", commit_properties=props)
            elif rebuild:
                write_deltalake(dt, data, mode="overwrite", schema_mode="overwrite", commit_properties=props)
            elif not touched:  # files without rows of any batch: only the bookkeeping changes
                write_deltalake(dt, data, mode="append", schema_mode="merge", commit_properties=props)
            else:
                write_deltalake(dt, data, mode="overwrite", predicate=_predicate(touched), schema_mode="merge",
                                commit_properties=props)
    except CommitFailedError as e:
        raise ConflictError(
            f"another run committed to {output} while this one ran (table version {state.version} is no longer "
            f"the latest); this run published nothing: run it again ({first_line(e)})"
        ) from None
    except DeltaError as e:
        if state.version is None and "exist" in str(e).lower():
            raise ConflictError(f"another run created the table {output} while this one ran; this run published nothing: run it again") from None
        raise
    return _open(output, storage_options=storage_options).version()


def rows_after(output: str, state: State, scored: list[str], touched: set[int], rebuild: bool,
               storage_options: dict | None = None) -> list[list[int]]:
    """Rows per batch the table holds after a commit that replaces the `touched` batches by the
    rows of the `scored` files (recorded in the commit, and checked by every reader: a damaged
    `_delta_log` that brings back or loses a file is then an error, not wrong rows): those rows
    and the table's other batches as they were (from the last commit's record, or counted once
    in a table of an earlier Rescore)."""
    import pyarrow.compute as pc

    counts: dict[int, int] = {}
    if not rebuild and state.version is not None:
        if state.rows is not None:
            counts = {b: n for lo, hi, n in state.rows for b in range(lo, hi + 1)}
        else:
            batch = pa.schema([("batch", pa.int64())])
            counts = batch_counts(pa.chunked_array([rb.column(0) for rb in _kept_rows(output, state.version, set(), batch,
                                                                                       storage_options)], pa.int64()))
        counts = {b: n for b, n in counts.items() if b not in touched}
    keep = pa.array(sorted(touched), pa.int64())
    for path in scored:
        column = storage.open_parquet(path).read(columns=["batch"])["batch"]
        for b, n in batch_counts(column.filter(pc.is_in(column, value_set=keep))).items():
            counts[b] = counts.get(b, 0) + n
    return _count_ranges(counts)
