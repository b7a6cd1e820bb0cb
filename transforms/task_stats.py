"""The Beam shell of `rescore task-stats`: files -> exact group summaries -> task rows.

    files | ComputeTaskStats(threshold, ks, lamb, beta_m, staging)

1. each file is read in record batches (id and reward columns only) and summarised per
   (task, batch) (transforms/rows/task_stats.py: summarize);
2. CombinePerKey((task, batch)) merges the parts of a group found in different files or record
   batches; the merge is integer addition and set union, exact in any order and on any number
   of workers;
3. CombinePerKey(task) collects a task's complete groups by batch (a dict union: each batch
   arrives exactly once, complete), and the task row is computed from them;
4. both tables are gathered once and written, sorted, into the staging directory; the entry
   point (pipelines/task_stats.py) publishes them.
"""

from __future__ import annotations

import os

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

from rescore.transforms.files import storage
from rescore.transforms.files.layout import TASK_BATCH_STATS as GROUP_STATS_FILE
from rescore.transforms.files.layout import TASK_STATS as TASK_STATS_FILE
from rescore.transforms.rows import task_stats as ts

SKIPPED = "skipped"


class _SummarizeFile(beam.DoFn):
    def __init__(self, threshold: float, batches: frozenset | None = None):
        self._threshold = threshold
        self._batches = batches

    def process(self, path: str):
        f = storage.open_parquet(path)  # local, gs://, s3://
        columns = list(ts.ID_COLUMNS) + (["copy_index"] if "copy_index" in f.schema_arrow.names else [])
        for record_batch in f.iter_batches(columns=columns, batch_size=65536):
            table = pa.Table.from_batches([record_batch])
            if "copy_index" in table.column_names:  # a duplicated row is a copy, not a new sample
                import pyarrow.compute as pc

                table = table.filter(pc.fill_null(pc.equal(table["copy_index"], 0), True)).drop_columns(["copy_index"])
            if self._batches is not None:  # an incremental run: only the batches it rescans
                import pyarrow.compute as pc

                table = table.filter(pc.fill_null(pc.is_in(table["batch"], pa.array(sorted(self._batches), pa.int64())), False))
            usable, skipped = ts.usable_rows(table)
            if skipped:
                yield beam.pvalue.TaggedOutput(SKIPPED, skipped)
            yield from ts.summarize(usable, self._threshold).items()


class _MergeGroups(beam.CombineFn):
    def create_accumulator(self):
        return ts.EMPTY

    def add_input(self, acc, part):
        return acc.merge(part)

    def merge_accumulators(self, accs):
        return ts.merge_all(accs)

    def extract_output(self, acc):
        return acc


class _CollectBatches(beam.CombineFn):
    """A task's {batch: complete GroupSummary}."""

    def create_accumulator(self):
        return {}

    def add_input(self, acc, batch_group):
        batch, group = batch_group
        if batch in acc:
            raise ValueError(f"batch {batch} arrived twice for one task")  # cannot happen after step 2
        acc[batch] = group
        return acc

    def merge_accumulators(self, accs):
        out = {}
        for acc in accs:
            for batch, group in acc.items():
                if batch in out:
                    raise ValueError(f"batch {batch} arrived twice for one task")
                out[batch] = group
        return out

    def extract_output(self, acc):
        return acc


class _WriteSorted(beam.DoFn):
    def __init__(self, path: str, schema: pa.Schema):
        self._path = path
        self._schema = schema

    def process(self, rows):
        rows = sorted(rows, key=ts.sort_key)
        table = pa.Table.from_pylist(rows, schema=self._schema)
        os.makedirs(os.path.dirname(self._path), exist_ok=True)
        pq.write_table(table, self._path)
        yield len(rows)


class _WriteCount(beam.DoFn):
    def __init__(self, path: str):
        self._path = path

    def process(self, counts):
        with open(self._path, "w") as f:
            f.write(str(sum(counts)))
        yield 0


class ComputeTaskStats(beam.PTransform):
    """PCollection of Parquet paths -> task_stats.parquet (and task_batch_stats.parquet) in
    `staging`, and a file `skipped` with the number of rows without a usable reward or id."""

    def __init__(self, staging: str, task_type: pa.DataType, threshold: float, ks: tuple[int, ...],
                 lamb: float, beta_m: float | None, batches: frozenset | None = None):
        super().__init__()
        self._batches = batches
        self._staging = staging
        self._task_type = task_type
        self._threshold = threshold
        self._ks = ks
        self._lamb = lamb
        self._beta_m = beta_m

    def expand(self, paths):
        ks, lamb, beta_m = self._ks, self._lamb, self._beta_m
        exact = self._batches is not None
        read = paths | "ReadGroupParts" >> beam.ParDo(_SummarizeFile(self._threshold, self._batches)).with_outputs(SKIPPED, main="parts")
        groups = read.parts | "MergeGroupParts" >> beam.CombinePerKey(_MergeGroups())
        group_rows = groups | "GroupRows" >> beam.MapTuple(lambda key, g: ts.group_row(key[0], key[1], g, ks, exact))
        tasks = (
            groups
            | "KeyByTask" >> beam.MapTuple(lambda key, g: (key[0], (key[1], g)))
            | "CollectBatches" >> beam.CombinePerKey(_CollectBatches())
            | "TaskRows" >> beam.MapTuple(lambda task, batches: ts.task_row(task, batches, ks, lamb, beta_m))
        )
        written_groups = (
            group_rows
            | "GatherGroups" >> beam.combiners.ToList()
            | "WriteGroups" >> beam.ParDo(_WriteSorted(os.path.join(self._staging, GROUP_STATS_FILE),
                                                      ts.group_schema(self._task_type, ks, exact)))
        )
        written_tasks = (
            tasks
            | "GatherTasks" >> beam.combiners.ToList()
            | "WriteTasks" >> beam.ParDo(_WriteSorted(os.path.join(self._staging, TASK_STATS_FILE),
                                                     ts.task_schema(self._task_type, ks)))
        )
        skipped = (
            read[SKIPPED]
            | "GatherSkipped" >> beam.combiners.ToList()
            | "WriteSkipped" >> beam.ParDo(_WriteCount(os.path.join(self._staging, SKIPPED)))
        )
        return written_groups, written_tasks, skipped
