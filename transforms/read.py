"""Reading experience Parquet: the input plan (checked before the pipeline starts) and
ReadExperiences, which turns each read unit into light rows keyed by shuffle bucket."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from rescore.errors import InputError
from rescore.schemas import SchemaError, check_rows, unify, validate_file_schema
from rescore.transforms import coders  # noqa: F401  (registers the Arrow table coder)
from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import storage
from rescore.transforms.files import unit_cache
from rescore.transforms.rows.keys import bucket_of, light_columns, light_rows, split_by
from rescore.transforms.rows.model_columns import apply_model_rejects, join_model_columns
from rescore.transforms.rows.outcomes import rejected_records
from rescore.transforms.unit_threads import Overlap, resolve_threads


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


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__


def _footer(path: str):
    try:
        pf = storage.open_parquet(path)
        return pf.schema_arrow, [pf.metadata.row_group(i).num_rows for i in range(pf.num_row_groups)]
    except Exception as e:  # pyarrow raises several types for truncated or foreign files
        raise InputError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None


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


def _checked_footer(path: str, needs: tuple[str, ...]):
    """(schema, row counts, warnings, fingerprint) of one file, or the InputError/SchemaError it
    raises."""
    try:
        try:
            planned = fingerprints.take(path)
        except OSError as e:
            raise InputError(f"{path}: cannot be read ({e.strerror or _first_line(e)})") from None
        schema, counts = _footer(path)
        warnings = validate_file_schema(path, schema, needs=needs)
        if any(schema.field(n).type == pa.uint64() for n in (*RANGE_CHECKED_IDS, "reward") if n in schema.names) or (
            "reward" in schema.names and schema.field("reward").type == pa.int64()
        ):
            try:
                check_value_ranges(path, storage.open_parquet(path))
            except InputError:
                raise
            except Exception as e:  # noqa: BLE001  (pyarrow raises several types for broken pages)
                raise InputError(f"{path}: not a readable Parquet file ({_first_line(e)})") from None
        try:
            fingerprints.verify(path, planned)
        except fingerprints.InputChanged:
            raise InputError(f"{path} changed while the run was planning from it; rerun once the input is complete") from None
        return schema, counts, warnings, planned
    except (InputError, SchemaError) as e:
        return e


def plan_input(
    patterns: list[str], *, needs: tuple[str, ...] = (), shard_rows: int = 65536, skip_bad_files: bool = False
) -> InputPlan:
    """Match the input, read every file's footer and check its schema; split into read units.

    Raises InputError or SchemaError with a one-line message naming the file and column. With
    `skip_bad_files`, an unreadable file or one whose schema breaks the contract is left out
    and listed in `skipped` instead (unless no file is left).
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
            raise InputError(f"no input files match {pattern!r}")
        files.extend(p for p, _ in found if p not in odd)
    files = sorted(set(files))
    if not files:
        raise InputError(f"no readable input files: all {len(odd)} were skipped ({next(iter(odd.values()))})")
    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        checked = list(pool.map(lambda path: _checked_footer(path, needs), files))
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
    for path, (_, row_counts) in zip(files, footers):
        for groups in split_row_groups(row_counts, shard_rows):
            units.append(ReadUnit(len(units), path, groups, sum(row_counts[g] for g in groups), fingerprint=planned[path]))
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


