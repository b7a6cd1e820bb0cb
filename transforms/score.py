"""ScoreGroups: GroupByKey on shuffle bucket, then the scoring plan over all groups of a bucket;
with a duplicate stage, a GroupByKey on batch turns light group metadata into the copy plan."""

from __future__ import annotations

from collections import Counter

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from apache_beam.metrics import Metrics

from rescore.transforms import coders, faults  # noqa: F401  (coders registers the Arrow table coder)
from rescore.transforms.rows.audit import AUDIT_FIELDS, AUDIT_NAMES, audit_values, filter_reasons
from rescore.transforms import device as devices
from rescore.transforms.device import to_device
from rescore.transforms.rows.keys import EXTRA_PREFIX, ID_KEYS, SORT_KEYS, split_by, task_hash
from rescore.transforms.rows.metrics import COPY_METRICS, group_metrics
from rescore.transforms.rows.outcomes import FILTERED, REJECTED, SCORED, records
from rescore.transforms.strategies import DUPLICATE, GroupedRows, ChainScores, StrategyChain
from rescore.transforms.strategies.segments import segment_sum
from rescore.transforms.strategies.selection import copy_task_ids, plan_copies


def _changes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """(n,) bool: row i differs from row i - 1 in this column (row 0 counts as a change)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    out = np.ones(n, dtype=bool)
    if n > 1:
        out[1:] = pc.not_equal(arr.slice(1), arr.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return out


def sort_rows(light: pa.Table) -> tuple[pa.Table, np.ndarray]:
    """Rows sorted by (batch, task, run, step) with rows sharing an id removed.

    Returns (sorted unique rows, the removed rows). Every copy of a duplicated id is removed:
    no copy has a better claim than another, and keeping one would depend on read order.
    """
    light = light.sort_by(SORT_KEYS)
    new_id = np.zeros(light.num_rows, dtype=bool)
    for key in ID_KEYS:
        new_id |= _changes(light[key])
    # A row is a duplicate if it starts no new id, or the next row starts none.
    dup = ~new_id
    dup[:-1] |= ~new_id[1:]
    if not dup.any():
        return light, light.slice(0, 0)
    return light.filter(pa.array(~dup)), light.filter(pa.array(dup))


def group_offsets(light: pa.Table) -> np.ndarray:
    """(G + 1,) int64 boundaries of the (batch, task) groups of sorted light rows."""
    starts = np.flatnonzero(_changes(light["batch"]) | _changes(light["task"]))
    return np.append(starts, light.num_rows).astype(np.int64)


def to_grouped_rows(light: pa.Table, device: torch.device) -> GroupedRows:
    """The light rows of a bucket (sorted) as tensors on `device`, each copied once."""

    def t(name, dtype):
        return to_device(np.asarray(light[name].to_numpy(zero_copy_only=False), dtype=dtype), device)

    names = light.column_names
    return GroupedRows(
        reward=t("reward", np.float64),
        offsets=to_device(group_offsets(light), device),
        batch=t("batch", np.int64),
        run=t("run", np.int64),
        step=t("step", np.int64),
        action_tokens=t("action_tokens", np.int64),
        mean_logprob=t("mean_logprob", np.float64) if "mean_logprob" in names else None,
        expert=t("expert", bool) if "expert" in names else None,
        response_length=t("response_length", np.int64) if "response_length" in names else None,
        last_action=t("last_action", bool) if "last_action" in names else None,
        task_key=to_device(task_hash(light["task"].combine_chunks()).view(np.int64), device),
        columns={
            n[len(EXTRA_PREFIX) :]: t(n, np.int64 if pa.types.is_integer(light.schema.field(n).type) else np.float64)
            for n in names
            if n.startswith(EXTRA_PREFIX)
        },
    )


def _duplicate_records(dups: pa.Table):
    """(unit, rejected records) for rows whose id appears more than once."""
    ids = list(zip(*(dups[k].to_pylist() for k in ID_KEYS)))
    count = Counter(ids)
    reasons = [
        f"duplicate_id: (batch={b}, task={t!r}, run={r}, step={s}) appears {count[(b, t, r, s)]} times"
        for b, t, r, s in ids
    ]
    dups = dups.append_column("reason", pa.array(reasons, pa.string()))
    for unit, part in split_by(dups, dups["unit"].to_numpy()):
        yield unit, records(part["row"].to_numpy(), part["batch"].combine_chunks(), REJECTED, reason=part["reason"].to_pylist())


class GroupTooLarge(ValueError):
    """A task group beyond --max-group-rows: the run stops rather than risk running out of memory."""


def check_group_sizes(light: pa.Table, max_group_rows: int) -> None:
    offsets = group_offsets(light)
    sizes = np.diff(offsets)
    if len(sizes) and sizes.max() > max_group_rows:
        g = int(np.argmax(sizes))
        first = offsets[g]
        raise GroupTooLarge(
            f"task group (batch={light['batch'][first].as_py()}, task={light['task'][first].as_py()!r}) has "
            f"{int(sizes[g]):,} rows, more than --max-group-rows={max_group_rows:,}; a group is scored in "
            "one piece on one worker, so raise the cap only where a worker has the memory "
            "(about 100 bytes per row), or check the input for a task id shared by mistake"
        )


class _PrepareBucket(beam.DoFn):
    DUPLICATES = "duplicates"

    def __init__(self, max_group_rows: int):
        self._max_group_rows = max_group_rows

    def process(self, element):
        bucket, parts = element
        parts = list(parts)
        if sum(p.num_rows for p in parts) > self._max_group_rows:
            check_group_sizes(pa.concat_tables(parts).sort_by(SORT_KEYS[:2]), self._max_group_rows)
        light, dups = sort_rows(pa.concat_tables(parts))
        if dups.num_rows:
            Metrics.counter("rescore", "rows_rejected").inc(dups.num_rows)
            for item in _duplicate_records(dups):
                yield beam.pvalue.TaggedOutput(self.DUPLICATES, item)
        if light.num_rows:
            yield bucket, light


class _BatchValues(beam.DoFn):
    def __init__(self, plan: StrategyChain):
        self._plan = plan

    def process(self, element):
        _, light = element
        rows = to_grouped_rows(light, torch.device("cpu"))
        batch, values, weights = self._plan.batch_values(rows)
        batch, values, weights = batch.numpy(), values.numpy(), weights.numpy()
        # Every batch of the bucket, also one whose groups a filter stage dropped all of (it
        # gets no values): each batch then has statistics, and nothing looks one up in vain.
        for b in np.unique(rows.batch.numpy()):
            at = batch == b
            yield int(b), (values[at], weights[at])


class _BatchStats(beam.DoFn):
    def __init__(self, plan: StrategyChain):
        self._plan = plan

    def process(self, element):
        batch, parts = element
        parts = list(parts)
        values = np.concatenate([v for v, _ in parts])
        weights = np.concatenate([w for _, w in parts])
        # Sorting first makes the sum order, hence the float result, independent of arrival order.
        order = np.lexsort((weights, values))
        yield batch, tuple(self._plan.batch_stats(values[order], weights[order]))


class _ScoreBucket(beam.DoFn):
    METRICS = "metrics"
    COPY_META = "copy_meta"

    def __init__(self, plan: StrategyChain, device: str = "auto", keep_filtered: bool = False, audit_columns: bool = False):
        self._plan = plan
        self._device_choice = device
        self._keep_filtered = keep_filtered
        self._audit_columns = audit_columns

    def setup(self):
        self._device = devices.resolve(self._device_choice)
        self._groups = Metrics.counter("rescore", "groups_scored")

    def process(self, element, batch_stats=None):
        faults.maybe_fail_once("ScoreGroups")
        _, light = element
        rows = to_grouped_rows(light, self._device)
        per_row_stats = None
        if batch_stats is not None:
            batches, inverse = np.unique(light["batch"].to_numpy(), return_inverse=True)
            stats = np.array([batch_stats[int(b)] for b in batches], dtype=np.float64).reshape(len(batches), -1)
            per_row_stats = to_device(stats[inverse], self._device)
        with torch.no_grad():
            scores = self._plan.score(rows, per_row_stats)
        self._groups.inc(rows.num_groups)

        keep = scores.keep.cpu().numpy()
        status = np.where(keep, SCORED, FILTERED).astype(np.int8)
        n = len(keep)
        score = np.zeros(n) if scores.score is None else scores.score.cpu().numpy()
        scale = np.ones(n) if scores.token_scale is None else scores.token_scale.cpu().numpy()
        out = pa.table({"unit": light["unit"], "row": light["row"], "batch": light["batch"], "status": status, "score": score, "token_scale": scale})
        audit = {}
        if self._keep_filtered and not keep.all():
            out = out.append_column("reason", pa.array(filter_reasons(self._plan, rows, scores).tolist(), pa.string()))
        if self._audit_columns:
            audit = audit_values(self._plan, rows, scores, per_row_stats)
            for f in AUDIT_FIELDS:
                values = audit[f.name]
                out = out.append_column(f, pa.array(values, f.type, from_pandas=True))  # NaN -> null
        for unit, part in split_by(out, out["unit"].to_numpy()):
            rec = records(
                part["row"].to_numpy(),
                part["batch"].combine_chunks(),
                part["status"].to_numpy(),
                part["score"].to_numpy(),
                part["token_scale"].to_numpy(),
                reason=part["reason"].to_pylist() if "reason" in part.column_names else None,
                has_score=scores.score is not None,
            )
            for name in AUDIT_NAMES if audit else ():
                rec = rec.append_column(part.schema.field(name), part[name])
            yield unit, rec
        yield beam.pvalue.TaggedOutput(self.METRICS, self._metrics(rows, scores))
        if scores.informative is not None:
            for item in self._copy_meta(light, rows, scores):
                yield beam.pvalue.TaggedOutput(self.COPY_META, item)

    @staticmethod
    def _metrics(rows: GroupedRows, scores: ChainScores) -> pa.Table:
        return group_metrics(
            rows.group_batch.cpu().numpy(),
            rows.sizes.cpu().numpy(),
            scores.group_mean.cpu().numpy(),
            scores.group_std.cpu().numpy(),
            {k: v.cpu().numpy() for k, v in scores.dropped.items()},
        )

    @staticmethod
    def _copy_meta(light: pa.Table, rows: GroupedRows, scores: ChainScores):
        """(batch, group table) per batch: task, rows before and after filtering, informative."""
        starts = rows.offsets[:-1].cpu().numpy()
        kept = segment_sum(scores.keep, rows.offsets).cpu().numpy()
        meta = pa.table(
            {
                "batch": light["batch"].take(pa.array(starts)),
                "task": light["task"].take(pa.array(starts)),
                "size": rows.sizes.cpu().numpy(),
                "kept": kept,
                "informative": scores.informative.cpu().numpy(),
            }
        )
        for batch, part in split_by(meta, meta["batch"].to_numpy()):
            yield batch, part.drop_columns(["batch"])


class _PlanCopies(beam.DoFn):
    """Per batch: how many copies of each informative group (see plan_copies)."""

    METRICS = "metrics"

    def __init__(self, seed: int):
        self._seed = seed

    def process(self, element):
        batch, parts = element
        groups = pa.concat_tables(list(parts)).sort_by("task")
        task = groups["task"].combine_chunks()
        sizes = groups["kept"].to_numpy()
        copies = plan_copies(
            task_hash(task),
            sizes,
            groups["informative"].to_numpy(zero_copy_only=False),
            target=int(groups["size"].to_numpy().sum()),
            seed=self._seed,
            batch=batch,
        )
        chosen = np.flatnonzero(copies)
        if not len(chosen):
            return
        stride = _copy_stride(batch, task, copies)
        plan = pa.table({"task": task.take(pa.array(chosen)), "copies": copies[chosen]})
        yield batch, (stride, plan)
        yield beam.pvalue.TaggedOutput(
            self.METRICS,
            pa.Table.from_arrays(
                [pa.array([batch], pa.int64()), pa.array([int(copies.sum())], pa.int64()), pa.array([int((copies * sizes).sum())], pa.int64())],
                schema=COPY_METRICS,
            ),
        )


def _copy_stride(batch: int, task: pa.Array, copies: np.ndarray) -> int:
    """The id offset between copies of a group (integer tasks), after checking that no copy id
    meets another group's; 0 for string tasks."""
    most = int(copies.max())
    if pa.types.is_integer(task.type):
        values = task.to_numpy().astype(np.int64)
        lo, hi = int(values.min()), int(values.max())
        stride = hi - lo + 1
        if hi + most * stride > np.iinfo(np.int64).max:
            raise ValueError(f"batch {batch}: task ids up to {hi} leave no room for {most} copies in int64")
        return stride
    chosen = np.flatnonzero(copies)
    new = copy_task_ids(
        task.take(pa.array(np.repeat(chosen, copies[chosen]))),
        np.concatenate([np.arange(1, k + 1) for k in copies[chosen]]),
        0,
    )
    clash = pc.is_in(new, value_set=task)
    if pc.any(clash).as_py():
        first = new.filter(clash)[0].as_py()
        raise ValueError(f"batch {batch}: the copy task id {first!r} already names a task; rename that task")
    return 0


