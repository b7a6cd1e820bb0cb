"""Finalize: once every read unit is written, check the run's accounting and publish it: the
staged data files, metrics.json, then _SUCCESS last (transforms/files/ownership.py: publish).

The document it publishes is also left in the run's UnitStore (transforms/unit_store.py): where
this step runs in the launcher's process, the launcher takes it from there instead of reading
metrics.json back."""

from __future__ import annotations

import json

import apache_beam as beam

from rescore.transforms import fault_injection
from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import ownership
from rescore.transforms.input_plan import InputPlan
from rescore.transforms.rows.metrics import check_accounting, metrics_json, reject_budget_failure, summarize
from rescore.transforms.settings import StepSettings
from rescore.transforms.strategies import StrategyChain
from rescore.transforms.unit_store import UnitStoreHandle


class _Finalize(beam.DoFn):
    def __init__(
        self, plan: InputPlan, output: str, run_info: dict, stages, max_reject_fraction: float,
        unit_store: UnitStoreHandle | None = None,
    ):
        self._unit_store = unit_store
        self._plan = plan
        self._output = output
        self._run_info = run_info
        self._stages = stages
        self._max_reject_fraction = max_reject_fraction

    def process(self, _, files, group_tables, row_tables, copy_tables=()):
        summary = summarize(group_tables, row_tables, copy_tables, self._stages)
        totals = summary["totals"]
        check_accounting(totals, [u for u, _ in files], len(self._plan.units), self._plan.num_rows, copy_tables)
        document = {
            **self._run_info,
            "input_files": len(self._plan.files),
            "skipped_files": [{"path": p, "reason": r} for p, r in self._plan.skipped],
            **summary,
        }
        failure = reject_budget_failure(totals, self._max_reject_fraction)
        if failure:
            # Publish what explains the failure (rejected rows, metrics), never the scored rows
            # or _SUCCESS: a scheduler must not take this run for a good one.
            document["failed"] = failure
        fault_injection.maybe_pause_finalize()
        # Every input is still the file the plan read: an input changed at any point of the run
        # fails it here, before anything is published.
        for unit in {u.path: u for u in self._plan.units if u.fingerprint is not None}.values():
            fingerprints.verify(unit.path, unit.fingerprint)
        # Publish: only Rescore's own files are replaced, a finished earlier run only at the end.
        staged = [path for _, paths in sorted(files) for path in paths]
        text = metrics_json(document)  # strict JSON: a non-finite metric is null, never NaN
        document = json.loads(text)
        where = ownership.publish(self._output, staged, text, failed=bool(failure))
        if self._unit_store is not None:  # the launcher's, where this runs in its process
            # The document as the file holds it (JSON: tuples are lists), for the launcher.
            self._unit_store.acquire().published = (json.loads(text), where)
        yield document


class Finalize(beam.PTransform):
    """Pipeline -> the metrics.json document, published once every unit is written.

    Waits on (as side inputs) `written` (WriteScored's files and row metrics), the group
    metrics of ScoreGroups and, with duplication, `copies` (PlanCopies' metrics, checked
    against the copies written). A run over its reject budget publishes only its rejected
    files and metrics.json (with `failed`)."""

    def __init__(
        self, plan: InputPlan, output: str, run_info: dict, scoring: StrategyChain, settings: StepSettings = StepSettings(),
        *, written, group_metrics, copies=None, unit_store: UnitStoreHandle | None = None,
    ):
        """settings: the run's (max_reject_fraction). unit_store: the run's UnitStoreHandle: the
        published document is left in the store of the process this step runs in
        (pipelines/job.py takes it where that is its own)."""
        super().__init__()
        self._unit_store = unit_store
        self._plan = plan
        self._output = output
        self._run_info = run_info
        self._stages = scoring.stage_metrics
        self._written = written
        self._group_metrics = group_metrics
        self._copies = copies
        self._max_reject_fraction = settings.max_reject_fraction

    def expand(self, pbegin):
        side = {} if self._copies is None else {"copy_tables": beam.pvalue.AsList(self._copies.metrics)}
        return (
            pbegin
            | "FinalizeTrigger" >> beam.Create([None])
            | "Publish"
            >> beam.ParDo(
                _Finalize(
                    self._plan, self._output, self._run_info, self._stages, self._max_reject_fraction, self._unit_store
                ),
                files=beam.pvalue.AsList(self._written.files),
                group_tables=beam.pvalue.AsList(self._group_metrics),
                row_tables=beam.pvalue.AsList(self._written.metrics),
                **side,
            )
        )
