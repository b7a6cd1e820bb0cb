"""The input plan, without Beam: matching the input, checking every file's footer and schema
before the pipeline starts, and splitting files into read units (ReadUnit).

Reading a unit is transforms/unit_read.py; what one process keeps of the units it read (the
prefetch, the cache between the two reads, the read-ahead) is transforms/unit_store.py. Nothing
here imports Beam where the input is local, so the `rescore` command can plan and decode the
first read units before it imports Beam and torch (pipelines/early.py). The Beam step that
reads units for their light rows is ReadExperiences (transforms/read.py).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.errors import InputError, first_line
from rescore.schemas import SchemaError, unify, validate_file_schema
from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import storage
from rescore.transforms.files.layout import part_bounds


@dataclass(frozen=True)
class ReadUnit:
    """Consecutive row groups of one file: read, scored back and written as one piece."""

    index: int
    path: str
    row_groups: tuple[int, ...]
    num_rows: int
    model_file: str | None = None
    """The model stage's side file of this unit (columns computed by a model), joined on read."""
    fingerprint: fingerprints.Fingerprint | None = None
    """The file as planned; every read checks it is still that file (transforms/files/fingerprint.py)."""
    rows: tuple[int, int] | None = None
    """Rows [start, stop) of its one row group, where that row group holds more than --shard-rows
    rows and is read as several units (file_units; transforms/files/row_group_slices.py)."""
    size: int = field(default=0, compare=False)
    """Its uncompressed bytes by the file's footer (its share of the file's; 0: not known), for
    the memory plan (transforms/memory.py) without reading the footer again."""

    def where(self) -> str:
        """The unit's rows, for messages: "row groups [0, 1]" or "rows 0-65535 of row group 0"."""
        if self.rows is None:
            return f"row groups {list(self.row_groups)}"
        return f"rows {self.rows[0]}-{self.rows[1] - 1} of row group {self.row_groups[0]}"


@dataclass(frozen=True)
class InputPlan:
    files: tuple[str, ...]
    units: tuple[ReadUnit, ...]
    schema: pa.Schema
    """All input files' schemas unified: the columns every output row carries."""
    task_type: pa.DataType
    warnings: tuple[str, ...]
    skipped: tuple[tuple[str, str], ...] = ()
    """(path, reason) of files left out by --skip-bad-files."""

    @property
    def num_rows(self) -> int:
        return sum(u.num_rows for u in self.units)


def _footer(path: str, metadata=None):
    """(Arrow schema, rows of each row group, uncompressed bytes of each row group by the footer)."""
    try:
        pf = storage.open_parquet(path, metadata=metadata)
        groups = [pf.metadata.row_group(i) for i in range(pf.num_row_groups)]
        return pf.schema_arrow, [g.num_rows for g in groups], [g.total_byte_size for g in groups]
    except Exception as e:  # pyarrow raises several types for truncated or foreign files
        raise InputError(f"{path}: not a readable Parquet file ({first_line(e)})") from None


RANGE_CHECKED_IDS = ("batch", "task", "run", "step", "prompt_length")
MAX_EXACT_REWARD = 2**53
"""Integers up to 2^53 in magnitude convert to float64 exactly; larger integer rewards do not."""


def _column_range(pf, name: str) -> tuple[int, int] | None:
    """(min, max) of a top-level integer column: the footer's row-group statistics where every
    row group has them, else the column itself (read once). None for a column of nulls."""
    meta = pf.metadata
    index = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == name), None)
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(index).statistics if index is not None else None
        if meta.row_group(g).num_rows == 0:
            continue
        if stats is None or not stats.has_min_max:
            result = pc.min_max(pf.read(columns=[name])[name])
            low, high = result["min"].as_py(), result["max"].as_py()
            return None if low is None else (int(low), int(high))
        lows.append(int(stats.min))
        highs.append(int(stats.max))
    return (min(lows), max(highs)) if lows else None


