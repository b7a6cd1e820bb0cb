"""ScoreGroups: a GroupByKey on shuffle bucket, then the strategy chain over all groups of a
bucket (batch-level statistics from a second GroupByKey by batch, as a side input).

The row work (sorting, duplicate ids, grouping, outcomes) is in transforms/rows/; the math in
transforms/strategies/. Here: Beam wiring, counters and tagged outputs.
"""

from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from rescore.transforms import fault_injection, host_math
from rescore.transforms.coders import unit_tables  # (and registers the Arrow table coder)
from rescore.transforms import device as devices
from rescore.transforms.device import to_device
from rescore.transforms.files import progress_marks
from rescore.transforms.rows.audit import AUDIT_FIELDS, audit_values, filter_reasons
from rescore.transforms.rows.copies import copy_groups
from rescore.transforms.rows.groups import batch_stats_per_row, duplicate_records, prepare_bucket, to_grouped_rows
from rescore.transforms.rows.metrics import OFFPOLICY_PREFIX, group_metrics
from rescore.transforms.rows.outcomes import scored_outcomes, unpublishable
from rescore.transforms.settings import StepSettings
from rescore.transforms.strategies import GroupedRows, ChainScores, StrategyChain
from rescore.transforms.strategies.segments import segment_sum


class _PrepareBucket(beam.DoFn):
    """(bucket, light parts) -> (bucket, light rows sorted by group, rows with a duplicate id or
    None). The duplicates travel with the bucket to the score step, which emits their records
    with the scored ones: one output, no Flatten (a Flatten is a stage of its own on the
    in-process runner, re-reading every record)."""

    def __init__(self, max_group_rows: int):
        self._max_group_rows = max_group_rows

    def process(self, element):
        bucket, parts = element
        light, dups = prepare_bucket(list(parts), self._max_group_rows)
        if dups.num_rows:
            Metrics.counter("rescore", "rows_rejected").inc(dups.num_rows)
        if light.num_rows or dups.num_rows:
            yield bucket, light, dups if dups.num_rows else None


class _BatchValues(beam.DoFn):
    def __init__(self, plan: StrategyChain, settings: StepSettings, host: bool = False):
        self._plan = plan
        self._settings = settings
        self._host_eligible = host

    def setup(self):
        self._host = host_math.on_host(self._host_eligible, self._settings)

    def process(self, element):
        _, light, _ = element
        if not light.num_rows:
            return
        if self._host:
            yield from host_math.batch_values(self._plan, light)
            return
        import torch

        rows = to_grouped_rows(light, torch.device("cpu"))
        batch, values, weights = self._plan.batch_values(rows)
        batch, values, weights = batch.numpy(), values.numpy(), weights.numpy()
        # Every batch of the bucket, also one whose groups a filter stage dropped all of (it
        # gets no values): each batch then has statistics, and nothing looks one up in vain.
        for b in np.unique(rows.batch.numpy()):
            at = batch == b
            yield int(b), (values[at], weights[at])


class _BatchStats(beam.DoFn):
    def __init__(self, plan: StrategyChain, settings: StepSettings, host: bool = False):
        self._plan = plan
        self._settings = settings
        self._host_eligible = host

    def setup(self):
        self._host = host_math.on_host(self._host_eligible, self._settings)

    def process(self, element):
        batch, parts = element
        parts = list(parts)
        values = np.concatenate([v for v, _ in parts])
        weights = np.concatenate([w for _, w in parts])
        # Sorting first makes the sum order, hence the float result, independent of arrival order.
        order = np.lexsort((weights, values))
        values, weights = values[order], weights[order]
        if self._host:
            yield batch, tuple(host_math.batch_stats(self._plan, values, weights))
        else:
            yield batch, tuple(self._plan.batch_stats(values, weights))