def read_unit(unit: ReadUnit, columns: list[str] | None = None) -> pa.Table:
    """The unit's rows in file order (columns=None: all of them).

    A file whose footer read fine but whose data pages do not decode fails with a message
    naming the file and row groups (the plan cannot see that without reading every page).
    """
    if unit.fingerprint is not None:
        fingerprints.verify(unit.path, unit.fingerprint)
    try:
        pf = storage.open_parquet(unit.path)
        if columns is not None:
            present = set(pf.schema_arrow.names)
            columns = [c for c in columns if c in present]
        table = pf.read_row_groups(list(unit.row_groups), columns=columns)
    except OSError as e:
        raise OSError(f"{unit.path}: cannot read row groups {list(unit.row_groups)}: {_first_line(e)}") from e
    except (pa.ArrowException, ValueError) as e:
        raise ValueError(f"{unit.path}: corrupt data in row groups {list(unit.row_groups)}: {_first_line(e)}") from e
    if unit.fingerprint is not None:  # a write during the read shows in stat()
        fingerprints.same_stat(unit.path, unit.fingerprint)
    if table.num_rows != unit.num_rows:
        raise ValueError(f"{unit.path}: row groups {list(unit.row_groups)} hold {table.num_rows} rows, the footer says {unit.num_rows}")
    if unit.model_file is not None:
        table = join_model_columns(table, storage.open_parquet(unit.model_file).read())
    return table


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns: missing ones null, narrower types widened."""
    if table.schema.equals(schema, check_metadata=False):
        return table
    arrays = []
    for field in schema:
        if field.name in table.column_names:
            col = table[field.name]
            arrays.append(col if col.type == field.type else col.cast(field.type))
        else:
            arrays.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(arrays, schema=schema)


class _ReadLight(beam.DoFn):
    REJECTED = "rejected"

    def __init__(self, plan: InputPlan, needs: tuple[str, ...], buckets: int, threads: int = 0):
        self._units = plan.units
        self._task_type = plan.task_type
        self._needs = tuple(needs)
        self._buckets = buckets
        self._threads = threads

    def setup(self):
        self._rows_read = Metrics.counter("rescore", "rows_read")
        self._rows_rejected = Metrics.counter("rescore", "rows_rejected")
        self._overlap = Overlap(resolve_threads(self._threads), self._outputs)
        unit_cache.expect(self._units)

    def _work(self, unit_index: int):
        """Read and validate one unit (on an Overlap thread): (rows, rejected records, light parts)."""
        unit = self._units[unit_index]
        table = read_unit(unit, light_columns(self._needs))
        unit_cache.offer(unit, table)  # the write step takes it instead of reading the unit again
        check = apply_model_rejects(table, check_rows(table, needs=self._needs))
        bad = np.flatnonzero(~check.ok)
        rejected = None
        if len(bad):
            batch = table["batch"].take(pa.array(bad))
            rejected = (unit.index, rejected_records(bad, batch, check.reasons[bad]))
        light = light_rows(unit.index, table, check, task_type=self._task_type, needs=self._needs)
        return table.num_rows, rejected, list(split_by(light, bucket_of(light, self._buckets)))

    def _outputs(self, result):
        rows, rejected, parts = result
        self._rows_read.inc(rows)
        if rejected is not None:
            self._rows_rejected.inc(rejected[1].num_rows)
            yield beam.pvalue.TaggedOutput(self.REJECTED, rejected)
        yield from parts

    def process(self, unit_index: int, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
        yield from self._overlap.submit(self._work, unit_index, window=window, timestamp=timestamp)

    def finish_bundle(self):
        yield from self._overlap.drain()

    def teardown(self):
        self._overlap.close()


class ReadRows(NamedTuple):
    """What ReadExperiences returns."""

    light: beam.PCollection
    """(bucket, light rows): the valid rows, whole task groups per bucket (rows/keys.py)."""
    rejected: beam.PCollection
    """(unit, records): rows that failed validation."""


class ReadExperiences(beam.PTransform):
    """Read every unit of the plan and validate its rows -> ReadRows (light rows by bucket,
    rejected rows by unit)."""

    def __init__(self, plan: InputPlan, *, needs: tuple[str, ...], buckets: int, threads: int = 0):
        super().__init__()
        self._plan = plan
        self._needs = tuple(needs)
        self._buckets = buckets
        self._threads = threads

    def expand(self, pbegin) -> ReadRows:
        # Applied to the pipeline, it reads every unit; applied to a PCollection of unit
        # indices (the model stage's output), each unit once that is ready.
        if isinstance(pbegin, beam.pvalue.PBegin):
            units = pbegin | "Units" >> beam.Create([u.index for u in self._plan.units])
        else:
            units = pbegin
        read = units | "ReadAndValidate" >> beam.ParDo(
            _ReadLight(self._plan, self._needs, self._buckets, self._threads)
        ).with_output_types(tuple[int, pa.Table]).with_outputs(_ReadLight.REJECTED, main="light")
        return ReadRows(read.light, read.rejected)
