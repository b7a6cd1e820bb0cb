"""WriteScored: bring each row's record back to its read unit, re-read the unit, and write the
scored and rejected rows; Finalize: publish the staged files, metrics.json, then _SUCCESS."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from apache_beam.metrics import Metrics

from rescore.schemas import REJECT_REASON, output_schema, reason_category, rejected_schema
from rescore.schemas.experience import SCORE_FIELDS
from rescore.schemas.lists import flat_list
from rescore.transforms import device as devices
from rescore.transforms import faults, ownership, storage
from rescore.transforms import fingerprint as fingerprints
from rescore.transforms.device import to_device
from rescore.transforms.metrics import row_metrics, summarize
from rescore.transforms.overlap import Overlap, resolve_threads
from rescore.transforms.read import InputPlan, conform, read_unit
from rescore.transforms.rows import parquet_out, unit_cache
from rescore.transforms.audit import AUDIT_FIELDS, FILTER_REASON
from rescore.transforms.records import DUPLICATED, FILTERED, REJECTED, SCORED
from rescore.transforms.strategies import StrategyChain
from rescore.transforms.strategies.selection import COPY_INDEX, SOURCE_TASK, copy_task_ids
from rescore.transforms.strategies.tokens import token_advantages

STAGING = "_staging"
SUCCESS = "_SUCCESS"
METRICS = "metrics.json"
FILTERED_FILES = "filtered-*.parquet"
_MAX_TOKENS_PER_CHUNK = 1 << 30  # list<float32> offsets are int32
PLAIN_COLUMNS = ("advantages", "returns")
"""Written without dictionary encoding where pyarrow writes the file (see rows/parquet_out.py):
a dictionary per token saves ~10 % of their size and costs ~40 % of the file's encoding time."""


def staging_dir(output: str) -> str:
    return storage.join(output, STAGING)


def response_lengths(table: pa.Table) -> tuple[np.ndarray, Any]:
    """(lengths (n,), flat action mask values or None) of valid rows."""
    names = table.column_names
    if "action_mask" in names:
        fl = flat_list(table["action_mask"])
        return fl.lengths, fl.values.to_numpy(zero_copy_only=False)
    if "logprobs" in names:
        return flat_list(table["logprobs"]).lengths, None
    if "tokens" in names:
        tokens = flat_list(table["tokens"]).lengths
        prompt = table["prompt_length"].to_numpy(zero_copy_only=False).astype(np.int64)
        return tokens - prompt, None
    return np.zeros(table.num_rows, dtype=np.int64), None


def _chunk_bounds(lengths: np.ndarray) -> list[int]:
    """Row boundaries such that each chunk holds at most ~2^30 tokens (int32 list offsets)."""
    ends = np.cumsum(lengths)
    bounds = [0]
    while bounds[-1] < len(lengths):
        first = bounds[-1]
        base = int(ends[first - 1]) if first else 0
        stop = int(np.searchsorted(ends, base + _MAX_TOKENS_PER_CHUNK, side="right"))
        bounds.append(max(stop, first + 1))
    return bounds if len(bounds) > 1 else [0, 0]


