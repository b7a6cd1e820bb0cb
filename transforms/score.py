"""ScoreGroups: GroupByKey on shuffle bucket, then the strategy over all groups of a bucket."""

from __future__ import annotations

from collections import Counter

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from apache_beam.metrics import Metrics

from transforms import coders  # noqa: F401  (registers the Arrow table coder)
from transforms.light import ID_KEYS, SORT_KEYS, split_by
from transforms.metrics import group_metrics
from transforms.records import FILTERED, REJECTED, SCORED, records
from transforms.strategies import GroupedRows, Strategy
from transforms.strategies.segments import std_of


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
    def t(name, dtype):
        return torch.from_numpy(np.array(light[name].to_numpy(), dtype=dtype)).to(device)

    return GroupedRows(
        reward=t("reward", np.float64),
        offsets=torch.from_numpy(group_offsets(light)).to(device),
        batch=t("batch", np.int64),
        run=t("run", np.int64),
        step=t("step", np.int64),
        action_tokens=t("action_tokens", np.int64),
        mean_logprob=t("mean_logprob", np.float64) if "mean_logprob" in light.column_names else None,
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


class _PrepareBucket(beam.DoFn):
    DUPLICATES = "duplicates"

    def process(self, element):
        bucket, parts = element
        light, dups = sort_rows(pa.concat_tables(parts))
        if dups.num_rows:
            Metrics.counter("rescore", "rows_rejected").inc(dups.num_rows)
            for item in _duplicate_records(dups):
                yield beam.pvalue.TaggedOutput(self.DUPLICATES, item)
        if light.num_rows:
            yield bucket, light


class _BatchValues(beam.DoFn):
    def __init__(self, strategy: Strategy):
        self._strategy = strategy

    def process(self, element):
        _, light = element
        batch, values = self._strategy.batch_values(to_grouped_rows(light, torch.device("cpu")))
        batch, values = batch.numpy(), values.numpy()
        for b in np.unique(batch):
            yield int(b), values[batch == b]


def _batch_std(element):
    batch, parts = element
    # Sorting first makes the sum order, hence the float result, independent of arrival order.
    values = np.sort(np.concatenate(list(parts)))
    return batch, float(std_of(torch.from_numpy(values)))


class _ScoreBucket(beam.DoFn):
    METRICS = "metrics"

    def __init__(self, strategy: Strategy):
        self._strategy = strategy

    def setup(self):
        self._device = torch.device("cpu")
        self._groups = Metrics.counter("rescore", "groups_scored")

    def process(self, element, batch_std=None):
        _, light = element
        rows = to_grouped_rows(light, self._device)
        per_row_std = None
        if batch_std is not None:
            batches, inverse = np.unique(light["batch"].to_numpy(), return_inverse=True)
            stds = np.array([batch_std[int(b)] for b in batches], dtype=np.float64)
            per_row_std = torch.from_numpy(stds[inverse]).to(self._device)
        with torch.no_grad():
            scores = self._strategy.score(rows, per_row_std)
        self._groups.inc(rows.num_groups)

        keep = scores.keep.cpu().numpy()
        status = np.where(keep, SCORED, FILTERED).astype(np.int8)
        score = scores.score.cpu().numpy()
        scale = None if scores.token_scale is None else scores.token_scale.cpu().numpy()
        out = pa.table(
            {
                "unit": light["unit"],
                "row": light["row"],
                "batch": light["batch"],
                "status": status,
                "score": score,
                "token_scale": np.ones(len(score)) if scale is None else scale,
            }
        )
        for unit, part in split_by(out, out["unit"].to_numpy()):
            yield unit, records(
                part["row"].to_numpy(),
                part["batch"].combine_chunks(),
                part["status"].to_numpy(),
                part["score"].to_numpy(),
                part["token_scale"].to_numpy(),
            )
        yield beam.pvalue.TaggedOutput(self.METRICS, self._metrics(rows, scores))

    @staticmethod
    def _metrics(rows: GroupedRows, scores) -> pa.Table:
        return group_metrics(
            rows.group_batch.cpu().numpy(),
            scores.group_mean.cpu().numpy(),
            scores.group_std.cpu().numpy(),
            ~scores.keep[rows.offsets[:-1]].cpu().numpy(),
        )


class ScoreGroups(beam.PTransform):
    """(bucket, light rows) -> (unit, records) for every row, and per-batch group metrics.

    Outputs: `records` (scored, filtered and duplicate-id rows, keyed by read unit) and
    `metrics` (one GROUP_METRICS table per bucket).
    """

    def __init__(self, strategy: Strategy):
        super().__init__()
        self._strategy = strategy

    def expand(self, keyed):
        prepared = (
            keyed
            | "GroupByBucket" >> beam.GroupByKey()
            | "SortAndDedupe"
            >> beam.ParDo(_PrepareBucket()).with_outputs(_PrepareBucket.DUPLICATES, main="rows")
        )
        side = {}
        if self._strategy.batch_level:
            batch_std = (
                prepared.rows
                | "BatchValues" >> beam.ParDo(_BatchValues(self._strategy))
                | "GroupByBatch" >> beam.GroupByKey()
                | "BatchStd" >> beam.Map(_batch_std)
            )
            side["batch_std"] = beam.pvalue.AsDict(batch_std)
        scored = prepared.rows | "Score" >> beam.ParDo(_ScoreBucket(self._strategy), **side).with_outputs(
            _ScoreBucket.METRICS, main="records"
        )
        records_out = (scored.records, prepared.duplicates) | "AllRecords" >> beam.Flatten()
        return records_out, scored.metrics
