"""Scheduled, incremental rescoring into a Delta Lake table: the batch is the unit of work.

    OUTPUT/                        a Delta Lake table: the current scored rows
      _delta_log/                  its transaction log; every Rescore commit carries the run's
                                   bookkeeping (input files, their fingerprints and batches)
      part-*.parquet               data files (written by delta-rs, referenced by the log)
      _rescore/lock                flock'ed by the running run, which writes its pid, host, start
      _rescore/runs/RUN/           a run's work: metrics.json and rejected-*.parquet are kept

A run (see docs/runners.md):
1. lists the input and identifies each file by its canonical location (real path, normalised
   URL) and a content fingerprint (size, mtime, sha256 of the Parquet footer);
2. compares with the bookkeeping of the table's last Rescore commit: new, changed and deleted
   files; the batches they hold (or held) are the *touched* batches (from the footer's `batch`
   statistics where a row group holds one batch, else from the `batch` column itself);
3. scores every touched batch from ALL current input files that hold rows of it (only the row
   groups whose statistics can hold a touched batch are read), with the one-shot pipeline,
   into _rescore/runs/RUN/;
4. replaces the touched batches' rows in ONE Delta commit (replace-where `batch IN (...)`),
   together with the new bookkeeping; the commit is made against the table version the run
   started from and is never retried, so a concurrent commit makes it fail cleanly.

Before the commit the table is unchanged (readers see the previous version); after it they
see the new one; there is no state in between. A killed run leaves at most an unreferenced
work directory and unreferenced data files, which the next run removes or ignores.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa

from rescore.errors import ConflictError, InputError, SchemaError
from rescore.transforms import fault_injection
from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import storage
from rescore.transforms.files.layout import DELTA_LOG, INCREMENTAL_WORK, SCORED_FILES, STAGING

log = logging.getLogger("rescore")

RUN_PREFIX = "run="
WORK = INCREMENTAL_WORK
STATE_KEY = "rescore.state"
STATE_VERSION = 2
LEGACY_MANIFEST = "_manifest.json"
RUN_NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._=+-]{0,127}"
"""--run-name: one path component: letters, digits and . _ = + -, starting with a letter or
digit, at most 128 characters, and never `..` (so never a path, never absolute)."""


# --- names and identity -----------------------------------------------------------------


def check_run_name(name: str) -> str:
    if not re.fullmatch(RUN_NAME_PATTERN, name) or ".." in name:
        from rescore.errors import ConfigError

        raise ConfigError(
            f"--run-name {name!r} must be one path component matching {RUN_NAME_PATTERN} "
            "(letters, digits, . _ = + -; no '/', no '..')"
        )
    return name


def run_name(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{RUN_PREFIX}{now.strftime('%Y%m%dT%H%M%S')}"


def canonical(path: str) -> str:
    """The one name of a file however it was spelt: the real path (symlinks, `.`, `..` and
    relative paths resolved) for local files; for URLs the scheme and host in lower case and
    the path with `.`/`..` segments and repeated slashes removed."""
    if storage.is_local(path):
        return os.path.realpath(path)
    parts = urlsplit(path)
    segments: list[str] = []
    for seg in parts.path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if segments:
                segments.pop()
            continue
        segments.append(seg)
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), "/" + "/".join(segments), "", ""))


def table_uri(output: str) -> str:
    return os.path.abspath(output) if storage.is_local(output) else output.rstrip("/")


@dataclass(frozen=True)
class InputFile:
    key: str
    """canonical location: the file's identity"""
    path: str
    """a path this run can open (as matched)"""
    size: int
    mtime: float
    footer: str = ""

    def same_content(self, entry: dict) -> bool:
        return (entry.get("size"), entry.get("mtime"), entry.get("footer")) == (self.size, self.mtime, self.footer)