def score_columns(
    table: pa.Table,
    row_value: np.ndarray,
    score: np.ndarray,
    valid: np.ndarray | None = None,
    token_values: np.ndarray | None = None,
    device: torch.device | None = None,
) -> list[pa.ChunkedArray]:
    """advantages, returns (list<float32>) and score (float32) for the rows of `table`.

    advantages = row_value * action_mask, or `token_values` (flat, already masked) for a
    token-level strategy. `returns` equals `advantages`; both columns share one buffer in
    memory. Rows where `valid` is False (no advantage computed) get nulls in all three. The
    broadcast runs on `device` (default CPU) over flat token arrays: one copy in, one out.
    """
    device = device or torch.device("cpu")
    lengths, mask = response_lengths(table)
    if valid is not None:
        row_value = np.where(valid, row_value, 0.0)
    if token_values is not None:
        flat = np.asarray(token_values, dtype=np.float32) + np.float32(0.0)  # -0.0 -> +0.0
    else:
        flat = token_advantages(
            to_device(np.asarray(row_value, dtype=np.float64), device),
            to_device(np.asarray(lengths, dtype=np.int64), device),
            None if mask is None else to_device(np.asarray(mask), device),
        ).cpu().numpy()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    bounds = _chunk_bounds(lengths)
    chunks = []
    for first, stop in zip(bounds[:-1], bounds[1:]):
        local = (offsets[first : stop + 1] - offsets[first]).astype(np.int32)
        values = flat[offsets[first] : offsets[stop]]
        nulls = None if valid is None else pa.array(~valid[first:stop])
        chunks.append(pa.ListArray.from_arrays(pa.array(local), pa.array(values), mask=nulls))
    advantages = pa.chunked_array(chunks, type=SCORE_FIELDS[0].type)
    score32 = pa.array(score.astype(np.float32), mask=None if valid is None else ~valid)
    return [advantages, advantages, pa.chunked_array([score32])]