class _ScoreBucket(beam.DoFn):
    METRICS = "metrics"
    COPY_GROUPS = "copy_groups"

    def __init__(self, plan: StrategyChain, settings: StepSettings, progress: str | None = None, host: bool = False):
        """host: the run may score on numpy (transforms/host_math.py eligible)."""
        self._plan = plan
        self._progress = progress
        self._settings = settings
        self._host_eligible = host

    def setup(self):
        self._host = host_math.on_host(self._host_eligible, self._settings)
        self._device = None if self._host else devices.resolve(self._settings.device)
        self._groups = Metrics.counter("rescore", "groups_scored")

    def process(self, element, batch_stats=None):
        fault_injection.maybe_fail_once("ScoreGroups")
        fault_injection.maybe_hold("score")
        bucket, light, dups = element
        done = progress_marks.score_mark(bucket, light.num_rows + (0 if dups is None else dups.num_rows))
        if dups is not None:
            yield from duplicate_records(dups)
        if not light.num_rows:
            progress_marks.mark(self._progress, done)
            return
        if self._host:
            yield from self._score_on_host(light, done, batch_stats)
            return
        import torch

        rows = to_grouped_rows(light, self._device)
        per_row_stats = None
        if batch_stats is not None:
            per_row_stats = to_device(batch_stats_per_row(light, batch_stats), self._device)
        with torch.no_grad():
            rows = self._plan.shaped(rows)  # drop reasons and audit values explain the shaped rewards
            scores = self._plan.score(rows, per_row_stats, shaped=True)
        self._groups.inc(rows.num_groups)
        progress_marks.mark(self._progress, done)

        keep = scores.keep.cpu().numpy()
        score = None if scores.score is None else scores.score.cpu().numpy()
        token_scale = None if scores.token_scale is None else scores.token_scale.cpu().numpy()
        shaped = None if scores.reward is None else scores.reward.cpu().numpy()
        # A kept row whose advantage cannot be written (NaN, inf, beyond float32) is rejected
        # with the reason, not kept for copies (rows/outcomes.py unpublishable).
        bad = unpublishable(keep, score, token_scale, shaped)
        yield from scored_outcomes(
            light,
            keep,
            score,
            token_scale,
            reasons=filter_reasons(self._plan, rows, scores) if self._settings.keep_filtered and not keep.all() else None,
            audit=audit_values(self._plan, rows, scores, per_row_stats) if self._settings.audit_columns else None,
            audit_fields=AUDIT_FIELDS,
            reward=shaped,
            row_tokens=scores.row_tokens,
            is_norm=None if scores.is_norm is None else scores.is_norm.cpu().numpy(),
        )
        yield beam.pvalue.TaggedOutput(self.METRICS, self._metrics(rows, scores))
        if scores.informative is not None:
            still = scores.keep if bad is None else scores.keep & torch.as_tensor(~bad, device=scores.keep.device)
            kept = segment_sum(still, rows.offsets).cpu().numpy()
            for item in copy_groups(light, rows.offsets.cpu().numpy(), kept, scores.informative.cpu().numpy()):
                yield beam.pvalue.TaggedOutput(self.COPY_GROUPS, item)

    def _score_on_host(self, light, done, batch_stats):
        """process() on numpy (host_math.py): the same outcomes and metrics, without torch."""
        per_row_stats = None if batch_stats is None else batch_stats_per_row(light, batch_stats)
        scores = host_math.score_bucket(self._plan, light, per_row_stats)
        self._groups.inc(len(scores.group_mean))
        progress_marks.mark(self._progress, done)
        yield from scored_outcomes(
            light, scores.keep, scores.score, None, reasons=None, audit=None, audit_fields=AUDIT_FIELDS,
            reward=None, row_tokens=None, is_norm=None,
        )
        yield beam.pvalue.TaggedOutput(self.METRICS, group_metrics(
            scores.group_batch, np.diff(scores.offsets), scores.group_mean, scores.group_std, scores.dropped,
        ))

    def _metrics(self, rows: GroupedRows, scores: ChainScores):
        table = group_metrics(
            rows.group_batch.cpu().numpy(),
            rows.sizes.cpu().numpy(),
            scores.group_mean.cpu().numpy(),
            scores.group_std.cpu().numpy(),
            {k: v.cpu().numpy() for k, v in scores.dropped.items()},
        )
        correction = self._plan.correction
        if correction is not None:  # verl's off-policy diagnostics, summed per group (rows/metrics.py)
            for name, values in correction.group_metric_sums(rows).items():
                table = table.append_column(OFFPOLICY_PREFIX + name, pa.array(values, pa.float64()))
        return table


class ScoredGroups(NamedTuple):
    """What ScoreGroups returns."""

    outcomes: beam.PCollection
    """(unit, records): a record for every scored, filtered and duplicate-id row, by read unit."""
    group_metrics: beam.PCollection
    """One GROUP_METRICS table per bucket."""
    copy_groups: beam.PCollection
    """(batch, group metadata) for PlanCopies; empty without a duplicate stage."""


class ScoreGroups(beam.PTransform):
    """(bucket, light rows) -> ScoredGroups: every row's outcome, group metrics and, with a
    duplicate stage, the metadata PlanCopies turns into copy plans."""

    def __init__(self, plan: StrategyChain, settings: StepSettings = StepSettings(), *, progress: str | None = None):
        """settings: the run's (max_group_rows, device, accelerator, keep_filtered, audit_columns);
        progress: the directory of the run's progress marks (transforms/files/progress_marks.py)."""
        super().__init__()
        self._plan = plan
        self._settings = settings
        self._progress = progress
        self._host = host_math.eligible(plan, settings)
        self._hints = {"accelerator": settings.accelerator} if settings.accelerator else {}

    def expand(self, keyed) -> ScoredGroups:
        prepared = keyed | "GroupByBucket" >> beam.GroupByKey() | "SortAndDedupe" >> beam.ParDo(_PrepareBucket(self._settings.max_group_rows))
        side = {}
        if self._plan.batch_level:
            batch_stats = (
                prepared
                | "BatchValues" >> beam.ParDo(_BatchValues(self._plan, self._settings, self._host))
                | "GroupByBatch" >> beam.GroupByKey()
                | "BatchStats" >> beam.ParDo(_BatchStats(self._plan, self._settings, self._host))
            )
            side["batch_stats"] = beam.pvalue.AsDict(batch_stats)
        score = beam.ParDo(_ScoreBucket(self._plan, self._settings, self._progress, self._host), **side).with_outputs(
            _ScoreBucket.METRICS, _ScoreBucket.COPY_GROUPS, main="outcomes"
        )
        if self._hints:
            score = score.with_resource_hints(**self._hints)
        scored = prepared | "Score" >> score
        return ScoredGroups(unit_tables(scored.outcomes), scored.metrics, scored.copy_groups)