def list_inputs(patterns: list[str], *, footers: bool = True) -> list[InputFile]:
    """Every file the patterns match, once per canonical location, sorted by it."""
    found: dict[str, InputFile] = {}
    for pattern in patterns:
        matched = storage.match_stats(pattern)
        if not matched:
            raise InputError(f"no input files match {pattern!r}")
        for path, size, mtime in matched:
            key = canonical(path)
            found.setdefault(key, InputFile(key, path, size, mtime))
    files = [found[k] for k in sorted(found)]
    if not footers or not files:
        return files

    def digest(f: InputFile) -> InputFile:
        try:
            return replace(f, footer=fingerprints.footer_hash(f.path, f.size))
        except OSError as e:
            raise InputError(f"{f.path}: cannot read its footer ({e.strerror or e})") from None

    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        return list(pool.map(digest, files))


# --- batches held by a file ---------------------------------------------------------------


def _ranges(values: list[int]) -> list[list[int]]:
    """Sorted distinct ints as [lo, hi] ranges (compact in the bookkeeping)."""
    out: list[list[int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def expand(ranges: list[list[int]]) -> set[int]:
    return {v for lo, hi in ranges for v in range(lo, hi + 1)}


def _batch_leaf(pf) -> int | None:
    """The Parquet leaf column index of an integer `batch` column (None if there is none)."""
    if "batch" not in pf.schema_arrow.names or not pa.types.is_integer(pf.schema_arrow.field("batch").type):
        return None
    for i in range(pf.metadata.num_columns):
        if pf.metadata.schema.column(i).path == "batch":
            return i
    return None


def file_batches(path: str) -> list[int]:
    """The distinct non-null `batch` values of a file: from the footer where a row group's
    statistics are exact (min == max), else from the row group's `batch` column."""
    pf = storage.open_parquet(path)
    leaf = _batch_leaf(pf)
    if leaf is None:
        return []  # no usable batch column: the pipeline rejects the file or its rows, with reasons
    values: set[int] = set()
    for g in range(pf.num_row_groups):
        rg = pf.metadata.row_group(g)
        if rg.num_rows == 0:
            continue
        stats = rg.column(leaf).statistics
        if stats is not None and stats.has_min_max and stats.min == stats.max:
            values.add(int(stats.min))
            continue
        column = pf.read_row_group(g, columns=["batch"])["batch"]
        values.update(int(v) for v in column.drop_null().unique().to_pylist())
    return sorted(values)


def row_group_may_hold(path: str, batches: set[int]) -> list[int]:
    """Row counts of the file's row groups, 0 for those whose `batch` statistics show they
    hold none of `batches` (groups without statistics are kept)."""
    import bisect

    pf = storage.open_parquet(path)
    counts = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
    leaf = _batch_leaf(pf)
    if leaf is None or not batches:
        return counts
    ordered = sorted(batches)
    for g in range(pf.num_row_groups):
        stats = pf.metadata.row_group(g).column(leaf).statistics
        if stats is None or not stats.has_min_max:
            continue
        lo, hi = int(stats.min), int(stats.max)
        i = bisect.bisect_left(ordered, lo)
        if i == len(ordered) or ordered[i] > hi:
            counts[g] = 0
    return counts


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


def open_table(output: str, *, version: int | None = None, storage_options: dict | None = None):
    """The table's DeltaTable, or InputError (exit 2, one line) where its path or its
    `_delta_log` cannot be read (pipelines/load.py: open_table)."""
    from rescore.pipelines import load

    return load.open_table(output, version=version, storage_options=storage_options, error=InputError)


def is_table(output: str, storage_options: dict | None = None) -> bool:
    if storage.is_local(output):
        return os.path.isdir(os.path.join(output, DELTA_LOG))
    from deltalake import DeltaTable  # object stores have no directories to look for

    return DeltaTable.is_deltatable(table_uri(output), storage_options=storage_options)


def load_state(output: str, *, storage_options: dict | None = None) -> State:
    """The bookkeeping of the table's latest Rescore commit (an empty State without a table)."""
    if storage.exists(storage.join(output, LEGACY_MANIFEST)):
        raise InputError(
            f"{output} holds an incremental output of an earlier Rescore (_manifest.json, run=*/ directories); "
            "incremental runs now write a Delta Lake table: start a new --output"
        )
    if not is_table(output):
        return State()
    dt = open_table(output, storage_options=storage_options)
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
    for commit in _commits(output, dt):
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


def _commits(output: str, dt) -> Any:
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
                raise InputError(f"{name}: a line is not JSON ({_first_line(e)}); the table's _delta_log is damaged: "
                                 "restore it, or rescore into a new --output") from None
            if isinstance(action, dict) and isinstance(action.get("commitInfo"), dict):
                yield {**action["commitInfo"], "version": v}
                break


# --- selection ------------------------------------------------------------------------------


@dataclass
class Selection:
    current: list[InputFile]
    new: list[InputFile]
    changed: list[InputFile]
    deleted: list[str]
    batches: dict[str, list[int]]
    """batches held now by every new or changed file, by key"""
    touched: set[int]
    sources: list[InputFile]
    """current files holding rows of a touched batch"""

    @property
    def nothing_new(self) -> bool:
        return not (self.new or self.changed or self.deleted)


def select(files: list[InputFile], state: State, *, rebuild: bool = False, skip_bad_files: bool = False) -> Selection:
    previous = state.files
    new = [f for f in files if f.key not in previous]
    changed = [f for f in files if f.key in previous and not f.same_content(previous[f.key])]
    present = {f.key for f in files}
    deleted = sorted(k for k in previous if k not in present)
    fresh = files if rebuild else new + changed

    def batches_of(f: InputFile):
        try:
            return file_batches(f.path)
        except Exception as e:  # noqa: BLE001  (pyarrow raises several types for foreign files)
            if skip_bad_files:
                return e
            first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
            raise InputError(f"{f.path}: not a readable Parquet file ({first})") from None

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(fresh)))) as pool:
        found = list(pool.map(batches_of, fresh))
    batches: dict[str, list[int]] = {}
    for f, b in zip(fresh, found):
        if isinstance(b, Exception):
            log.warning("skipping %s: not a readable Parquet file", f.path)
            continue
        batches[f.key] = b
    touched: set[int] = set()
    for b in batches.values():
        touched.update(b)
    for f in changed:
        touched |= expand(previous[f.key]["batches"])
    for key in deleted:
        touched |= expand(previous[key]["batches"])
    if rebuild:
        for entry in previous.values():
            touched |= expand(entry["batches"])

    def held(f: InputFile) -> set[int]:
        if f.key in batches:
            return set(batches[f.key])
        return expand(previous[f.key]["batches"]) if f.key in previous else set()

    sources = [f for f in files if held(f) & touched]
    return Selection(files, new, changed, deleted, batches, touched, sources)


