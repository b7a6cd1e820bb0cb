"""Finalize on a TestPipeline: with every unit written and the accounting right, the staged
files are published, then metrics.json and _SUCCESS; rows that do not add up publish nothing."""

import json
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.testing.util import assert_that, equal_to
from shell_data import gathered, pipeline, write_experience

from rescore.transforms.finalize import Finalize
from rescore.transforms.read import plan_input
from rescore.transforms.rows.metrics import group_metrics, row_metrics
from rescore.transforms.rows.outcomes import FILTERED, REJECTED, SCORED
from rescore.transforms.strategies import build_chain
from rescore.transforms.write import WrittenUnits
from rescore.transforms.settings import StepSettings


def _run(tmp_path, statuses):
    plan = plan_input([write_experience(tmp_path / "in")], shard_rows=100)  # one unit of 9 rows
    out = tmp_path / "out"
    (out / "_staging").mkdir(parents=True)
    staged = str(out / "_staging" / "scored-00000-of-00001.parquet")
    pq.write_table(pa.table({"x": [1, 2]}), staged)
    batch = pa.array(([0] * 6 + [1] * 3)[: len(statuses)], pa.int64())
    category = ["null_value" if s == REJECTED else None for s in statuses]
    groups = group_metrics(np.array([0, 0, 1]), np.array([4, 2, 2]), np.array([0.5, 1.0, 1.0]), np.array([0.57, 0.0, 1.41]), {})
    with pipeline() as p:
        written = WrittenUnits(
            files=p | "Files" >> beam.Create([(0, [staged])]),
            metrics=p | "RowMetrics" >> beam.Create([row_metrics(batch, np.array(statuses, np.int8), category)]),
        )
        document = p | Finalize(
            plan, str(out), {"strategy": "grpo"}, build_chain(["grpo"], {}), StepSettings(max_reject_fraction=1.0),
            written=written,
            group_metrics=p | "Groups" >> beam.Create([groups]),
        )
        totals = ("rows_read", "rows_written", "rows_filtered", "rows_rejected", "groups")
        assert_that(
            document | "Totals" >> gathered(lambda docs: [[d["totals"][k] for k in totals] for d in docs]),
            equal_to([[[9, 6, 2, 1, 3]]]),
        )
    return out


def test_finalize_publishes_the_staged_files_then_metrics_and_success(tmp_path):
    out = _run(tmp_path, [SCORED] * 4 + [FILTERED] * 2 + [SCORED] * 2 + [REJECTED])
    assert sorted(os.listdir(out)) == ["_SUCCESS", "_rescore_files.json", "metrics.json", "scored-00000-of-00001.parquet"]
    assert pq.read_table(out / "scored-00000-of-00001.parquet")["x"].to_pylist() == [1, 2]
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["strategy"] == "grpo" and doc["totals"]["rows_written_original"] == 6


def test_finalize_refuses_rows_that_do_not_add_up(tmp_path):
    with pytest.raises(Exception, match="internal error: input has 9 rows, metrics account for 8"):
        _run(tmp_path, [SCORED] * 4 + [FILTERED] * 2 + [SCORED] * 2)
    out = tmp_path / "out"
    assert not (out / "_SUCCESS").exists() and not (out / "metrics.json").exists()
    assert os.listdir(out / "_staging") == ["scored-00000-of-00001.parquet"]
