"""Trinity-RFT SQL experience buffers as a Beam source and sink: the two steps that run
transforms/sql_database.py on workers.

Source (`StageBuffer`): the launcher reads only count/min/max of NAME's ids and cuts the id span
into ranges (sql_database.plan_source); each range is read, decoded and written as one Parquet
file by a worker, so workers read in parallel and the launcher reads no experience. The rest of
the pipeline then reads those files like any other input.

Sink (`InsertScored`): workers insert the scored Parquet files into this run's staging tables,
one file per element with ids fixed by file; pipelines/sources.py prepares and commits the
staging tables around it (sql_database: prepare_staging, commit_staging).
"""

from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from rescore.transforms import fault_injection
from rescore.transforms.files import storage
from rescore.transforms.sql_database import SourcePlan, engine, insert_file, source_engine, stage_range, staged_name


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


class _InsertFile(beam.DoFn):
    def __init__(self, url: str, table: str, token: str, columns: list[str]):
        self._url, self._table, self._token, self._columns = url, table, token, columns

    def setup(self):
        self._engine = engine(self._url, must_exist=False)
        self._rows = Metrics.counter("rescore", "buffer_rows_written")

    def process(self, element):
        path, first_id = element
        rows = insert_file(self._engine, self._table, self._token, self._columns, path, first_id)
        self._rows.inc(rows)
        fault_injection.maybe_fail_insert(path)  # tests: a run killed mid-insert
        yield rows

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