# --- the lock ---------------------------------------------------------------------------------


class RunLock:
    """OUTPUT/_rescore/lock: one incremental run at a time per output.

    Local outputs: an exclusive flock(2) on the file, which the kernel releases when the
    holder exits in any way (a SIGKILLed run never blocks the next one); the file says who
    holds it (pid, host, start). On object stores the lock is best effort (Beam's file
    systems have no exclusive create): there the Delta commit, made against the version the
    run started from and never retried, is what keeps two runs from mixing."""

    def __init__(self, output: str):
        self.path = storage.join(output, WORK, "lock")
        self.held = False
        self._fd: int | None = None

    def _holder(self) -> dict:
        try:
            return json.loads(storage.read_text(self.path) or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self) -> None:
        me = {
            "pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        if not storage.is_local(self.path):
            holder = self._holder() if storage.exists(self.path) else {}
            if holder:
                raise ConflictError(self._busy(holder))
            storage.write_text(self.path, json.dumps(me))
            self.held = True
            return
        import fcntl

        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            holder = self._holder()
            if not holder:  # the holder is writing its name this instant
                time.sleep(0.2)
                holder = self._holder()
            raise ConflictError(self._busy(holder)) from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps(me).encode())
        os.fsync(fd)
        self._fd = fd
        self.held = True

    @staticmethod
    def _describe(holder: dict) -> str:
        return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"

    def _busy(self, holder: dict) -> str:
        return (
            f"another incremental run into this output is in progress ({self._describe(holder)}; lock {self.path}); "
            "nothing was done"
        )

    def release(self) -> None:
        if not self.held:
            return
        if self._fd is None:
            storage.delete([self.path])
        else:  # emptied, not removed: removing a flocked file lets a waiter lock a dead inode
            os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
        self.held = False

    def __enter__(self):
        self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()
        return False


