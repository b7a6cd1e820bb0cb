"""Trinity-RFT SQL experience buffers in a database: connections, Trinity's two tables, the
source's id ranges and the staged Parquet they become, and the sink's staging tables, inserts
and the one transaction that publishes them. No Beam: the steps that run this on workers are
transforms/sql_buffer.py; what one row becomes is transforms/rows/trinity_rows.py.

A buffer named NAME (trinity/buffer/schema/sql_schema.py) is two tables:
    NAME       id, timestamp, task_id, run_id, msg_id, model_version, reward, consumed
    NAME_blob  id, experience_bytes (a TRXP blob, see transforms/rows/trinity_format.py)
Trinity's reader takes task, run, suffix (msg_id) and reward from NAME and everything else
(batch, step, tensors, texts) from the blob; so does this one.

Sink: the scored rows are inserted into a pair of staging tables with ids fixed by file (file k
starts after the rows of files 0..k-1), then one transaction drops nothing but what --overwrite
allows and renames the staging tables to NAME and NAME_blob. A run killed before that leaves
only `rescore_stage_HHHHHHHHHHHH_*` staging tables (H: a hash of NAME, so the names fit
PostgreSQL's 63 bytes whatever NAME is), which the next run for NAME removes; NAME never holds
half the rows.

SQL text: every table name goes through the dialect's identifier quoting and every value
through bind parameters; NAME itself is checked first (check_table_name: letters, digits and
underscores, at most TABLE_NAME_MAX characters), so nothing a user types is ever SQL.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
import uuid
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rescore.errors import ConfigError, first_line
from rescore.transforms.files import storage
from rescore.transforms.files.layout import TABLE_NAME_MAX, table_name_problem  # noqa: F401
from rescore.transforms.rows.trinity_rows import STAGED_SCHEMA, experience_blob, row_columns

log = logging.getLogger(__name__)

STAGING_PREFIX = "rescore_stage_"
"""Staging tables: STAGING_PREFIX + 12 hex digits of sha256(NAME) + "_" + a run token (+ "_blob")."""
OLD_STAGING_INFIX = "__rescore_"
"""Staging tables of earlier versions, NAME + OLD_STAGING_INFIX + token: still removed."""
INSERT_ROWS = 256
"""Rows per INSERT round trip (blobs are tens of KB each)."""
STAGE_ROWS = 1024
"""Rows fetched, decoded and written as one Parquet row group at a time by the source."""


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
        raise ConfigError(f"cannot open {safe_url(url)}: {first_line(e, limit=300)}{hint}") from None


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
        raise ConfigError(f"cannot connect to {safe_url(url)}: {first_line(e, limit=300)}") from None


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
        raise ConfigError(f"cannot read table {table!r} in {safe_url(url)}: {first_line(e, limit=300)}") from None
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
            raise ConfigError(f"cannot use {safe_url(url)} as --output-db: {first_line(e.__cause__ or e, limit=300)}") from None
    finally:
        eng.dispose()
    taken = [n for n in (table, f"{table}_blob") if n in names]
    if taken and not overwrite:
        raise ConfigError(f"table {taken[0]!r} already exists in {safe_url(url)}; pass --overwrite to replace it")

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


def insert_file(eng, table: str, token: str, columns: list[str], path: str, first_id: int) -> int:
    """Insert the rows of the scored file at `path` with ids first_id, first_id + 1, ... into
    this run's staging tables; returns the rows inserted. A retried bundle (a worker lost
    mid-file) finds the ids it inserted before: they are this file's alone (fixed by file), so
    they are cleared and written again, not doubled."""
    pf = storage.open_parquet(path)
    present = [c for c in columns if c in pf.schema_arrow.names]
    with eng.begin() as conn:
        clear_ids(conn, table, token, first_id, first_id + pf.metadata.num_rows)
    next_id = first_id
    for batch in pf.iter_batches(batch_size=INSERT_ROWS * 4, columns=present):
        rows = batch.to_pylist()
        with eng.begin() as conn:
            next_id += insert_rows(conn, table, token, rows, next_id)
    return next_id - first_id