def part_bounds(rows: int, shard_rows: int) -> list[int]:
    """Row boundaries of ceil(rows / shard_rows) consecutive parts of about equal size
    ([0, rows] for a single part)."""
    parts = max(1, -(-rows // shard_rows))
    return [rows * k // parts for k in range(parts + 1)]


def copy_fields(task_type: pa.DataType) -> list[pa.Field]:
    """The columns a run with duplication adds: 0 / the copy number, and the copied group."""
    return [pa.field(COPY_INDEX, pa.int32()), pa.field(SOURCE_TASK, task_type)]


class CopyIndex:
    """Copy plans as sorted arrays, so that a read unit finds its rows' copies with vectorised
    lookups (no loop over its rows, no pass over the unit per batch).

    copy_plans: {batch: (stride, plan table with columns task, copies)}, the side input;
    batches: the batches to index (a read unit's), default all. Keys are batch position *
    tasks + task code, tasks dictionary-encoded over the indexed plans.
    """

    def __init__(self, copy_plans, task_type: pa.DataType, batches=None):
        wanted = sorted(copy_plans) if batches is None else [b for b in batches if b in copy_plans]
        self.batches = np.array(wanted, dtype=np.int64)
        entries = [copy_plans[b] for b in self.batches.tolist()]
        self.strides = np.array([stride for stride, _ in entries], dtype=np.int64)
        tables = [plan for _, plan in entries]
        # One concatenation, then one pass over the columns (a cast per tiny plan would cost
        # more than the whole lookup when a unit holds thousands of batches).
        plans = pa.concat_tables(tables).combine_chunks() if tables else None
        if plans is None or not plans.num_rows:
            self.dictionary, self.width = pa.array([], task_type), 1
            self.keys, self.copies = np.zeros(0, np.int64), np.zeros(0, np.int64)
            return
        encoded = pc.dictionary_encode(pc.cast(plans["task"], task_type).combine_chunks())
        self.dictionary, self.width = encoded.dictionary, max(len(encoded.dictionary), 1)
        code = np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
        plan_batch = np.repeat(np.arange(len(tables), dtype=np.int64), [t.num_rows for t in tables])
        keys = plan_batch * self.width + code
        order = np.argsort(keys, kind="stable")
        self.keys = keys[order]
        self.copies = np.asarray(plans["copies"].to_numpy(), dtype=np.int64)[order]

    def lookup(self, batch: np.ndarray, task: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(copies (n,), strides (n,)) int64 of each row: how many copies its (batch, task)
        group's plan asks for (0 without one) and its batch's task-id stride (0 without a plan)."""
        n = len(batch)
        copies = np.zeros(n, dtype=np.int64)
        strides = np.zeros(n, dtype=np.int64)
        if not n or not len(self.batches):
            return copies, strides
        pos = np.minimum(np.searchsorted(self.batches, batch), len(self.batches) - 1)
        planned = self.batches[pos] == batch
        strides[planned] = self.strides[pos[planned]]
        if not len(self.keys):
            return copies, strides
        where = pc.index_in(task, value_set=self.dictionary)
        known = np.asarray(where.is_valid().to_numpy(zero_copy_only=False), dtype=bool) & planned
        code = np.asarray(where.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        key = pos * self.width + code
        at = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
        found = known & (self.keys[at] == key)
        copies[found] = self.copies[at[found]]
        return copies, strides


def expand_copies(table: pa.Table, copy_plans: dict, task_type: pa.DataType) -> tuple[pa.Table, np.ndarray, list[pa.Array]]:
    """`table` (kept rows) followed by the copies the plan asks for.

    Returns (rows, source row of each output row, [copy_index, source_task]). Copy k of a row
    has task = copy_task_ids(task, k), copy_index = k and source_task = the original task;
    every other column, the score included, is the original's.
    """
    n = table.num_rows
    batch = np.asarray(table["batch"].to_numpy(), dtype=np.int64) if n else np.zeros(0, np.int64)
    task = pc.cast(table["task"], task_type).combine_chunks() if n else pa.array([], task_type)
    # Index only this unit's batches: its cost follows the unit, not the run's batch count.
    copies, strides = CopyIndex(copy_plans, task_type, np.unique(batch).tolist()).lookup(batch, task)
    # Copy k = 1..copies[i] of row i, in row order: one vectorised pass, no loop over rows.
    source = np.repeat(np.arange(n), copies)
    index = np.arange(len(source), dtype=np.int64) - np.repeat(np.cumsum(copies) - copies, copies) + 1
    rows_out = np.concatenate([np.arange(n), source])
    copy_index = np.concatenate([np.zeros(n, np.int64), index]).astype(np.int32)
    source_task = task.take(pa.array(rows_out))
    out = table.take(pa.array(rows_out)) if len(source) else table
    if len(source):
        new_task = task.take(pa.array(source))
        if pa.types.is_integer(task_type):
            new_task = pa.array(
                np.asarray(new_task.to_numpy(), dtype=np.int64) + index * strides[source], pa.int64()
            )
        else:
            new_task = copy_task_ids(new_task, index, 0)
        task_col = pa.concat_arrays([task, new_task]).cast(table.schema.field("task").type)
        out = out.set_column(out.schema.get_field_index("task"), table.schema.field("task"), task_col)
    return out, rows_out, [pa.array(copy_index), source_task]


class _WriteUnit(beam.DoFn):
    METRICS = "metrics"

    def __init__(
        self, plan: InputPlan, staging: str, scoring: StrategyChain, device: str = "auto", file_metadata=None, threads: int = 0,
        shard_rows: int = 65536, keep_filtered: bool = False, audit_columns: bool = False,
    ):
        self._keep_filtered = keep_filtered
        self._audit_columns = audit_columns
        self._shard_rows = shard_rows
        self._plan = plan
        self._staging = staging
        self._scoring = scoring
        self._device_choice = device
        self._file_metadata = dict(file_metadata or {})
        self._threads = threads

    def setup(self):
        self._device = devices.resolve(self._device_choice)
        self._copies = self._scoring.duplicates
        self._extra = (copy_fields(self._plan.task_type) if self._copies else []) + self._scoring.output_fields(self._plan.schema)
        metadata = {**(self._plan.schema.metadata or {}), **{k.encode(): v.encode() for k, v in self._file_metadata.items()}}
        self._audit = list(AUDIT_FIELDS) if self._audit_columns else []
        self._scored_schema = output_schema(self._plan.schema, self._extra + self._audit).with_metadata(metadata)
        added = {f.name for f in (*SCORE_FIELDS, *self._extra, *self._audit)}
        self._base_names = [n for n in self._scored_schema.names if n not in added]
        self._rejected_schema = rejected_schema(self._plan.schema).with_metadata(metadata)
        self._filtered_schema = pa.schema(
            [f for f in self._rejected_schema if f.name not in (REJECT_REASON, FILTER_REASON)] + [pa.field(FILTER_REASON, pa.string())],
            metadata=metadata,
        )
        self._rows_written = Metrics.counter("rescore", "rows_written")
        threads = resolve_threads(self._threads)
        self._overlap = Overlap(threads, self._outputs)
        self._part_pool = ThreadPoolExecutor(threads, thread_name_prefix="rescore-part") if threads > 1 else None

    def _name(self, kind: str, unit: int, part: int | None = None) -> str:
        suffix = "" if part is None else f"-part-{part:03d}"
        return storage.join(self._staging, f"{kind}-{unit:05d}-of-{len(self._plan.units):05d}{suffix}.parquet")

    def _write_scored(self, table: pa.Table, unit_index: int) -> list[str]:
        """Stage the unit's scored rows: one file, or (a row group larger than --shard-rows, or
        copies past it) consecutive parts of at most shard_rows rows, written side by side."""
        bounds = part_bounds(table.num_rows, self._shard_rows)
        if len(bounds) == 2:
            names = [self._name("scored", unit_index)]
        else:
            names = [self._name("scored", unit_index, k) for k in range(len(bounds) - 1)]

        def write(k: int) -> None:
            part = table.slice(bounds[k], bounds[k + 1] - bounds[k])
            parquet_out.write_table(part, names[k], plain=PLAIN_COLUMNS)

        if self._part_pool is None or len(names) == 1:
            for k in range(len(names)):
                write(k)
        else:
            list(self._part_pool.map(write, range(len(names))))
        return names

    def process(self, element, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam, copy_plans=None):
        unit_index, parts = element
        yield from self._overlap.submit(self._work, unit_index, list(parts), copy_plans, window=window, timestamp=timestamp)

    def finish_bundle(self):
        yield from self._overlap.drain()

    def teardown(self):
        self._overlap.close()
        if self._part_pool is not None:
            self._part_pool.shutdown(wait=True)

    def _outputs(self, result):
        unit_index, files, rows_written, metrics = result
        self._rows_written.inc(rows_written)
        yield unit_index, files
        yield beam.pvalue.TaggedOutput(self.METRICS, metrics)

    def _work(self, unit_index: int, parts: list[pa.Table], copy_plans):
        """Read the unit back, attach its records and write its files (on an Overlap thread)."""
        unit = self._plan.units[unit_index]
        rec = pa.concat_tables(parts, promote_options="default")  # audit columns: null on rejected rows
        rec = rec.take(pa.array(np.argsort(rec["row"].to_numpy(), kind="stable")))
        rows = rec["row"].to_numpy()
        if len(rows) != unit.num_rows or not np.array_equal(rows, np.arange(unit.num_rows)):
            raise RuntimeError(
                f"internal error: read unit {unit_index} ({unit.path}) has {unit.num_rows} rows but "
                f"{len(rows)} outcomes ({len(np.unique(rows))} distinct); refusing to write it"
            )
        faults.maybe_pause_readback()
        table = conform(unit_cache.read_back(unit, read_unit), self._plan.schema)
        status = rec["status"].to_numpy()
        files = []

        kept = np.flatnonzero(status == SCORED)
        scored = table if len(kept) == table.num_rows else table.take(pa.array(kept))
        score_col = rec["score"].combine_chunks().take(pa.array(kept))
        valid = np.asarray(score_col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        score = np.asarray(score_col.fill_null(0.0).to_numpy(), dtype=np.float64)
        row_value = score * rec["token_scale"].to_numpy()[kept]
        extra_columns: list = []
        copied_batch = pa.array([], pa.int64())
        if self._copies:
            scored, source, extra_columns = expand_copies(scored, copy_plans or {}, self._plan.task_type)
            score, row_value, valid = score[source], row_value[source], valid[source]
            copied_batch = rec["batch"].combine_chunks().take(pa.array(kept[source[len(kept):]]))
        extra_columns += self._scoring.output_columns(scored, self._extra[2 if self._copies else 0 :])
        if self._audit:
            at = pa.array(kept if not self._copies else kept[source])
            extra_columns += [rec[f.name].combine_chunks().take(at).cast(f.type) for f in self._audit]
        token_values = None
        if self._scoring.token_level:
            token_values, score = self._scoring.token_values(scored, score, row_value)
        columns = scored.select(self._base_names).columns + score_columns(
            scored, row_value, score, None if valid.all() else valid, token_values, self._device
        )
        scored = pa.Table.from_arrays(columns + extra_columns, schema=self._scored_schema)
        files += self._write_scored(scored, unit_index)
        faults.maybe_slow_write()

        dropped = np.flatnonzero(status == FILTERED) if self._keep_filtered else []
        if len(dropped):
            filtered = table.take(pa.array(dropped)).select(self._filtered_schema.names[:-1])
            why = rec["reason"].combine_chunks().take(pa.array(dropped))
            filtered = filtered.append_column(FILTER_REASON, why.cast(pa.string()))
            files.append(self._name("filtered", unit_index))
            parquet_out.write_table(filtered.replace_schema_metadata(self._filtered_schema.metadata), files[-1])

        bad = np.flatnonzero(status == REJECTED)
        reasons = rec["reason"].to_numpy(zero_copy_only=False)[bad]
        if len(bad):
            rejected = table.take(pa.array(bad)).select(self._rejected_schema.names[:-1])
            rejected = rejected.append_column(REJECT_REASON, pa.array(reasons, pa.string()))
            rejected = rejected.replace_schema_metadata(self._rejected_schema.metadata)
            files.append(self._name("rejected", unit_index))
            parquet_out.write_table(rejected, files[-1])
        return unit_index, files, scored.num_rows, self._metrics(rec, status, reasons, copied_batch)

    @staticmethod
    def _metrics(rec: pa.Table, status: np.ndarray, reasons: np.ndarray, copied_batch: pa.Array) -> pa.Table:
        category = np.full(len(status), None, dtype=object)
        category[status == REJECTED] = [reason_category(r) for r in reasons]
        batch = pa.concat_arrays([rec["batch"].combine_chunks(), copied_batch])
        status = np.concatenate([status, np.full(len(copied_batch), DUPLICATED, np.int8)])
        return row_metrics(batch, status, category.tolist() + [None] * len(copied_batch))


class WriteScored(beam.PTransform):
    """(unit, records) for every row -> staged scored/rejected Parquet, one file per unit.

    Outputs: `files` ((unit, [staged paths])) and `metrics` (one ROW_METRICS table per unit).
    """

    def __init__(
        self, plan: InputPlan, output: str, scoring: StrategyChain, copy_plans=None, *, device: str = "auto",
        accelerator: str | None = None, file_metadata: dict[str, str] | None = None, threads: int = 0,
        shard_rows: int = 65536, keep_filtered: bool = False, audit_columns: bool = False,
    ):
        super().__init__()
        self._keep_filtered = keep_filtered
        self._audit_columns = audit_columns
        self._threads = threads
        self._shard_rows = shard_rows
        self._plan = plan
        self._output = output
        self._scoring = scoring
        self._copy_plans = copy_plans
        self._device = device
        self._accelerator = accelerator
        self._file_metadata = file_metadata

    def expand(self, unit_records):
        side = {} if self._copy_plans is None else {"copy_plans": beam.pvalue.AsDict(self._copy_plans)}
        write = beam.ParDo(
            _WriteUnit(
                self._plan, staging_dir(self._output), self._scoring, self._device, self._file_metadata, self._threads,
                self._shard_rows, self._keep_filtered, self._audit_columns,
            ),
            **side,
        )
        write = write.with_outputs(_WriteUnit.METRICS, main="files")
        if self._accelerator:
            write = write.with_resource_hints(accelerator=self._accelerator)
        written = unit_records | "GroupByUnit" >> beam.GroupByKey() | "ReadBackAndWrite" >> write
        return written.files, written.metrics


class _Finalize(beam.DoFn):
    def __init__(self, plan: InputPlan, output: str, run_info: dict, stages, max_reject_fraction: float):
        self._plan = plan
        self._output = output
        self._run_info = run_info
        self._stages = stages
        self._max_reject_fraction = max_reject_fraction

    def process(self, _, files, group_tables, row_tables, copy_tables=()):
        units = sorted(u for u, _ in files)
        if units != list(range(len(self._plan.units))):
            missing = sorted(set(range(len(self._plan.units))) - set(units))
            raise RuntimeError(f"internal error: read units {missing[:10]} produced no output")
        summary = summarize(group_tables, row_tables, copy_tables, self._stages)
        totals = summary["totals"]
        if totals["rows_read"] != self._plan.num_rows:
            raise RuntimeError(
                f"internal error: input has {self._plan.num_rows} rows, metrics account for "
                f"{totals['rows_read']} written/filtered/rejected"
            )
        planned = sum(int(t["rows_duplicated"].to_numpy().sum()) for t in copy_tables)
        if planned != totals["rows_duplicated"]:
            raise RuntimeError(
                f"internal error: the copy plan asked for {planned} copied rows, {totals['rows_duplicated']} were written"
            )
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
        faults.maybe_pause_finalize()
        # Every input is still the file the plan read: an input changed at any point of the run
        # fails it here, before anything is published.
        for unit in {u.path: u for u in self._plan.units if u.fingerprint is not None}.values():
            fingerprints.verify(unit.path, unit.fingerprint)
        # Publish: only Rescore's own files are replaced, a finished earlier run only at the end.
        staged = [path for _, paths in sorted(files) for path in paths]
        ownership.publish(self._output, staged, json.dumps(document, indent=2) + "\n", failed=bool(failure))
        yield document


def reject_budget_failure(totals: dict, max_fraction: float) -> str | None:
    """The one-line reason the run fails its reject budget, or None."""
    read, rejected = totals["rows_read"], totals["rows_rejected"]
    if read == 0 or rejected / read <= max_fraction:
        return None
    top = ", ".join(f"{k} {v:,}" for k, v in sorted(totals["reject_reasons"].items(), key=lambda kv: -kv[1])[:3])
    return (
        f"{rejected:,} of {read:,} rows ({rejected / read:.1%}) were rejected ({top}), more than "
        f"--max-reject-fraction={max_fraction:g}"
    )


def finalize(
    pipeline, plan: InputPlan, output: str, run_info: dict, stages, files, group_tables, row_tables,
    copy_tables=None, max_reject_fraction: float = 1.0,
):
    """Publish the run once every unit is written: data files, metrics.json, then _SUCCESS.

    `stages`: (kind, name, params) of the scoring plan, for the per-strategy metrics. A run over
    its reject budget publishes only its rejected files and metrics.json (with `failed`)."""
    side = {} if copy_tables is None else {"copy_tables": beam.pvalue.AsList(copy_tables)}
    return (
        pipeline
        | "FinalizeTrigger" >> beam.Create([None])
        | "Finalize"
        >> beam.ParDo(
            _Finalize(plan, output, run_info, stages, max_reject_fraction),
            files=beam.pvalue.AsList(files),
            group_tables=beam.pvalue.AsList(group_tables),
            row_tables=beam.pvalue.AsList(row_tables),
            **side,
        )
    )

