"""PlanCopies on a TestPipeline: each batch's group metadata becomes its copy plan (copies until
the batch has its rows again) and a COPY_METRICS row; a batch that needs none gets no plan."""

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.testing.util import assert_that, equal_to
from shell_data import gathered, pipeline

from rescore.transforms.copies import PlanCopies
from rescore.transforms.rows.copies import plan_batch_copies


def groups(task, size, kept, informative):
    return pa.table({"task": pa.array(task, pa.int64()), "size": np.array(size), "kept": np.array(kept), "informative": np.array(informative)})


def test_plan_copies_per_batch():
    # batch 0: 6 rows before filtering, 4 informative (task 1) -> one copy of task 1, stride 2.
    # batch 1: nothing filtered -> no copies. batch 2: 3 groups of 2 arrive in two parts; the
    # 2 rows filtered are made up by one copy of one of the informative groups (tasks 10, 30).
    b2_parts = [groups([30], [2], [2], [True]), groups([10, 20], [2, 2], [2, 0], [True, False])]
    expected_b2 = plan_batch_copies(2, b2_parts, seed=0)
    assert expected_b2.plan["copies"].to_pylist() == [1] and expected_b2.stride == 21
    elements = [
        (0, groups([1], [4], [4], [True])), (0, groups([2], [2], [0], [False])),
        (1, groups([1], [2], [2], [True])),
        *((2, part) for part in b2_parts),
    ]

    def plans(items):
        return sorted((batch, stride, plan["task"].to_pylist(), plan["copies"].to_pylist()) for batch, (stride, plan) in items)

    def metrics(tables):
        return sorted(row for t in tables for row in zip(*(t[c].to_pylist() for c in t.column_names)))

    with pipeline() as p:
        copies = p | beam.Create(elements) | PlanCopies(seed=0)
        assert_that(
            copies.plans | "Plans" >> gathered(plans),
            equal_to([[(0, 2, [1], [1]), (2, 21, expected_b2.plan["task"].to_pylist(), [1])]]),
            label="CheckPlans",
        )
        assert_that(copies.metrics | "Metrics" >> gathered(metrics), equal_to([[(0, 1, 4), (2, 1, 2)]]), label="CheckMetrics")
