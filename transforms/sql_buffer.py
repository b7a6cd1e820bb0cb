"""Trinity-RFT SQL experience buffers as a Beam source and sink.

A buffer named NAME (trinity/buffer/schema/sql_schema.py) is two tables:
    NAME       id, timestamp, task_id, run_id, msg_id, model_version, reward, consumed
    NAME_blob  id, experience_bytes (a TRXP blob, see transforms/rows/trinity_format.py)
Trinity's reader takes task, run, suffix (msg_id) and reward from NAME and everything else
(batch, step, tensors, texts) from the blob; so does this one.

Source (`StageBuffer`): the launcher reads only count/min/max of NAME's ids and cuts the id span
into ranges; each range is read, decoded and written as one Parquet file by a worker, so
workers read in parallel and the launcher reads no experience. The rest of the pipeline then
reads those files like any other input.

Sink (`write_buffer`): the scored Parquet rows are inserted by workers into a pair of staging
tables with ids fixed by file (file k starts after the rows of files 0..k-1), then one
transaction drops nothing but what --overwrite allows and renames the staging tables to NAME
and NAME_blob. A run killed before that leaves only `rescore_stage_HHHHHHHHHHHH_*` staging
tables (H: a hash of NAME, so the names fit PostgreSQL's 63 bytes whatever NAME is), which the
next run for NAME removes; NAME never holds half the rows.

SQL text: every table name goes through the dialect's identifier quoting and every value
through bind parameters; NAME itself is checked first (check_table_name: letters, digits and
underscores, at most TABLE_NAME_MAX characters), so nothing a user types is ever SQL.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import uuid
from dataclasses import dataclass
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from apache_beam.metrics import Metrics

from rescore.errors import ConfigError
from rescore.transforms import fault_injection
from rescore.transforms.files import storage
from rescore.transforms.files.layout import TABLE_NAME_MAX, table_name_problem  # noqa: F401
from rescore.transforms.rows import trinity_format as trxp

log = logging.getLogger(__name__)

STAGING_PREFIX = "rescore_stage_"
"""Staging tables: STAGING_PREFIX + 12 hex digits of sha256(NAME) + "_" + a run token (+ "_blob")."""
OLD_STAGING_INFIX = "__rescore_"
"""Staging tables of earlier versions, NAME + OLD_STAGING_INFIX + token: still removed."""
INSERT_ROWS = 256
"""Rows per INSERT round trip (blobs are tens of KB each)."""
STAGE_ROWS = 1024
"""Rows fetched, decoded and written as one Parquet row group at a time by the source."""

STAGED_SCHEMA = pa.schema(
    [
        pa.field("batch", pa.int64()),
        pa.field("task", pa.string()),
        pa.field("run", pa.int64()),
        pa.field("step", pa.int64()),
        pa.field("reward", pa.float64()),
        pa.field("tokens", pa.list_(pa.int64())),
        pa.field("prompt_length", pa.int64()),
        pa.field("logprobs", pa.list_(pa.float32())),
        pa.field("action_mask", pa.list_(pa.bool_())),
        pa.field("teacher_logprobs", pa.list_(pa.float32())),
        pa.field("sql_id", pa.int64()),
        pa.field("msg_id", pa.string()),
        pa.field("model_version", pa.int64()),
        pa.field("prompt_text", pa.string()),
        pa.field("response_text", pa.string()),
        pa.field("info", pa.string()),
        pa.field("trinity_blob", pa.binary()),
        pa.field("source_error", pa.string()),
    ]
)
"""The columns a buffer row becomes. `info` is the experience's info dict as JSON,
`trinity_blob` the original blob (the sink writes it back with new advantages, so every field
Rescore does not model, e.g. messages or multi-modal inputs, survives), `source_error` the
reason a row could not be decoded (the validation step rejects such rows with it)."""


# ---------------------------------------------------------------------------------------------
# Connections and tables
# ---------------------------------------------------------------------------------------------


def _sqlalchemy():
    try:
        import sqlalchemy
    except ImportError:  # pragma: no cover - a core dependency; a broken install
        raise ConfigError("SQL buffers need SQLAlchemy: pip install 'sqlalchemy>=2'") from None
    return sqlalchemy


def safe_url(url: str) -> str:
    """The URL with its password hidden (for messages and metrics.json)."""
    sa = _sqlalchemy()
    try:
        return sa.engine.make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001
        return url.split("@")[-1]


def engine(url: str, *, must_exist: bool = True):
    """An engine for `url`; ConfigError (one line) for a malformed URL, an unknown driver or a
    SQLite file that does not exist (SQLite would create an empty one)."""
    sa = _sqlalchemy()
    try:
        parsed = sa.engine.make_url(url)
    except Exception:  # noqa: BLE001  (ArgumentError and friends)
        raise ConfigError(f"{url!r} is not a database URL (e.g. sqlite:///buffer.db, postgresql://user@host/db)") from None
    if parsed.get_backend_name() == "sqlite":
        db = parsed.database
        if must_exist and db not in (None, "", ":memory:") and not os.path.exists(db):
            raise ConfigError(f"no SQLite database file {db} ({safe_url(url)})")
        if not must_exist and db not in (None, "", ":memory:") and not db.startswith("file:"):
            _check_sqlite_target(db, url)
            try:
                os.makedirs(os.path.dirname(os.path.abspath(db)), exist_ok=True)
            except OSError as e:
                raise ConfigError(f"cannot create the directory of {db} ({safe_url(url)}): {e.strerror or e}") from None
        kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}}
    else:
        kwargs = {"pool_pre_ping": True}
    parsed = parsed.set(drivername=_sync_driver(parsed.drivername))
    try:
        return sa.create_engine(parsed, **kwargs)
    except Exception as e:  # noqa: BLE001  (NoSuchModuleError, a driver not installed)
        hint = " (pip install 'psycopg[binary]')" if parsed.get_backend_name() == "postgresql" else ""
        raise ConfigError(f"cannot open {safe_url(url)}: {_line(e)}{hint}") from None


def _check_sqlite_target(db: str, url: str) -> None:
    """ConfigError (one line) where a SQLite file cannot be written at `db`: the path is a
    directory, a part of it is a file, or the nearest existing directory is not writable."""
    path = os.path.abspath(db)
    if os.path.isdir(path):
        raise ConfigError(f"{safe_url(url)}: {db} is a directory, not a SQLite database file")
    if os.path.exists(path):
        if not os.access(path, os.R_OK | os.W_OK):
            raise ConfigError(f"{safe_url(url)}: the SQLite database file {db} is not writable")
        return
    from rescore.transforms.files.ownership import creation_problem

    problem = creation_problem(path)
    if problem:
        raise ConfigError(f"{safe_url(url)}: {problem} (the SQLite database file {db} cannot be created)")


_ASYNC_DRIVERS = {"sqlite+aiosqlite": "sqlite", "mysql+aiomysql": "mysql+pymysql", "mysql+asyncmy": "mysql+pymysql"}


def _sync_driver(name: str) -> str:
    """The synchronous driver for a URL's driver name: Trinity configs name async drivers
    (postgresql+asyncpg, sqlite+aiosqlite) or none (postgresql://, which SQLAlchemy would map to
    psycopg2); PostgreSQL goes through psycopg 3, or psycopg2 where only that is installed."""
    import importlib.util

    if name in _ASYNC_DRIVERS:
        return _ASYNC_DRIVERS[name]
    if name in ("postgresql", "postgres", "postgresql+asyncpg", "postgresql+psycopg_async"):
        if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2"
        return "postgresql+psycopg"
    return name


def _line(e: BaseException) -> str:
    lines = [x for x in str(e).strip().splitlines() if x.strip()]
    return lines[0][:300] if lines else type(e).__name__


def tables(name: str, metadata=None):
    """(meta table, blob table) with Trinity's columns (ExperienceModel, BlobModel)."""
    sa = _sqlalchemy()
    md = metadata if metadata is not None else sa.MetaData()
    meta = sa.Table(
        name, md,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("timestamp", sa.DateTime, server_default=sa.func.now()),
        sa.Column("task_id", sa.String(64), nullable=True, index=True),
        sa.Column("run_id", sa.Integer, nullable=True, index=True),
        sa.Column("msg_id", sa.String(64), nullable=True, index=True),
        sa.Column("model_version", sa.Integer, nullable=True, index=True),
        sa.Column("reward", sa.Float, nullable=True, index=True),
        sa.Column("consumed", sa.Integer, default=0, index=True),
    )
    blob = sa.Table(
        f"{name}_blob", md,
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("experience_bytes", sa.LargeBinary, nullable=False),
    )
    return meta, blob