class ScoreGroups(beam.PTransform):
    """(bucket, light rows) -> (unit, records) for every row, and per-batch group metrics.

    Returns (records, group metrics, copy plans, copy metrics): `records` (scored, filtered
    and duplicate-id rows, keyed by read unit), `metrics` (one GROUP_METRICS table per bucket),
    and with a duplicate stage the copy plans ((batch, (stride, plan table)), a side input for
    the writer) and COPY_METRICS tables; both None without one.
    """

    def __init__(
        self, plan: StrategyChain, max_group_rows: int = 1_000_000, device: str = "auto", accelerator: str | None = None,
        keep_filtered: bool = False, audit_columns: bool = False,
    ):
        super().__init__()
        self._keep_filtered = keep_filtered
        self._audit_columns = audit_columns
        self._plan = plan
        self._max_group_rows = max_group_rows
        self._device = device
        self._hints = {"accelerator": accelerator} if accelerator else {}

    def expand(self, keyed):
        prepared = (
            keyed
            | "GroupByBucket" >> beam.GroupByKey()
            | "SortAndDedupe"
            >> beam.ParDo(_PrepareBucket(self._max_group_rows)).with_outputs(_PrepareBucket.DUPLICATES, main="rows")
        )
        side = {}
        if self._plan.batch_level:
            batch_stats = (
                prepared.rows
                | "BatchValues" >> beam.ParDo(_BatchValues(self._plan))
                | "GroupByBatch" >> beam.GroupByKey()
                | "BatchStats" >> beam.ParDo(_BatchStats(self._plan))
            )
            side["batch_stats"] = beam.pvalue.AsDict(batch_stats)
        score = beam.ParDo(_ScoreBucket(self._plan, self._device, self._keep_filtered, self._audit_columns), **side).with_outputs(
            _ScoreBucket.METRICS, _ScoreBucket.COPY_META, main="records"
        )
        if self._hints:
            score = score.with_resource_hints(**self._hints)
        scored = prepared.rows | "Score" >> score
        records_out = (scored.records, prepared.duplicates) | "AllRecords" >> beam.Flatten()
        copy_plans = copy_metrics = None
        if self._plan.duplicates:
            planned = (
                scored.copy_meta
                | "GroupMetaByBatch" >> beam.GroupByKey()
                | "PlanCopies"
                >> beam.ParDo(_PlanCopies(self._plan.stage(DUPLICATE).seed)).with_outputs(_PlanCopies.METRICS, main="plans")
            )
            copy_plans, copy_metrics = planned.plans, planned.metrics
        return records_out, scored.metrics, copy_plans, copy_metrics