def check_value_ranges(path: str, pf) -> None:
    """Values the footer admits but Rescore cannot hold exactly: uint64 ids >= 2^63 (ids are
    int64 from here on) and integer rewards past 2^53 (rewards are float64). InputError (exit 2)
    naming the file and column; a wrapped or rounded id or reward would score the wrong rows."""
    schema = pf.schema_arrow
    for name in RANGE_CHECKED_IDS:
        if name in schema.names and schema.field(name).type == pa.uint64():
            found = _column_range(pf, name)
            if found and found[1] > np.iinfo(np.int64).max:
                raise InputError(
                    f"{path}: column {name!r} (uint64) holds {found[1]}, more than the largest int64 "
                    f"({np.iinfo(np.int64).max}) that Rescore uses for ids"
                )
    if "reward" in schema.names and pa.types.is_integer(schema.field("reward").type):
        if schema.field("reward").type.bit_width > 32:
            found = _column_range(pf, "reward")
            if found and max(abs(found[0]), abs(found[1])) > MAX_EXACT_REWARD:
                value = found[1] if abs(found[1]) >= abs(found[0]) else found[0]
                raise InputError(
                    f"{path}: column 'reward' holds the integer {value}, which float64 cannot represent "
                    f"exactly (integer rewards must be within +-2^53)"
                )


def _checked_footer(path: str, needs: tuple[str, ...], given=None):
    """(schema, (row counts, bytes of each row group), warnings, fingerprint) of one file, or the InputError/SchemaError it
    raises. `given`: (fingerprint, parsed footer) of the one read of its footer the caller made
    (transforms/files/selection.py: list_inputs), not read again."""
    try:
        if given is not None:
            planned, metadata = given
        else:
            try:
                planned = fingerprints.take(path)
            except OSError as e:
                raise InputError(f"{path}: cannot be read ({e.strerror or first_line(e)})") from None
            metadata = None
        schema, counts, group_bytes = _footer(path, metadata)
        warnings = validate_file_schema(path, schema, needs=needs)
        if any(schema.field(n).type == pa.uint64() for n in (*RANGE_CHECKED_IDS, "reward") if n in schema.names) or (
            "reward" in schema.names and schema.field("reward").type == pa.int64()
        ):
            try:
                check_value_ranges(path, storage.open_parquet(path, metadata=metadata))
            except InputError:
                raise
            except Exception as e:  # noqa: BLE001  (pyarrow raises several types for broken pages)
                raise InputError(f"{path}: not a readable Parquet file ({first_line(e)})") from None
        try:
            if given is None:  # given: the fingerprint and the footer come from one read
                fingerprints.verify(path, planned)
        except fingerprints.InputChanged:
            raise InputError(f"{path} changed while the run was planning from it; rerun once the input is complete") from None
        return schema, (counts, group_bytes), warnings, planned
    except (InputError, SchemaError) as e:
        return e


def _what_is_there(pattern: str) -> str:
    """What a local pattern that matched nothing found instead: a directory's other files (CSV,
    JSON, ...), subdirectories, or that the directory is missing."""
    if "://" in pattern:
        return ""
    import glob as globs

    directory = pattern if os.path.isdir(pattern) else os.path.dirname(pattern) or "."
    if any(c in directory for c in "*?["):
        return ""
    if not os.path.isdir(directory):
        return f" ({directory} does not exist)"
    entries = sorted(os.listdir(directory))
    if not entries:
        return f" ({directory} is empty)"
    files = [e for e in entries if os.path.isfile(os.path.join(directory, e))]
    dirs = [e for e in entries if os.path.isdir(os.path.join(directory, e))]
    parts = []
    if files:
        kinds = sorted({os.path.splitext(f)[1] or "(no extension)" for f in files})
        shown = ", ".join(files[:3]) + (", ..." if len(files) > 3 else "")
        parts.append(f"{len(files)} other file{'s' if len(files) != 1 else ''} ({', '.join(kinds)}: {shown})")
    if dirs:
        nested = [d for d in dirs if globs.glob(os.path.join(directory, d, "**", "*.parquet"), recursive=True)]
        parts.append(f"{len(dirs)} subdirector{'ies' if len(dirs) != 1 else 'y'}"
                     + (f", with Parquet in {', '.join(nested[:3])} (try --input '{os.path.join(directory, nested[0], '*.parquet')}')" if nested else ""))
    what = " and ".join(parts)
    hint = "; Rescore reads Parquet files (*.parquet), or --input-table / --input-format for SQL buffers and verl dumps"
    return f": {directory} holds {what}{hint}"


