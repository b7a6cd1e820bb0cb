"""WriteScored: bring each row's record back to its read unit, re-read the unit, and stage the
scored, filtered and rejected rows (published by Finalize, transforms/finalize.py).

The row work (token columns, copies, outcomes, metrics) is in transforms/rows/; here: the
GroupByKey by unit, the threads, the staged file names and counters."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from rescore.transforms import device as devices
from rescore.transforms import host_math
from rescore.transforms import fault_injection, memory
from rescore.transforms.copies import CopyPlans
from rescore.transforms.files import progress_marks, storage
from rescore.transforms.files.layout import filtered_file, rejected_file, scored_file, staging_dir
from rescore.transforms.input_plan import InputPlan
from rescore.transforms.rows.output_rows import (
    filtered_rows,
    output_schemas,
    rejected_rows,
    written_rows,
    shaped_schema,
    shaped_table,
    unit_metrics,
    unit_outcomes,
)
from rescore.transforms.files.layout import part_bounds
from rescore.transforms.files import parquet_out
from rescore.transforms.settings import StepSettings
from rescore.transforms.strategies import StrategyChain
from rescore.transforms.unit_read import conform
from rescore.transforms.unit_store import UnitStoreHandle
from rescore.transforms.unit_threads import Overlap, resolve_threads

PLAIN_COLUMNS = ("advantages", "returns")
"""Written without dictionary encoding where pyarrow writes the file (see files/parquet_out.py):
a dictionary per token saves ~10 % of their size and costs ~40 % of the file's encoding time."""


class _WriteUnit(beam.DoFn):
    METRICS = "metrics"

    def __init__(
        self, plan: InputPlan, staging: str, scoring: StrategyChain, settings: StepSettings, file_metadata=None,
        unit_store: UnitStoreHandle | None = None, host: bool = False,
    ):
        """host: the run may score on numpy (transforms/host_math.py eligible): where this
        worker's math is on the CPU, torch is not imported (the token broadcast is numpy's)."""
        self._host_eligible = host
        self._unit_store = unit_store
        self._plan = plan
        self._staging = staging
        self._scoring = scoring
        self._settings = settings
        self._file_metadata = dict(file_metadata or {})

    def setup(self):
        self._store = self._unit_store.acquire()
        self._device = None if host_math.on_host(self._host_eligible, self._settings) else devices.resolve(self._settings.device)
        self._schema = shaped_schema(self._plan.schema) if self._scoring.shaping else self._plan.schema
        self._schemas = output_schemas(
            self._schema, self._plan.task_type, self._scoring, self._file_metadata, self._settings.audit_columns
        )
        self._rows_written = Metrics.counter("rescore", "rows_written")
        self._arenas: set[int] = set()  # the write threads' (their freed pages are theirs to reuse)
        threads = self._store.fit(self._plan.units, resolve_threads(self._settings.io_threads))
        self._overlap = Overlap(threads, self._outputs)
        self._part_pool = ThreadPoolExecutor(threads, thread_name_prefix="rescore-part") if threads > 1 else None

    def _name(self, file_name: Callable[..., str], unit: int, *part: int) -> str:
        return storage.join(self._staging, file_name(unit, len(self._plan.units), *part))

    def _write_scored(self, table: pa.Table, unit_index: int) -> list[str]:
        """Stage the unit's scored rows: one file, or (copies past --shard-rows; a unit itself
        holds at most shard_rows rows) consecutive parts of at most shard_rows rows, written side
        by side."""
        bounds = part_bounds(table.num_rows, self._settings.shard_rows)
        if len(bounds) == 2:
            names = [self._name(scored_file, unit_index)]
        else:
            names = [self._name(scored_file, unit_index, k) for k in range(len(bounds) - 1)]

        def write(k: int) -> None:
            part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
            parquet_out.write_table(part, names[k], plain=PLAIN_COLUMNS)

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
        self._store = None

    def _outputs(self, result):
        unit_index, files, rows_written, metrics = result
        # The unit's table, freed with its work, in the arena of the thread that decoded it:
        # nothing reuses it. Where the step decodes units again (the cache did not keep them
        # all), the write threads' own arenas are kept: their next decode reuses those pages.
        memory.hand_back_freed(frozenset(self._arenas) if self._store.decoded_again else frozenset())
        self._rows_written.inc(rows_written)
        yield unit_index, files
        yield beam.pvalue.TaggedOutput(self.METRICS, metrics)

    def _work(self, unit_index: int, parts: list[pa.Table], copy_plans):
        """Read the unit back, attach its records and write its files (on an Overlap thread)."""
        unit = self._plan.units[unit_index]
        arena = memory.this_threads_arena()
        if arena is not None:
            self._arenas.add(arena)
        rec = unit_outcomes(parts, unit_index, unit.num_rows, unit.path)
        fault_injection.maybe_pause_readback()
        table = conform(self._store.read_back(unit), self._plan.schema)
        if self._scoring.shaping:  # the shaped reward is written; the input's as reward_original
            table = shaped_table(table, rec, self._schema)
        scored, copied_batch, rec = written_rows(  # (rows with an unwritable number: rejected)
            table, rec, self._schemas, self._scoring, copy_plans, self._plan.task_type, self._device
        )
        files = self._write_scored(scored, unit_index)
        fault_injection.maybe_slow_write()
        fault_injection.maybe_hold("write")  # tests: the scored file is staged, the rest not yet
        filtered = filtered_rows(table, rec, self._schemas) if self._settings.keep_filtered else None
        if filtered is not None:
            files.append(self._name(filtered_file, unit_index))
            parquet_out.write_table(filtered, files[-1])
        rejected = rejected_rows(table, rec, self._schemas)
        if rejected is not None:
            files.append(self._name(rejected_file, unit_index))
            parquet_out.write_table(rejected, files[-1])
        progress_marks.mark(progress_marks.progress_dir(self._staging), progress_marks.write_mark(unit_index))
        return unit_index, files, scored.num_rows, unit_metrics(rec, copied_batch)


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
        self, plan: InputPlan, output: str, scoring: StrategyChain, copies: CopyPlans | None = None,
        settings: StepSettings = StepSettings(), *, file_metadata: dict[str, str] | None = None,
        unit_store: UnitStoreHandle | None = None,
    ):
        """settings: the run's (device, accelerator, io_threads, shard_rows, keep_filtered,
        audit_columns); file_metadata: key-value metadata of every file written. unit_store: the
        run's UnitStoreHandle (transforms/unit_store.py), whose cache holds the units the read
        step kept; None: a store of this step's own (every unit is read)."""
        super().__init__()
        self._write = _WriteUnit(
            plan, staging_dir(output), scoring, settings, file_metadata, unit_store or UnitStoreHandle(cache_mb=0),
            host_math.eligible(scoring, settings),
        )
        self._copies = copies
        self._hints = {"accelerator": settings.accelerator} if settings.accelerator else {}

    def expand(self, unit_records) -> WrittenUnits:
        side = {} if self._copies is None else {"copy_plans": beam.pvalue.AsDict(self._copies.plans)}
        write = beam.ParDo(self._write, **side).with_outputs(_WriteUnit.METRICS, main="files")
        if self._hints:
            write = write.with_resource_hints(**self._hints)
        written = unit_records | "GroupByUnit" >> beam.GroupByKey() | "ReadBackAndWrite" >> write
        return WrittenUnits(written.files, written.metrics)