# --- the run --------------------------------------------------------------------------------


def work_dir(output: str, name: str | None = None) -> str:
    return storage.join(output, WORK, "runs", name) if name else storage.join(output, WORK, "runs")


def _clean_work(output: str, state: State) -> None:
    """Remove what killed runs left: work directories of runs never committed, and the scored
    files of committed runs (their rows live in the table). Local outputs only; elsewhere they
    are left and never read."""
    root = work_dir(output)
    if not storage.is_local(root) or not os.path.isdir(root):
        return
    committed = {r["run"] for r in state.runs}
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name not in committed:
            log.info("removing %s, the work of a run that never committed", path)
            storage.delete([path])
        else:
            storage.delete([os.path.join(path, n) for n in os.listdir(path) if fnmatch.fnmatch(n, SCORED_FILES) or n == STAGING])


def restrict(plan, touched: set[int], shard_rows: int, whole: set[str]):
    """The plan with only the row groups that can hold a touched batch (files in `whole`, the
    new and changed ones, are read whole so that every rejected row of them is reported)."""
    from rescore.transforms.input_plan import file_units

    planned = {u.path: u.fingerprint for u in plan.units}  # taken when the run planned (plan_input)
    units: list = []
    for path in plan.files:
        counts = None if path in whole else row_group_may_hold(path, touched)
        if counts is None:
            pf = storage.open_parquet(path)
            counts = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
        units += file_units(path, counts, shard_rows, first=len(units), fingerprint=planned.get(path))
    return replace(plan, units=tuple(units))


def _predicate(batches: set[int]) -> str:
    return "batch IN (" + ", ".join(str(b) for b in sorted(batches)) + ")"


def _scored_reader(work: str, touched: set[int], schema: pa.Schema):
    """The staged scored rows of touched batches, streamed; and a counter of rows passed."""
    import pyarrow.compute as pc

    paths = storage.list_dir(work, SCORED_FILES)
    keep = pa.array(sorted(touched), pa.int64())
    counted = {"rows": 0}
    if paths:
        schema = storage.open_parquet(paths[0]).schema_arrow
    schema = schema.remove_metadata()

    def batches():
        for path in paths:
            for rb in storage.open_parquet(path).iter_batches(batch_size=65536):
                rb = rb.filter(pc.is_in(rb.column("batch"), value_set=keep))
                if rb.num_rows:
                    counted["rows"] += rb.num_rows
                    yield pa.RecordBatch.from_arrays(rb.columns, schema=schema)

    return pa.RecordBatchReader.from_batches(schema, batches()), counted


# --- column types: the table only widens (schemas/widening.py) -----------------------------


def table_schema(output: str, storage_options: dict | None = None) -> pa.Schema | None:
    """The Arrow schema of the table's latest version (None without a table)."""
    if not is_table(output, storage_options):
        return None
    return pa.schema(open_table(output, storage_options=storage_options).schema().to_arrow())