def _connect_check(eng, url: str):
    sa = _sqlalchemy()
    try:
        return sa.inspect(eng)
    except Exception as e:  # noqa: BLE001  (OperationalError: refused, auth, no such database)
        raise ConfigError(f"cannot connect to {safe_url(url)}: {_line(e)}") from None


# ---------------------------------------------------------------------------------------------
# Source
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourcePlan:
    url: str
    table: str
    rows: int
    ranges: tuple[tuple[int, int], ...]
    """[lo, hi) id ranges covering every id of the table."""


def plan_source(url: str, table: str, shard_rows: int) -> SourcePlan:
    """Check the buffer's tables and cut its ids into ranges of about `shard_rows` rows.

    Reads count(id), min(id), max(id) of NAME and nothing else."""
    sa = _sqlalchemy()
    eng = engine(url)
    try:
        inspector = _connect_check(eng, url)
        names = set(inspector.get_table_names())
        for needed in (table, f"{table}_blob"):
            if needed not in names:
                have = ", ".join(sorted(n for n in names if not n.endswith("_blob"))) or "none"
                raise ConfigError(f"no table {needed!r} in {safe_url(url)} (experience tables there: {have})")
        columns = {c["name"] for c in inspector.get_columns(table)}
        missing = [c for c in ("id", "task_id", "run_id", "msg_id", "model_version", "reward") if c not in columns]
        if missing:
            raise ConfigError(f"table {table!r} in {safe_url(url)} is not a Trinity experience buffer (no column {missing[0]!r})")
        meta, _ = tables(table)
        with eng.connect() as conn:
            count, lo, hi = conn.execute(sa.select(sa.func.count(meta.c.id), sa.func.min(meta.c.id), sa.func.max(meta.c.id))).one()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001
        raise ConfigError(f"cannot read table {table!r} in {safe_url(url)}: {_line(e)}") from None
    finally:
        eng.dispose()
    if not count:
        raise ConfigError(f"table {table!r} in {safe_url(url)} holds no experiences")
    return SourcePlan(url, table, int(count), tuple(id_ranges(int(lo), int(hi), int(count), shard_rows)))


