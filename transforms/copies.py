"""PlanCopies: a GroupByKey by batch that turns each batch's group metadata (from ScoreGroups)
into its copy plan, a side input for WriteScored. The row work is transforms/rows/copies.py."""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam

from rescore.transforms import coders  # noqa: F401  (registers the Arrow table coder)
from rescore.transforms.rows.copies import plan_batch_copies


class _PlanBatch(beam.DoFn):
    """Per batch: how many copies of each informative group (rows/copies.py: plan_copies)."""

    METRICS = "metrics"

    def __init__(self, seed: int):
        self._seed = seed

    def process(self, element):
        batch, groups = element
        planned = plan_batch_copies(batch, list(groups), self._seed)
        if planned is None:
            return
        yield batch, (planned.stride, planned.plan)
        yield beam.pvalue.TaggedOutput(self.METRICS, planned.metrics)


class CopyPlans(NamedTuple):
    """What PlanCopies returns."""

    plans: beam.PCollection
    """(batch, (task-id stride, plan table with columns task, copies)): batches with copies only."""
    metrics: beam.PCollection
    """One COPY_METRICS row per batch with copies."""


class PlanCopies(beam.PTransform):
    """(batch, group metadata) -> CopyPlans, seeded from the batch and its sorted group keys."""

    def __init__(self, seed: int):
        super().__init__()
        self._seed = seed

    def expand(self, copy_groups) -> CopyPlans:
        planned = (
            copy_groups
            | "GroupByBatch" >> beam.GroupByKey()
            | "PlanBatch" >> beam.ParDo(_PlanBatch(self._seed)).with_outputs(_PlanBatch.METRICS, main="plans")
        )
        return CopyPlans(planned.plans, planned.metrics)
