"""WriteScored: bring each row's record back to its read unit, re-read the unit, and stage the
scored, filtered and rejected rows (published by Finalize, transforms/finalize.py).

The row work (token columns, copies, outcomes, metrics) is in transforms/rows/; here: the
GroupByKey by unit, the threads, the staged file names and counters."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.metrics import Metrics

from rescore.schemas import REJECT_REASON, output_schema, reason_category, rejected_schema
from rescore.schemas.experience import SCORE_FIELDS
from rescore.transforms import device as devices
from rescore.transforms import faults, storage
from rescore.transforms.copies import CopyPlans
from rescore.transforms.read import InputPlan, conform, read_unit
from rescore.transforms.rows.audit import AUDIT_FIELDS, FILTER_REASON
from rescore.transforms.rows.copies import copy_fields, expand_copies
from rescore.transforms.rows.metrics import row_metrics
from rescore.transforms.rows.outcomes import DUPLICATED, FILTERED, REJECTED, SCORED
from rescore.transforms.rows.tokens import part_bounds, score_columns
from rescore.transforms.strategies import StrategyChain
from rescore.transforms.unit_threads import Overlap, resolve_threads

STAGING = "_staging"
SUCCESS = "_SUCCESS"
METRICS = "metrics.json"
FILTERED_FILES = "filtered-*.parquet"
PLAIN_COLUMNS = ("advantages", "returns")
"""Written without dictionary encoding (see _WriteUnit.setup)."""


def staging_dir(output: str) -> str:
    return storage.join(output, STAGING)


class _WriteUnit(beam.DoFn):
    METRICS = "metrics"

    def __init__(
        self, plan: InputPlan, staging: str, scoring: StrategyChain, device: str = "auto", file_metadata=None, threads: int = 0,
        shard_rows: int = 65536, keep_filtered: bool = False, audit_columns: bool = False,
    ):
        self._keep_filtered = keep_filtered
        self._audit_columns = audit_columns
        self._shard_rows = shard_rows
        self._plan = plan
        self._staging = staging
        self._scoring = scoring
        self._device_choice = device
        self._file_metadata = dict(file_metadata or {})
        self._threads = threads

    def setup(self):
        self._device = devices.resolve(self._device_choice)
        self._copies = self._scoring.duplicates
        self._extra = (copy_fields(self._plan.task_type) if self._copies else []) + self._scoring.output_fields(self._plan.schema)
        metadata = {**(self._plan.schema.metadata or {}), **{k.encode(): v.encode() for k, v in self._file_metadata.items()}}
        self._audit = list(AUDIT_FIELDS) if self._audit_columns else []
        self._scored_schema = output_schema(self._plan.schema, self._extra + self._audit).with_metadata(metadata)
        added = {f.name for f in (*SCORE_FIELDS, *self._extra, *self._audit)}
        self._base_names = [n for n in self._scored_schema.names if n not in added]
        self._rejected_schema = rejected_schema(self._plan.schema).with_metadata(metadata)
        self._filtered_schema = pa.schema(
            [f for f in self._rejected_schema if f.name not in (REJECT_REASON, FILTER_REASON)] + [pa.field(FILTER_REASON, pa.string())],
            metadata=metadata,
        )
        # advantages and returns hold a value per token: a dictionary saves ~10 % of their size
        # and costs ~40 % of the file's encoding time, so they are written plain (snappy still
        # compresses the runs of equal values).
        self._dictionary = storage.dictionary_columns(self._scored_schema, PLAIN_COLUMNS)
        self._rows_written = Metrics.counter("rescore", "rows_written")
        threads = resolve_threads(self._threads)
        self._overlap = Overlap(threads, self._outputs)
        self._part_pool = ThreadPoolExecutor(threads, thread_name_prefix="rescore-part") if threads > 1 else None

    def _name(self, kind: str, unit: int, part: int | None = None) -> str:
        suffix = "" if part is None else f"-part-{part:03d}"
        return storage.join(self._staging, f"{kind}-{unit:05d}-of-{len(self._plan.units):05d}{suffix}.parquet")

    def _write_scored(self, table: pa.Table, unit_index: int) -> list[str]:
        """Stage the unit's scored rows: one file, or (a row group larger than --shard-rows, or
        copies past it) consecutive parts of at most shard_rows rows, written side by side."""
        bounds = part_bounds(table.num_rows, self._shard_rows)
        if len(bounds) == 2:
            names = [self._name("scored", unit_index)]
        else:
            names = [self._name("scored", unit_index, k) for k in range(len(bounds) - 1)]

        def write(k: int) -> None:
            part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
            storage.write_parquet(part, names[k], use_dictionary=self._dictionary)

        if self._part_pool is None or len(names) == 1:
            for k in range(len(names)):
                write(k)
        else:
            list(self._part_pool.map(write, range(len(names))))
        return names

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam, copy_plans=None):
        unit_index, parts = element
        yield from self._overlap.submit(self._work, unit_index, list(parts), copy_plans, window=window, timestamp=timestamp)

    def finish_bundle(self):
        yield from self._overlap.drain()

    def teardown(self):
        self._overlap.close()
        if self._part_pool is not None:
            self._part_pool.shutdown(wait=True)

    def _outputs(self, result):
        unit_index, files, rows_written, metrics = result
        self._rows_written.inc(rows_written)
        yield unit_index, files
        yield beam.pvalue.TaggedOutput(self.METRICS, metrics)

    def _work(self, unit_index: int, parts: list[pa.Table], copy_plans):
        """Read the unit back, attach its records and write its files (on an Overlap thread)."""
        unit = self._plan.units[unit_index]
        rec = pa.concat_tables(parts, promote_options="default")  # audit columns: null on rejected rows
        rec = rec.take(pa.array(np.argsort(rec["row"].to_numpy(), kind="stable")))
        rows = rec["row"].to_numpy()
        if len(rows) != unit.num_rows or not np.array_equal(rows, np.arange(unit.num_rows)):
            raise RuntimeError(
                f"internal error: read unit {unit_index} ({unit.path}) has {unit.num_rows} rows but "
                f"{len(rows)} outcomes ({len(np.unique(rows))} distinct); refusing to write it"
            )
        faults.maybe_pause_readback()
        table = conform(read_unit(unit), self._plan.schema)
        status = rec["status"].to_numpy()
        files = []

        kept = np.flatnonzero(status == SCORED)
        scored = table if len(kept) == table.num_rows else table.take(pa.array(kept))
        score_col = rec["score"].combine_chunks().take(pa.array(kept))
        valid = np.asarray(score_col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        score = np.asarray(score_col.fill_null(0.0).to_numpy(), dtype=np.float64)
        row_value = score * rec["token_scale"].to_numpy()[kept]
        extra_columns: list = []
        copied_batch = pa.array([], pa.int64())
        if self._copies:
            scored, source, extra_columns = expand_copies(scored, copy_plans or {}, self._plan.task_type)
            score, row_value, valid = score[source], row_value[source], valid[source]
            copied_batch = rec["batch"].combine_chunks().take(pa.array(kept[source[len(kept):]]))
        extra_columns += self._scoring.output_columns(scored, self._extra[2 if self._copies else 0 :])
        if self._audit:
            at = pa.array(kept if not self._copies else kept[source])
            extra_columns += [rec[f.name].combine_chunks().take(at).cast(f.type) for f in self._audit]
        token_values = None
        if self._scoring.token_level:
            token_values, score = self._scoring.token_values(scored, score, row_value)
        columns = scored.select(self._base_names).columns + score_columns(
            scored, row_value, score, None if valid.all() else valid, token_values, self._device
        )
        scored = pa.Table.from_arrays(columns + extra_columns, schema=self._scored_schema)
        files += self._write_scored(scored, unit_index)
        faults.maybe_slow_write()

        dropped = np.flatnonzero(status == FILTERED) if self._keep_filtered else []
        if len(dropped):
            filtered = table.take(pa.array(dropped)).select(self._filtered_schema.names[:-1])
            why = rec["reason"].combine_chunks().take(pa.array(dropped))
            filtered = filtered.append_column(FILTER_REASON, why.cast(pa.string()))
            files.append(self._name("filtered", unit_index))
            storage.write_parquet(filtered.replace_schema_metadata(self._filtered_schema.metadata), files[-1])

        bad = np.flatnonzero(status == REJECTED)
        reasons = rec["reason"].to_numpy(zero_copy_only=False)[bad]
        if len(bad):
            rejected = table.take(pa.array(bad)).select(self._rejected_schema.names[:-1])
            rejected = rejected.append_column(REJECT_REASON, pa.array(reasons, pa.string()))
            rejected = rejected.replace_schema_metadata(self._rejected_schema.metadata)
            files.append(self._name("rejected", unit_index))
            storage.write_parquet(rejected, files[-1])
        return unit_index, files, scored.num_rows, self._metrics(rec, status, reasons, copied_batch)

    @staticmethod
    def _metrics(rec: pa.Table, status: np.ndarray, reasons: np.ndarray, copied_batch: pa.Array) -> pa.Table:
        category = np.full(len(status), None, dtype=object)
        category[status == REJECTED] = [reason_category(r) for r in reasons]
        batch = pa.concat_arrays([rec["batch"].combine_chunks(), copied_batch])
        status = np.concatenate([status, np.full(len(copied_batch), DUPLICATED, np.int8)])
        return row_metrics(batch, status, category.tolist() + [None] * len(copied_batch))


class WrittenUnits(NamedTuple):
    """What WriteScored returns."""

    files: beam.PCollection
    """(unit, [staged paths]) for every read unit."""
    metrics: beam.PCollection
    """One ROW_METRICS table per read unit."""


class WriteScored(beam.PTransform):
    """(unit, records) for every row -> WrittenUnits: staged scored, filtered and rejected
    Parquet, one file (or --shard-rows parts) per read unit; with `copies` (PlanCopies), each
    unit's kept rows followed by their copies."""

    def __init__(
        self, plan: InputPlan, output: str, scoring: StrategyChain, copies: CopyPlans | None = None, *, device: str = "auto",
        accelerator: str | None = None, file_metadata: dict[str, str] | None = None, threads: int = 0,
        shard_rows: int = 65536, keep_filtered: bool = False, audit_columns: bool = False,
    ):
        super().__init__()
        self._keep_filtered = keep_filtered
        self._audit_columns = audit_columns
        self._threads = threads
        self._shard_rows = shard_rows
        self._plan = plan
        self._output = output
        self._scoring = scoring
        self._copies = copies
        self._device = device
        self._accelerator = accelerator
        self._file_metadata = file_metadata

    def expand(self, unit_records):
        side = {} if self._copies is None else {"copy_plans": beam.pvalue.AsDict(self._copies.plans)}
        write = beam.ParDo(
            _WriteUnit(
                self._plan, staging_dir(self._output), self._scoring, self._device, self._file_metadata, self._threads,
                self._shard_rows, self._keep_filtered, self._audit_columns,
            ),
            **side,
        )
        write = write.with_outputs(_WriteUnit.METRICS, main="files")
        if self._accelerator:
            write = write.with_resource_hints(accelerator=self._accelerator)
        written = unit_records | "GroupByUnit" >> beam.GroupByKey() | "ReadBackAndWrite" >> write
        return WrittenUnits(written.files, written.metrics)