def id_ranges(lo: int, hi: int, count: int, shard_rows: int) -> list[tuple[int, int]]:
    """[lo, hi] cut into ceil(count / shard_rows) half-open ranges of equal id span."""
    parts = max(1, math.ceil(count / shard_rows))
    span = hi - lo + 1
    bounds = [lo + (span * k) // parts for k in range(parts)] + [hi + 1]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


INT64 = (-(2**63), 2**63 - 1)


def _as_int(value, what: str, category: str = "bad_eid") -> int:
    if isinstance(value, bool):
        raise ValueError(f"{category}: {what} is {_short(value)}, not an integer")
    if isinstance(value, (int, np.integer)):
        number = int(value)
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        try:
            number = int(value)
        except ValueError:  # digits int() does not read ('²')
            raise ValueError(f"{category}: {what} is {_short(value)}, not an integer") from None
    else:
        raise ValueError(f"{category}: {what} is {_short(value)}, not an integer")
    if not INT64[0] <= number <= INT64[1]:
        raise ValueError(f"{category}: {what} {_short(number)} is beyond the int64 range")
    return number


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _plain(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return str(v)


def _json(value) -> str | None:
    if not value:
        return None
    return json.dumps(value, sort_keys=True, default=_plain)


def _text(value, what: str, category: str) -> str:
    """`value` as text that has a UTF-8 form (ValueError with the reason otherwise)."""
    text = value if isinstance(value, str) else str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{category}: {what} is not valid UTF-8 text") from None
    return text


def _meta_columns(meta_row: dict) -> tuple[dict[str, Any], str | None]:
    """NAME's columns of one row as STAGED_SCHEMA values, and the first reason one of them is
    unusable (SQLite stores whatever it is given: 'n/a' in `reward`, 'two' in `run_id`). An
    unusable value is left null in the row, so the rejected row can still be written."""
    out: dict[str, Any] = {"sql_id": None, "task": None, "run": None, "msg_id": None, "model_version": None, "reward": None}
    reason = None
    checks = (
        ("sql_id", "id", lambda v: _as_int(v, "id", "bad_id")),
        ("task", "task_id", lambda v: _id_text(v, "task_id", "bad_task")),
        ("run", "run_id", lambda v: _as_int(v, "run_id", "bad_run")),
        ("msg_id", "msg_id", lambda v: _id_text(v, "msg_id", "bad_msg_id")),
        ("model_version", "model_version", lambda v: _as_int(v, "model_version", "bad_model_version")),
        ("reward", "reward", _reward),
    )
    for key, column, check in checks:
        value = meta_row.get(column)
        if value is None:
            if column == "id":
                reason = reason or "bad_id: id is null"
            continue
        try:
            out[key] = check(value)
        except ValueError as e:
            reason = reason or str(e)
    return out, reason


def _id_text(value, what: str, category: str) -> str:
    """A text id column's value (SQLite may hand back an integer, or bytes that are not UTF-8)."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{category}: {what} is {_short(value)}, not text")
    return _text(value, what, category)


def _reward(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"bad_reward: reward is {_short(value)}, not a number")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"bad_reward: reward {_short(value)} is beyond the range of a float") from None


def row_columns(meta_row: dict, blob) -> dict[str, Any]:
    """One buffer row (its NAME columns and its blob) as STAGED_SCHEMA values.

    A blob that cannot be read safely, whose tensors disagree in length, or a NAME column that
    holds the wrong type gives a row whose `source_error` says why (with the ids NAME holds
    that could be read, so the rejected row can be traced). Whatever the database holds, the
    values returned fit STAGED_SCHEMA: one bad row never fails its range."""
    row: dict[str, Any] = {f.name: None for f in STAGED_SCHEMA}
    meta, meta_error = _meta_columns(meta_row)
    row.update(meta)
    if isinstance(blob, (bytearray, memoryview)):
        blob = bytes(blob)
    if blob is not None and not isinstance(blob, bytes):  # SQLite: TEXT or a number in the blob column
        row["source_error"] = f"bad_blob: experience_bytes holds {type(blob).__name__}, not bytes"
        return row
    row["trinity_blob"] = blob
    if meta_error:
        row["source_error"] = meta_error
        return row
    if blob is None:
        row["source_error"] = f"missing_blob: no row {meta_row['id']} in the _blob table"
        return row
    try:
        items = trxp.decode(blob)
        if len(items) != 1:
            raise ValueError(f"bad_blob: holds {len(items)} experiences, a buffer row holds one")
        item, t = items[0]
        eid = item.get("eid") or {}
        if not isinstance(eid, dict):
            raise ValueError("bad_blob: eid is not a mapping")
        # EID's default batch is "" (unset): Trinity groups all such rows as one batch; so does 0 here
        batch = eid.get("batch")
        row["batch"] = 0 if isinstance(batch, str) and batch == "" or batch is None else _as_int(batch, "eid.batch")
        row["step"] = _as_int(eid.get("step", 0), "eid.step")
        if row["task"] is None:
            row["task"] = _text(eid.get("task", ""), "eid.task", "bad_eid")
        if row["run"] is None:
            row["run"] = _as_int(eid.get("run", 0), "eid.run")
        if row["msg_id"] is None and eid.get("suffix") is not None:
            row["msg_id"] = _text(eid["suffix"], "eid.suffix", "bad_eid")
        if "tokens" not in t:
            raise ValueError("bad_blob: no tokens tensor (a DPO or SFT buffer?)")
        for name in ("chosen", "rejected"):
            if name in t:
                raise ValueError("bad_blob: a DPO experience (chosen/rejected tokens); Rescore scores RL experience")
        tokens = t["tokens"]
        if tokens.dim() != 1 or tokens.dtype not in _TOKEN_DTYPES:
            raise ValueError(f"bad_blob: tokens is {tokens.dtype} of shape {list(tokens.shape)}, expected one integer per token")
        if tokens.dtype == torch.uint64 and len(tokens) and int(tokens.max()) > INT64[1]:
            raise ValueError("bad_blob: a token id is beyond the int64 range")
        prompt_length = _as_int(item.get("prompt_length", 1), "prompt_length", "bad_prompt_length")
        response = len(tokens) - prompt_length
        for name in trxp.RESPONSE_FIELDS:
            if name in t and t[name].dim() != 1:
                raise ValueError(f"bad_blob: {name} has shape {list(t[name].shape)}, expected one value per response token")
            if name in t and len(t[name]) != response:
                raise ValueError(
                    f"length_mismatch: {name} has {len(t[name])} values but tokens - prompt_length is "
                    f"{len(tokens)} - {prompt_length} = {response}"
                )
        mask = t.get("action_mask")
        if mask is not None and mask.dtype != torch.bool and bool(((m := mask.to(torch.float64)) != 0).logical_and(m != 1).any()):
            raise ValueError("bad_action_mask: action_mask values must be 0 or 1")
        row["tokens"] = tokens.to(torch.int64).tolist()
        row["prompt_length"] = prompt_length
        if "logprobs" in t:
            row["logprobs"] = t["logprobs"].to(torch.float32).tolist()
        if "teacher_logprobs" in t:
            row["teacher_logprobs"] = t["teacher_logprobs"].to(torch.float32).tolist()
        if mask is not None:
            row["action_mask"] = mask.to(torch.bool).tolist()
        for name in ("prompt_text", "response_text"):
            if isinstance(item.get(name), str):
                row[name] = _text(item[name], name, "bad_blob")
        row["info"] = _json(item.get("info"))
    except (trxp.BlobError, ValueError, TypeError, RuntimeError, OverflowError) as e:  # RecursionError too
        keep = {k: row[k] for k in ("sql_id", "task", "run", "msg_id", "model_version", "reward", "trinity_blob")}
        row = {f.name: None for f in STAGED_SCHEMA} | keep
        reason = _line(e)
        row["source_error"] = reason if ":" in reason.split(" ", 1)[0] else f"bad_blob: {reason}"
    return row


_TOKEN_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64, torch.uint16, torch.uint32, torch.uint64)


def _sqlite_text(data: bytes):
    """SQLite's text as str, or the bytes where they are not UTF-8 (SQLite stores what it is
    given; pysqlite's default would fail the whole fetch): row_columns rejects that row."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data


def source_engine(url: str):
    """engine(url) for reading a buffer: on SQLite, text that is not UTF-8 reaches row_columns
    as bytes (one rejected row) instead of failing the fetch of its whole range."""
    eng = engine(url)
    if eng.dialect.name == "sqlite":
        from sqlalchemy import event

        @event.listens_for(eng, "connect")
        def _text_factory(dbapi_connection, _record):
            dbapi_connection.text_factory = _sqlite_text

    return eng


def _range_batches(url: str, table: str, lo: int, hi: int, eng):
    """The decoded rows with lo <= id < hi, in id order, STAGE_ROWS at a time (pa.Table each):
    a worker holds one batch of blobs in memory, never the whole range."""
    sa = _sqlalchemy()
    meta, blob = tables(table)
    query = (
        sa.select(meta.c.id, meta.c.task_id, meta.c.run_id, meta.c.msg_id, meta.c.model_version, meta.c.reward,
                  blob.c.experience_bytes)
        .select_from(meta.outerjoin(blob, blob.c.id == meta.c.id))
        .where(meta.c.id >= lo, meta.c.id < hi)
        .order_by(meta.c.id)
    )
    with eng.connect() as conn:
        result = conn.execution_options(yield_per=STAGE_ROWS).execute(query)
        for part in result.partitions():
            rows = [row_columns(dict(r._mapping), r._mapping["experience_bytes"]) for r in part]
            yield pa.Table.from_pylist(rows, schema=STAGED_SCHEMA)


def read_range(url: str, table: str, lo: int, hi: int, eng=None) -> pa.Table:
    """The decoded rows with lo <= id < hi, in id order (STAGED_SCHEMA)."""
    own = eng is None
    eng = eng or source_engine(url)
    try:
        parts = list(_range_batches(url, table, lo, hi, eng))
    finally:
        if own:
            eng.dispose()
    return pa.concat_tables(parts) if parts else STAGED_SCHEMA.empty_table()


def stage_range(url: str, table: str, lo: int, hi: int, path: str, eng) -> int:
    """Write the decoded rows of [lo, hi) to Parquet at `path` (one row group per STAGE_ROWS rows;
    nothing at `path` unless the whole range was written). Returns the rows written."""
    rows = 0
    if storage.is_local(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = f"{path}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            with pq.ParquetWriter(tmp, STAGED_SCHEMA) as writer:
                for part in _range_batches(url, table, lo, hi, eng):
                    writer.write_table(part)
                    rows += part.num_rows
            if rows:
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        return rows
    parts = _range_batches(url, table, lo, hi, eng)
    first = next(parts, None)
    if first is None:
        return 0
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.create(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:  # visible on close
        with pq.ParquetWriter(f, STAGED_SCHEMA) as writer:
            for part in (first, *parts):
                writer.write_table(part)
                rows += part.num_rows
    return rows


def staged_name(lo: int, hi: int) -> str:
    return f"buffer-{lo:012d}-{hi - 1:012d}.parquet"


class _StageRange(beam.DoFn):
    def __init__(self, url: str, table: str, directory: str):
        self._url, self._table, self._directory = url, table, directory

    def setup(self):
        self._engine = source_engine(self._url)
        self._rows = Metrics.counter("rescore", "buffer_rows_staged")

    def process(self, id_range):
        lo, hi = id_range
        path = storage.join(self._directory, staged_name(lo, hi))
        rows = stage_range(self._url, self._table, lo, hi, path, self._engine)
        if rows:
            self._rows.inc(rows)
            yield path

    def teardown(self):
        self._engine.dispose()


class StageBuffer(beam.PTransform):
    """Id ranges of a Trinity buffer -> one Parquet file per range in `directory` (paths out)."""

    def __init__(self, plan: SourcePlan, directory: str):
        super().__init__()
        self._plan, self._directory = plan, directory

    def expand(self, pbegin):
        return (
            pbegin
            | "IdRanges" >> beam.Create(list(self._plan.ranges))
            | "Spread" >> beam.Reshuffle()
            | "ReadDecodeStage" >> beam.ParDo(_StageRange(self._plan.url, self._plan.table, self._directory))
        )


# ---------------------------------------------------------------------------------------------
# Sink
# ---------------------------------------------------------------------------------------------


def check_table_name(table: str, flag: str = "--output-table") -> None:
    """ConfigError (one line) unless `table` is a buffer name Rescore writes (layout.table_name_problem:
    an identifier of at most TABLE_NAME_MAX characters, the same rule on every database)."""
    problem = table_name_problem(table, flag)
    if problem:
        raise ConfigError(problem)


def check_sink(url: str, table: str, overwrite: bool) -> None:
    """Before the run: NAME is a valid name, the database answers and NAME is free (or --overwrite)."""
    check_table_name(table)
    eng = engine(url, must_exist=False)
    try:
        inspector = _connect_check(eng, url)
        try:
            names = set(inspector.get_table_names())
        except Exception as e:  # noqa: BLE001  (a file that is no SQLite database, no permission to list tables)
            raise ConfigError(f"cannot use {safe_url(url)} as --output-db: {_line(e.__cause__ or e)}") from None
    finally:
        eng.dispose()
    taken = [n for n in (table, f"{table}_blob") if n in names]
    if taken and not overwrite:
        raise ConfigError(f"table {taken[0]!r} already exists in {safe_url(url)}; pass --overwrite to replace it")


def sink_columns(schema: pa.Schema) -> list[str]:
    """The scored columns the sink reads; ConfigError where a buffer cannot be built from them."""
    names = set(schema.names)
    if "trinity_blob" not in names and not {"tokens", "prompt_length"} <= names:
        raise ConfigError(
            "--output-db writes Trinity experiences, which need token ids: the input has no "
            "'tokens' and 'prompt_length' columns (verl rollout dumps hold text only)"
        )
    wanted = ("batch", "task", "run", "step", "reward", "tokens", "prompt_length", "logprobs", "action_mask",
              "teacher_logprobs", "advantages", "returns", "score", "copy_index", "msg_id", "model_version",
              "trinity_blob")
    return [c for c in wanted if c in names]


def _suffix(row: dict) -> str:
    key = f"{row.get('batch')}/{row.get('task')}/{row.get('run')}/{row.get('step')}"
    return hashlib.sha1(key.encode()).hexdigest()[:6]


def experience_blob(row: dict) -> tuple[bytes, dict[str, Any]]:
    """(TRXP blob, NAME column values) for one scored row.

    With the original blob (`trinity_blob`) every field is kept and only advantages/returns are
    replaced; otherwise the experience is built from the row's columns."""
    adv = torch.tensor(row["advantages"], dtype=torch.float32)
    ret = torch.tensor(row.get("returns") if row.get("returns") is not None else row["advantages"], dtype=torch.float32)
    copy = row.get("copy_index")
    if row.get("trinity_blob") is not None:
        ((item, fields),) = trxp.decode(row["trinity_blob"])
        suffix = row.get("msg_id") or (item.get("eid") or {}).get("suffix") or _suffix(row)
    else:
        suffix = row.get("msg_id") or _suffix(row)
        tokens = torch.tensor(row["tokens"], dtype=torch.int64)
        if len(tokens) and int(tokens.max()) < 2**31 and int(tokens.min()) >= -(2**31):
            tokens = tokens.to(torch.int32)  # what Trinity's Experience(tokens=list) stores
        eid = {"batch": row["batch"], "task": row["task"], "run": row["run"], "step": row.get("step") or 0, "suffix": suffix}
        item = trxp.new_item(eid=eid, reward=row["reward"], prompt_length=row["prompt_length"])
        fields = {"tokens": tokens}
        if row.get("logprobs") is not None:
            fields["logprobs"] = torch.tensor(row["logprobs"], dtype=torch.float32)
        if row.get("teacher_logprobs") is not None:
            fields["teacher_logprobs"] = torch.tensor(row["teacher_logprobs"], dtype=torch.float32)
        mask = row.get("action_mask")
        response = len(row["tokens"]) - int(row["prompt_length"])
        fields["action_mask"] = (
            torch.tensor([bool(m) for m in mask], dtype=torch.bool) if mask is not None else torch.ones(response, dtype=torch.bool)
        )
    if copy:  # a duplicated row (POLARIS) is an experience of its own: its id must differ
        suffix = f"{suffix}-c{copy}"
    eid = dict(item.get("eid") or {})
    eid["suffix"] = suffix
    item = {**item, "eid": eid}
    fields = {**fields, "advantages": adv, "returns": ret}
    columns = {
        "task_id": str(row["task"]),
        "run_id": int(row["run"]),
        "msg_id": str(suffix)[:64],
        "model_version": row.get("model_version"),
        "reward": None if row.get("reward") is None else float(row["reward"]),
    }
    return trxp.encode([(item, fields)]), columns


def _staging_prefix(table: str) -> str:
    return f"{STAGING_PREFIX}{hashlib.sha256(table.encode('utf-8')).hexdigest()[:12]}_"


def staging_names(table: str, token: str) -> tuple[str, str]:
    """This run's staging tables for buffer `table`: 37 and 42 characters whatever `table` is
    (their sequence and index names, `..._id_seq`, `ix_..._model_version`, fit 63 bytes too)."""
    check_table_name(table)
    if not re.fullmatch(r"[0-9a-f]{1,16}", token):
        raise ValueError(f"internal error: staging token {token!r}")
    staged = f"{_staging_prefix(table)}{token}"
    return staged, f"{staged}_blob"


def _leftover_staging(table: str, names) -> list[str]:
    """Staging tables of `table` that earlier runs left (this version's and older ones')."""
    prefixes = (_staging_prefix(table), f"{table}{OLD_STAGING_INFIX}")
    return [n for n in names if n.startswith(prefixes)]


def new_token() -> str:
    return uuid.uuid4().hex[:10]


def prepare_staging(url: str, table: str, token: str) -> None:
    """Drop staging tables that killed runs left for NAME, then create this run's."""
    sa = _sqlalchemy()
    eng = engine(url, must_exist=False)
    try:
        names = _leftover_staging(table, sa.inspect(eng).get_table_names())
        md = sa.MetaData()
        for n in names:
            sa.Table(n, md)
        with eng.begin() as conn:
            for n in sorted(names, key=lambda n: not n.endswith("_blob")):
                log.info("dropping %s, left by an unfinished run", n)
                md.tables[n].drop(conn)
        staged, _ = staging_names(table, token)
        meta, blob = tables(staged)
        meta.metadata.create_all(eng)
    finally:
        eng.dispose()


def drop_staging(url: str, table: str, token: str) -> None:
    """Drop this run's staging tables where they exist (a failed write leaves none behind)."""
    sa = _sqlalchemy()
    eng = engine(url, must_exist=False)
    q = eng.dialect.identifier_preparer.quote
    try:
        present = set(sa.inspect(eng).get_table_names())
        staged, staged_blob = staging_names(table, token)
        with eng.begin() as conn:
            for n in (staged_blob, staged):
                if n in present:
                    conn.exec_driver_sql(f"DROP TABLE {q(n)}")
    finally:
        eng.dispose()


def insert_rows(conn, table: str, token: str, rows: list[dict], first_id: int) -> int:
    """Insert scored rows as experiences with ids first_id, first_id + 1, ... into the staging tables."""
    staged, _ = staging_names(table, token)
    meta, blob = tables(staged)
    metas, blobs = [], []
    for i, row in enumerate(rows):
        data, columns = experience_blob(row)
        metas.append({"id": first_id + i, "consumed": 0, **columns})
        blobs.append({"id": first_id + i, "experience_bytes": data})
    for start in range(0, len(rows), INSERT_ROWS):
        conn.execute(meta.insert(), metas[start : start + INSERT_ROWS])
        conn.execute(blob.insert(), blobs[start : start + INSERT_ROWS])
    return len(rows)


def clear_ids(conn, table: str, token: str, lo: int, hi: int) -> None:
    """Delete the rows with lo <= id < hi from this run's staging tables."""
    staged, _ = staging_names(table, token)
    meta, blob = tables(staged)
    for t in (blob, meta):
        conn.execute(t.delete().where(t.c.id >= lo, t.c.id < hi))


def commit_staging(url: str, table: str, token: str, overwrite: bool) -> int:
    """In one transaction: drop NAME (with --overwrite), rename the staging tables to NAME and
    NAME_blob. Returns the rows published."""
    sa = _sqlalchemy()
    staged, staged_blob = staging_names(table, token)
    eng = engine(url, must_exist=False)
    q = eng.dialect.identifier_preparer.quote
    sqlite = eng.dialect.name == "sqlite"
    if sqlite:
        # pysqlite opens no transaction before DDL; take over and BEGIN ourselves.
        eng = eng.execution_options(isolation_level="AUTOCOMMIT")
    try:
        with eng.connect() as conn:
            if sqlite:
                conn.exec_driver_sql("BEGIN IMMEDIATE")
            tx = None if sqlite else conn.begin()
            try:
                names = set(sa.inspect(conn).get_table_names())
                taken = [n for n in (f"{table}_blob", table) if n in names]
                if taken and not overwrite:
                    raise ConfigError(f"table {taken[-1]!r} appeared in {safe_url(url)} during the run; not replaced (use --overwrite)")
                for n in taken:
                    conn.exec_driver_sql(f"DROP TABLE {q(n)}")
                if eng.dialect.name == "postgresql":  # keep Trinity's own inserts after ours
                    # The table name reaches pg_get_serial_sequence as a bound value (its quoted
                    # form, which that function parses as an identifier), never as SQL text.
                    meta, _ = tables(staged)
                    last = sa.select(sa.func.coalesce(sa.func.max(meta.c.id), 0)).scalar_subquery()
                    sequence = sa.func.pg_get_serial_sequence(sa.bindparam("table", q(staged)), sa.bindparam("column", "id"))
                    conn.execute(sa.select(sa.func.setval(sequence, last + 1, sa.false())))
                conn.exec_driver_sql(f"ALTER TABLE {q(staged)} RENAME TO {q(table)}")
                conn.exec_driver_sql(f"ALTER TABLE {q(staged_blob)} RENAME TO {q(table + '_blob')}")
                count = conn.exec_driver_sql(f"SELECT count(*) FROM {q(table)}").scalar()
            except BaseException:
                if sqlite:
                    conn.exec_driver_sql("ROLLBACK")
                else:
                    tx.rollback()
                raise
            if sqlite:
                conn.exec_driver_sql("COMMIT")
            else:
                tx.commit()
    finally:
        eng.dispose()
    return int(count)


class _InsertFile(beam.DoFn):
    def __init__(self, url: str, table: str, token: str, columns: list[str]):
        self._url, self._table, self._token, self._columns = url, table, token, columns

    def setup(self):
        self._engine = engine(self._url, must_exist=False)
        self._rows = Metrics.counter("rescore", "buffer_rows_written")

    def process(self, element):
        path, first_id = element
        pf = storage.open_parquet(path)
        present = [c for c in self._columns if c in pf.schema_arrow.names]
        # A retried bundle (a worker lost mid-file) finds the ids it inserted before: they are
        # this file's alone (fixed by file), so they are cleared and written again, not doubled.
        with self._engine.begin() as conn:
            clear_ids(conn, self._table, self._token, first_id, first_id + pf.metadata.num_rows)
        next_id = first_id
        for batch in pf.iter_batches(batch_size=INSERT_ROWS * 4, columns=present):
            rows = batch.to_pylist()
            with self._engine.begin() as conn:
                next_id += insert_rows(conn, self._table, self._token, rows, next_id)
        self._rows.inc(next_id - first_id)
        fault_injection.maybe_fail_insert(path)  # tests: a run killed mid-insert
        yield next_id - first_id

    def teardown(self):
        self._engine.dispose()


class InsertScored(beam.PTransform):
    """(scored file, first id) -> rows inserted into the staging tables (counts out)."""

    def __init__(self, files: list[tuple[str, int]], url: str, table: str, token: str, columns: list[str]):
        super().__init__()
        self._files, self._url, self._table, self._token, self._columns = files, url, table, token, columns

    def expand(self, pbegin):
        return (
            pbegin
            | "ScoredFiles" >> beam.Create(self._files)
            | "Spread" >> beam.Reshuffle()
            | "InsertExperiences" >> beam.ParDo(_InsertFile(self._url, self._table, self._token, self._columns))
        )