def check_table_types(output: str, paths: list[str] | tuple[str, ...], *, storage_options: dict | None = None) -> None:
    """Before any work: every column of every input file that the table also holds has a type
    the table's type widens with (schemas/widening.py); else SchemaError (exit 2) naming the
    file, the column, its type and the table's. Score columns are the run's own, not checked."""
    from rescore.schemas.experience import REJECT_REASON, SCORE_COLUMNS
    from rescore.schemas.widening import describe, widen

    have = table_schema(output, storage_options)
    if have is None:
        return
    own = {*SCORE_COLUMNS, REJECT_REASON}
    for path in paths:
        try:
            schema = storage.open_parquet(path).schema_arrow
        except Exception:  # noqa: BLE001  (plan_input reports, or skips, a file it cannot read)
            continue
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
    from rescore.pipelines.load import local_files

    dt = open_table(output, version=version, storage_options=storage_options)
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
    have = None if state.version is None or rebuild else pa.schema(
        open_table(output, version=state.version, storage_options=storage_options).schema().to_arrow())
    schema, widened = commit_schema(have, data.schema)
    data = _converted(data, schema)
    try:
        if state.version is None:
            write_deltalake(uri, data, mode="error", commit_properties=props, storage_options=storage_options)
        else:
            dt = open_table(output, version=state.version, storage_options=storage_options)
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
            f"the latest); this run published nothing: run it again ({_first_line(e)})"
        ) from None
    except DeltaError as e:
        if state.version is None and "exist" in str(e).lower():
            raise ConflictError(f"another run created the table {output} while this one ran; this run published nothing: run it again") from None
        raise
    return open_table(output, storage_options=storage_options).version()


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def run(cfg) -> dict[str, Any]:
    """One incremental run (see the module docstring); returns its metrics document, or
    {"nothing_new": True, "message": ...}."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions, TestOptions

    from rescore.pipelines import __version__
    from rescore.pipelines import rescore as rs
    from rescore.pipelines.progress import Progress
    from rescore.transforms.input_plan import plan_input
    from rescore.errors import ConfigError
    from rescore.transforms.strategies import build_chain
    from rescore.transforms.files.layout import METRICS, SUCCESS

    name = check_run_name(cfg.run_name) if cfg.run_name else run_name()
    if not cfg.wait:
        raise ConfigError("--incremental waits for the run to finish before it commits it; drop --no-wait")
    scoring = build_chain(cfg.strategies, cfg.params)
    stage = scoring.correction
    if stage is not None and stage.max_staleness is not None and stage.current_model_version is None:
        # the newest version of the whole input is not what an incremental run reads
        raise ConfigError(f"{stage.name}: max_staleness with --incremental needs current_model_version (the newest version is measured over one-shot input only)")
    chash = rs.config_hash(scoring.name, scoring.params, cfg.algorithm)
    options = PipelineOptions(cfg.beam_args)
    rs._check_local_device(cfg, options)
    dry_run = options.view_as(TestOptions).dry_run
    from rescore.pipelines.load import check_table_path

    check_table_path(cfg.output, ConfigError)  # before anything is written there
    if storage.is_local(cfg.output) and os.path.isfile(cfg.output):
        raise ConfigError(f"--output {cfg.output} is a file; incremental output is a directory (a Delta table)")
    if not is_table(cfg.output) and storage.exists(storage.join(cfg.output, SUCCESS)):
        raise ConfigError(
            f"{cfg.output} holds a one-shot run (_SUCCESS); an incremental table needs a directory of its own"
        )
    if dry_run:
        state = load_state(cfg.output)
        return _dry_run(cfg, scoring, state, rs, beam, plan_input)

    lock = RunLock(cfg.output)
    with lock:
        state = load_state(cfg.output)
        fault_injection.maybe_kill_at("locked")
        rebuild = bool(cfg.overwrite)
        if state.config_hash and state.config_hash != chash and not rebuild:
            raise ConfigError(
                f"{cfg.output} was scored with strategy {state.strategy} (config {state.config_hash[:12]}); this run's "
                f"strategy or parameters differ ({scoring.name}, config {chash[:12]}): pass --overwrite to rescore "
                "every batch with them, or use another --output"
            )
        used = {r["run"] for r in state.runs}
        if name in used and cfg.run_name:
            raise ConfigError(f"{cfg.output} already has a run named {name}; pick another --run-name")
        base, k = name, 1
        while name in used:  # two runs within one second
            name, k = f"{base}-{k}", k + 1
        _clean_work(cfg.output, state)
        files = list_inputs(cfg.inputs)
        out_real = canonical(table_uri(cfg.output)).rstrip("/") + "/"
        for f in files:
            if f.key.startswith(out_real):
                raise ConfigError(f"input file {f.path} lies inside --output {cfg.output}; write to a directory of its own")
        chosen = select(files, state, rebuild=rebuild, skip_bad_files=cfg.skip_bad_files)
        for f in chosen.changed:
            log.warning("%s changed since it was scored; its batches are scored again", f.path)
        for key in chosen.deleted:
            log.warning("%s is gone since it was scored; its rows are removed (its batches are scored again from the other files)", key)
        if chosen.nothing_new and not rebuild:
            return {
                "nothing_new": True, "input_files": len(files), "output": cfg.output,
                "strategy": scoring.name, "table_version": state.version,
                "message": (
                    f"nothing new to score: all {len(files)} input files are already scored in {cfg.output} "
                    f"(table version {state.version})"
                ),
            }

        fault_injection.maybe_kill_at("planned")
        work = work_dir(cfg.output, name)
        storage.delete([work])
        info = {
            "run": name,
            "table_version_before": state.version,
            "new_files": len(chosen.new),
            "changed_files": len(chosen.changed),
            "deleted_files": len(chosen.deleted),
            "already_scored": len(files) - len(chosen.new) - len(chosen.changed),
            "batches_rescored": len(chosen.touched),
            "source_files": len(chosen.sources),
        }
        whole = {f.path for f in chosen.new + chosen.changed}
        sources = [f for f in files if f in chosen.sources or f.path in whole]
        info["source_files"] = len(sources)
        doc: dict[str, Any] = {}
        schema = None
        plan_fps: dict = {}
        if sources:
            if not rebuild and state.version is not None:
                check_table_types(cfg.output, [f.path for f in sources])
            plan = plan_input([f.path for f in sources], needs=scoring.needs, shard_rows=cfg.shard_rows,
                              skip_bad_files=cfg.skip_bad_files)
            for warning in plan.warnings:
                log.warning(warning)
            plan = restrict(plan, chosen.touched, cfg.shard_rows, whole)
            plan_fps = {u.path: u.fingerprint for u in plan.units if u.fingerprint is not None}
            run_cfg = replace(cfg, output=work, incremental=False)
            run_info = {
                "rescore_version": __version__, "strategy": scoring.name, "algorithm": cfg.algorithm,
                "params": scoring.params, "config_hash": chash, "input": cfg.inputs, "output": work,
                "buckets": cfg.buckets, "shard_rows": cfg.shard_rows, "max_reject_fraction": cfg.max_reject_fraction,
                "max_group_rows": cfg.max_group_rows, "device": cfg.device,
                "keep_filtered": cfg.keep_filtered, "audit_columns": cfg.audit_columns, "incremental": info,
            }
            p = beam.Pipeline(options=options)
            rs.build(p, plan, scoring, run_cfg, run_info)
            with Progress(work, len(plan.units), plan.num_rows, len(plan.files), enabled=not cfg.quiet,
                          interval=cfg.progress_seconds):
                p.run().wait_until_finish()
            metrics = storage.join(work, METRICS)
            doc = json.loads(storage.read_text(metrics)) if storage.exists(metrics) else {}
            if doc.get("failed"):
                raise rs.RejectBudgetExceeded(f"{doc['failed']}; the rejected rows and metrics.json are in {work}; nothing was committed")
            if not storage.exists(storage.join(work, SUCCESS)):
                raise RuntimeError(f"the pipeline finished but {work}/_SUCCESS was not written")
            from rescore.schemas import output_schema

            schema = output_schema(plan.schema)  # used only when no row is left to commit
        else:  # only deleted files, and no other file holds their batches: remove their rows
            schema = pa.schema(open_table(cfg.output).schema().to_arrow())

        fault_injection.maybe_kill_at("before_commit")
        _check_unchanged(plan_fps, files)
        new_state = _next_state(state, chosen, files, name, chash, scoring.name, cfg.inputs, info, rebuild)
        new_state.rows = _rows_after(cfg.output, state, work, chosen.touched, rebuild)
        data, counted = _scored_reader(work, chosen.touched, schema)
        version = commit(cfg.output, state, new_state, chosen.touched, data, rebuild=rebuild)
        fault_injection.maybe_kill_at("after_commit")
        storage.delete(storage.list_dir(work, SCORED_FILES))
        info.update({"table_version": version, "rows_committed": counted["rows"]})
        if doc:
            storage.write_text(storage.join(work, METRICS), json.dumps({**doc, "incremental": info}, indent=2) + "\n")
            doc["output"] = cfg.output
            doc["incremental"] = info
        else:
            doc = {"incremental": info, "output": cfg.output, "strategy": scoring.name, "deleted_only": True}
        info["summary"] = (
            f"rescore: committed table version {version} of {cfg.output}: {len(chosen.touched):,} batches replaced "
            f"({counted['rows']:,} rows) from {len(sources)} input files; {len(chosen.new)} new, "
            f"{len(chosen.changed)} changed, {len(chosen.deleted)} deleted"
            + (f"; filtered rows kept in {work}/filtered-*.parquet (not in the table)" if cfg.keep_filtered and sources else "")
        )
        return doc


def _check_unchanged(planned: dict, files: list[InputFile]) -> None:
    """Before the commit: every file the run read is still the one it planned from, and the one
    its bookkeeping records (size and footer as listed); else InputChanged (exit 1, nothing
    committed)."""
    listed = {f.path: f for f in files}
    for path, fp in planned.items():
        fingerprints.verify(path, fp)
        f = listed.get(path)
        if f is not None and (fp.stat[0], fp.footer) != (f.size, f.footer):
            raise fingerprints.InputChanged(
                f"{path} changed while the run was reading it (it differs from when the run listed it); "
                "nothing was committed: rerun once the input is complete"
            )


def _rows_after(output: str, state: State, work: str, touched: set[int], rebuild: bool) -> list[list[int]]:
    """Rows per batch the table holds after this run's commit (recorded in it, and checked by
    every reader: a damaged `_delta_log` that brings back or loses a file is then an error, not
    wrong rows): the staged rows of the touched batches and the table's other batches as they
    were (from the last commit's record, or counted once in a table of an earlier Rescore)."""
    import pyarrow.compute as pc

    counts: dict[int, int] = {}
    if not rebuild and state.version is not None:
        if state.rows is not None:
            counts = {b: n for lo, hi, n in state.rows for b in range(lo, hi + 1)}
        else:
            batch = pa.schema([("batch", pa.int64())])
            counts = batch_counts(pa.chunked_array([rb.column(0) for rb in _kept_rows(output, state.version, set(), batch)],
                                                   pa.int64()))
        counts = {b: n for b, n in counts.items() if b not in touched}
    keep = pa.array(sorted(touched), pa.int64())
    for path in storage.list_dir(work, SCORED_FILES):
        column = storage.open_parquet(path).read(columns=["batch"])["batch"]
        for b, n in batch_counts(column.filter(pc.is_in(column, value_set=keep))).items():
            counts[b] = counts.get(b, 0) + n
    return _count_ranges(counts)


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


def _next_state(state: State, chosen: Selection, files: list[InputFile], name: str, chash: str, strategy: str,
                inputs: list[str], info: dict, rebuild: bool) -> State:
    entries = {} if rebuild else {k: v for k, v in state.files.items() if k not in chosen.deleted}
    for f in files:
        if f.key in chosen.batches:
            entries[f.key] = {
                "size": f.size, "mtime": f.mtime, "footer": f.footer, "run": name,
                "batches": _ranges(chosen.batches[f.key]),
            }
    run_doc = {
        "run": name, "time": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **{k: info[k] for k in ("new_files", "changed_files", "deleted_files", "batches_rescored", "source_files")},
    }
    return State(None, chash, strategy, list(inputs), entries, [*state.runs, run_doc])


def _dry_run(cfg, scoring, state: State, rs, beam, plan_input) -> dict[str, Any]:
    """--dry_run=True: build the job graph for what a run would score now; submit nothing."""
    files = list_inputs(cfg.inputs)
    chosen = select(files, state, rebuild=bool(cfg.overwrite), skip_bad_files=cfg.skip_bad_files)
    sources = chosen.sources or files
    plan = plan_input([f.path for f in sources], needs=scoring.needs, shard_rows=cfg.shard_rows,
                      skip_bad_files=cfg.skip_bad_files)
    name = cfg.run_name or run_name()
    run_info = {"strategy": scoring.name, "output": cfg.output, "incremental": {"run": name}}
    run_info.update({
        "rescore_version": "", "algorithm": cfg.algorithm, "params": scoring.params,
        "config_hash": rs.config_hash(scoring.name, scoring.params, cfg.algorithm),
    })
    from apache_beam.options.pipeline_options import PipelineOptions

    p = beam.Pipeline(options=PipelineOptions(cfg.beam_args))
    rs.build(p, plan, scoring, replace(cfg, output=work_dir(cfg.output, name)), run_info)
    return {**run_info, "dry_run": True, "job": getattr(p.run(), "job", None)}