def plan_input(
    patterns: list[str], *, needs: tuple[str, ...] = (), shard_rows: int = 65536, skip_bad_files: bool = False,
    footers: dict | None = None,
) -> InputPlan:
    """Match the input, read every file's footer and check its schema; split into read units.

    Raises InputError or SchemaError with a one-line message naming the file and column. With
    `skip_bad_files`, an unreadable file or one whose schema breaks the contract is left out
    and listed in `skipped` instead (unless no file is left). `footers`: {path: (fingerprint,
    parsed footer)} of files whose footer the caller has read (an incremental run's input).
    """
    files: list[str] = []
    odd: dict[str, str] = {}
    for pattern in patterns:
        found = storage.match(pattern)
        strange = storage.odd_matches(pattern)
        for path, kind in strange:  # never opened: a FIFO or a device would block or never end
            if not skip_bad_files:
                raise InputError(f"{path}: {kind}, not a Parquet file (matched by {pattern!r})")
            odd[path] = f"{path}: {kind}, not a Parquet file"
        if not found and not strange:
            raise InputError(f"no input files match {pattern!r}{_what_is_there(pattern)}")
        files.extend(p for p, _ in found if p not in odd)
    files = sorted(set(files))
    if not files:
        raise InputError(f"no readable input files: all {len(odd)} were skipped ({next(iter(odd.values()))})")
    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        checked = list(pool.map(lambda path: _checked_footer(path, needs, (footers or {}).get(path)), files))
    skipped: list[tuple[str, str]] = sorted(odd.items())
    good: list[tuple[str, tuple]] = []
    for path, result in zip(files, checked):
        if isinstance(result, Exception):
            if not skip_bad_files:
                raise result
            skipped.append((path, str(result)))
        else:
            good.append((path, result))
    if not good:
        raise InputError(f"no readable input files: all {len(files)} were skipped ({skipped[0][1]})")
    files = [p for p, _ in good]
    footers = [(schema, counts) for _, (schema, counts, _, _) in good]
    planned = {path: fp for path, (_, _, _, fp) in good}
    warnings: list[str] = [w for _, (_, _, ws, _) in good for w in ws]
    warnings += [f"skipping {reason}" for _, reason in skipped]
    schema = unify([(p, s) for p, (s, _) in zip(files, footers)])
    schema = pa.schema([f.with_nullable(True) for f in schema], metadata=schema.metadata)
    task_type = pa.int64() if pa.types.is_integer(schema.field("task").type) else pa.string()

    units: list[ReadUnit] = []
    for path, (_, (row_counts, group_bytes)) in zip(files, footers):
        units += file_units(path, row_counts, shard_rows, first=len(units), fingerprint=planned[path], group_bytes=group_bytes)
        if not row_counts or sum(row_counts) == 0:
            warnings.append(f"{path}: file holds no rows")
    return InputPlan(tuple(files), tuple(units), schema, task_type, tuple(warnings), tuple(skipped))


