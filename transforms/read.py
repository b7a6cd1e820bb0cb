"""ReadExperiences: each read unit read, validated and turned into light rows keyed by shuffle
bucket. The input plan is transforms/input_plan.py, the reads transforms/unit_read.py, what the
process keeps of them (prefetch, unit cache) transforms/unit_store.py (no Beam)."""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from rescore.errors import InputError  # noqa: F401  (the old name rescore.transforms.read.InputError)
from rescore.schemas import check_rows
from rescore.transforms import device as devices
from rescore.transforms import fault_injection, memory
from rescore.transforms.coders import unit_tables  # (and registers the Arrow table coder)
from rescore.transforms.files import progress_marks
from rescore.transforms.input_plan import InputPlan, ReadUnit, plan_input, split_row_groups  # noqa: F401  (the plan's names, as before)
from rescore.transforms.rows.keys import WHOLE_BATCH, bucket_of, light_columns, light_rows, split_by
from rescore.transforms.rows.model_columns import apply_model_rejects
from rescore.transforms.rows.outcomes import rejected_records
from rescore.transforms.settings import StepSettings
from rescore.transforms.unit_read import conform, read_unit  # noqa: F401  (as before)
from rescore.transforms.unit_store import UnitStoreHandle
from rescore.transforms.unit_threads import Overlap, resolve_threads


class _ReadLight(beam.DoFn):
    REJECTED = "rejected"

    def __init__(
        self, plan: InputPlan, needs: tuple[str, ...], settings: StepSettings, keep_units: bool = False,
        progress: str | None = None, unit_store: UnitStoreHandle | None = None, task_history: dict | None = None,
    ):
        self._units = plan.units
        self._task_history = task_history
        self._unit_store = unit_store
        self._progress = progress
        self._task_type = plan.task_type
        self._needs = tuple(needs)
        self._settings = settings
        self._keep_units = keep_units

    def setup(self):
        self._rows_read = Metrics.counter("rescore", "rows_read")
        self._rows_rejected = Metrics.counter("rescore", "rows_rejected")
        self._store = self._unit_store.acquire()
        devices.release_gpu_pages(self._settings.device)  # before the plan and the units (transforms/device.py)
        self._overlap = Overlap(self._store.fit(self._units, resolve_threads(self._settings.io_threads)), self._outputs)
        if self._keep_units:
            self._store.expect(self._units)

    def _work(self, unit_index: int):
        """Read and validate one unit (on an Overlap thread): (rows, rejected records, light parts)."""
        unit = self._units[unit_index]
        fault_injection.maybe_hold("read")
        table = self._store.first_read(unit, light_columns(self._needs), kept=self._keep_units)
        if self._keep_units:  # the write step, in this process, takes it instead of reading the unit again
            self._store.offer(unit, table)
        check = apply_model_rejects(table, check_rows(table, needs=self._needs))
        bad = np.flatnonzero(~check.ok)
        rejected = None
        if len(bad):
            batch = table["batch"].take(pa.array(bad))
            rejected = (unit.index, rejected_records(bad, batch, check.reasons[bad]))
        light = light_rows(unit.index, table, check, task_type=self._task_type, needs=self._needs, task_history=self._task_history)
        progress_marks.mark(self._progress, progress_marks.read_mark(unit.index, table.num_rows - len(bad)))
        return table.num_rows, rejected, list(split_by(light, bucket_of(light, self._settings.buckets, whole_batches=WHOLE_BATCH in self._needs)))

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
        memory.hand_back_freed()  # the decode buffers: the write step decodes nothing it kept

    def teardown(self):
        self._overlap.close()
        self._store = None


class ReadRows(NamedTuple):
    """What ReadExperiences returns."""

    light: beam.PCollection
    """(bucket, light rows): the valid rows, whole task groups per bucket (rows/keys.py)."""
    rejected: beam.PCollection
    """(unit, records): rows that failed validation."""


class ReadExperiences(beam.PTransform):
    """Read every unit of the plan and validate its rows -> ReadRows (light rows by bucket,
    rejected rows by unit)."""

    def __init__(
        self, plan: InputPlan, settings: StepSettings = StepSettings(), *, needs: tuple[str, ...], keep_units: bool = False,
        progress: str | None = None, unit_store: UnitStoreHandle | None = None, task_history: dict | None = None,
    ):
        """settings: the run's (buckets, io_threads); needs: the columns the strategies read.
        task_history: {PATH: TaskPassRates} of the task-history needs (filters.TaskHistory), read by the launcher
        (pipelines/task_history.py): the numbers the rows' tasks are matched against.
        progress: the directory of the run's progress marks (transforms/files/progress_marks.py).
        unit_store: the run's UnitStoreHandle (transforms/unit_store.py): the prefetched units
        taken, the cache offered to, the slice decoders; None: a store of this step's own,
        with no cache. keep_units: offer each decoded unit to the store's cache for the write
        step. Only where one process runs every step (the in-process runner): elsewhere the
        write step of a unit usually runs in another process, and what a worker kept would
        never be taken, only held."""
        super().__init__()
        self._unit_store = unit_store or UnitStoreHandle(cache_mb=0)
        self._plan = plan
        self._needs = tuple(needs)
        self._settings = settings
        self._keep_units = keep_units
        self._progress = progress
        self._task_history = task_history

    def expand(self, pbegin) -> ReadRows:
        # Applied to the pipeline, it reads every unit; applied to a PCollection of unit
        # indices (the model stage's output), each unit once that is ready.
        if isinstance(pbegin, beam.pvalue.PBegin):
            units = pbegin | "Units" >> beam.Create([u.index for u in self._plan.units])
        else:
            units = pbegin
        read = units | "ReadAndValidate" >> beam.ParDo(
            _ReadLight(self._plan, self._needs, self._settings, self._keep_units, self._progress, self._unit_store, self._task_history)
        ).with_output_types(tuple[int, pa.Table]).with_outputs(_ReadLight.REJECTED, main="light")
        return ReadRows(read.light, unit_tables(read.rejected))