def split_row_groups(row_counts: list[int], shard_rows: int) -> list[tuple[int, ...]]:
    """A file's non-empty row groups in consecutive runs of about equal rows, each at most
    `shard_rows` (a single larger row group is a run of its own).

    The file's rows are spread over ceil(rows / shard_rows) runs where row groups allow, so the
    read units (and output files) of a file are about the same size: 13 row groups of 16,384
    rows with shard_rows 65,536 give 4 + 3 + 3 + 3, not 4 + 4 + 4 + 1, and read units that are
    processed side by side finish together.
    """
    groups = [(g, n) for g, n in enumerate(row_counts) if n > 0]
    total = sum(n for _, n in groups)
    if not total:
        return []
    target = total / -(-total // shard_rows)
    runs: list[tuple[int, ...]] = []
    run: list[int] = []
    rows = done = 0
    for g, n in groups:
        # Close the run where the next group would pass the cap, or would end it further from
        # the next even cut (done + target) than stopping here does.
        if run and (rows + n > shard_rows or done + rows + n / 2 > (len(runs) + 1) * target):
            runs.append(tuple(run))
            done += rows
            run, rows = [], 0
        run.append(g)
        rows += n
    runs.append(tuple(run))
    return runs


UNIT_BYTES = 192 << 20
"""A read unit holds at most --shard-rows rows and, where a file's rows are wide, about this many
bytes by its footer (uncompressed Parquet: ~0.7 of the decoded Arrow table). 65,536 rows of
256-token responses are ~130 MB by the footer (unchanged), of 4,096-token ones ~1.7 GB, which
a unit in flight would hold 3.5 times over (transforms/memory.py): such a file is cut into
units of ~7,500 rows instead. The input alone decides it, never the machine: the same input
gives the same files everywhere."""


UNIT_MIN_ROWS = 1024
"""The cap by bytes never makes units of fewer rows (rows over ~190 KB each): a file of huge rows
would otherwise become one unit, and one output file, per few rows."""


def unit_rows(shard_rows: int, rows: int, data_bytes: int | None) -> int:
    """Rows per read unit of a file of `rows` rows and `data_bytes` bytes by its footer:
    `shard_rows`, or fewer (at least UNIT_MIN_ROWS) where that many of its rows hold more than
    UNIT_BYTES."""
    if not data_bytes or rows <= 0:
        return shard_rows
    return min(shard_rows, max(UNIT_MIN_ROWS, int(UNIT_BYTES * rows // data_bytes)))


def file_units(
    path: str, row_counts: list[int], shard_rows: int, *, first: int = 0, fingerprint: fingerprints.Fingerprint | None = None,
    group_bytes: list[int] | None = None,
) -> list[ReadUnit]:
    """The read units of one file, numbered from `first`: runs of its row groups
    (split_row_groups), and a row group of more than `shard_rows` rows cut into slices of about
    equal rows (part_bounds), each a unit of its own. `group_bytes`: each row group's size by
    the footer (uncompressed), which lowers the rows per unit of wide rows (unit_rows) and gives
    each unit its `size`."""
    sizes = list(group_bytes) if group_bytes is not None and len(group_bytes) == len(row_counts) else [0] * len(row_counts)
    shard_rows = unit_rows(shard_rows, sum(row_counts), sum(sizes))

    units: list[ReadUnit] = []
    for groups in split_row_groups(row_counts, shard_rows):
        rows = sum(row_counts[g] for g in groups)
        if len(groups) == 1 and rows > shard_rows:
            bounds = part_bounds(rows, shard_rows)
            for start, stop in zip(bounds[:-1], bounds[1:]):
                units.append(ReadUnit(first + len(units), path, groups, stop - start, fingerprint=fingerprint, rows=(start, stop),
                                      size=int(sizes[groups[0]] * (stop - start) / rows)))
        else:
            units.append(ReadUnit(first + len(units), path, groups, rows, fingerprint=fingerprint, size=sum(sizes[g] for g in groups)))
    return units


def planned_file_units(path: str, shard_rows: int) -> list[ReadUnit]:
    """The read units of one file as plan_input makes them, numbered from 0 (its footer and
    fingerprint only, without the schema checks: the prefetch's, transforms/unit_store.py)."""
    planned = fingerprints.take(path)
    _, counts, group_bytes = _footer(path)
    fingerprints.verify(path, planned)
    return file_units(path, counts, shard_rows, fingerprint=planned, group_bytes=group_bytes)
