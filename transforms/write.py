"""WriteScored: bring each row's record back to its read unit, re-read the unit, and write the
scored and rejected rows; Finalize: publish the staged files, metrics.json, then _SUCCESS."""

from __future__ import annotations

import json
from typing import Any

import apache_beam as beam
import numpy as np
import pyarrow as pa
import torch
from apache_beam.metrics import Metrics

from schemas import REJECT_REASON, output_schema, reason_category, rejected_schema
from schemas.experience import SCORE_FIELDS
from schemas.lists import flat_list
from transforms import storage
from transforms.metrics import row_metrics, summarize
from transforms.read import InputPlan, conform, read_unit
from transforms.records import REJECTED, SCORED
from transforms.strategies.tokens import token_advantages


STAGING = "_staging"
SUCCESS = "_SUCCESS"
METRICS = "metrics.json"
_MAX_TOKENS_PER_CHUNK = 1 << 30  # list<float32> offsets are int32


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


def _writable(a: np.ndarray) -> np.ndarray:
    # Arrow hands out read-only views; torch warns on those even though it only reads here.
    return a if a.flags.writeable else a.copy()


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


def score_columns(table: pa.Table, row_value: np.ndarray, score: np.ndarray) -> list[pa.ChunkedArray]:
    """advantages, returns (list<float32>) and score (float32) for the rows of `table`.

    `returns` equals `advantages`; both columns share one buffer in memory.
    """
    lengths, mask = response_lengths(table)
    flat = token_advantages(
        torch.from_numpy(np.ascontiguousarray(row_value)),
        torch.from_numpy(lengths),
        None if mask is None else torch.from_numpy(_writable(mask)),
    ).numpy()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    bounds = _chunk_bounds(lengths)
    chunks = []
    for first, stop in zip(bounds[:-1], bounds[1:]):
        local = (offsets[first : stop + 1] - offsets[first]).astype(np.int32)
        values = flat[offsets[first] : offsets[stop]]
        chunks.append(pa.ListArray.from_arrays(pa.array(local), pa.array(values)))
    advantages = pa.chunked_array(chunks, type=SCORE_FIELDS[0].type)
    return [advantages, advantages, pa.chunked_array([pa.array(score.astype(np.float32))])]


class _WriteUnit(beam.DoFn):
    METRICS = "metrics"

    def __init__(self, plan: InputPlan, staging: str):
        self._plan = plan
        self._staging = staging

    def setup(self):
        self._scored_schema = output_schema(self._plan.schema)
        self._rejected_schema = rejected_schema(self._plan.schema)
        self._rows_written = Metrics.counter("rescore", "rows_written")

    def _name(self, kind: str, unit: int) -> str:
        return storage.join(self._staging, f"{kind}-{unit:05d}-of-{len(self._plan.units):05d}.parquet")

    def process(self, element):
        unit_index, parts = element
        unit = self._plan.units[unit_index]
        rec = pa.concat_tables(parts)
        rec = rec.take(pa.array(np.argsort(rec["row"].to_numpy(), kind="stable")))
        rows = rec["row"].to_numpy()
        if len(rows) != unit.num_rows or not np.array_equal(rows, np.arange(unit.num_rows)):
            raise RuntimeError(
                f"internal error: read unit {unit_index} ({unit.path}) has {unit.num_rows} rows but "
                f"{len(rows)} outcomes ({len(np.unique(rows))} distinct); refusing to write it"
            )
        table = conform(read_unit(unit), self._plan.schema)
        status = rec["status"].to_numpy()
        files = []

        kept = np.flatnonzero(status == SCORED)
        scored = table if len(kept) == table.num_rows else table.take(pa.array(kept))
        scored = scored.select(self._scored_schema.names[: -len(SCORE_FIELDS)])
        score = rec["score"].to_numpy()[kept]
        row_value = score * rec["token_scale"].to_numpy()[kept]
        columns = scored.columns + score_columns(scored, row_value, score)
        scored = pa.Table.from_arrays(columns, schema=self._scored_schema)
        files.append(self._name("scored", unit_index))
        storage.write_parquet(scored, files[-1])

        bad = np.flatnonzero(status == REJECTED)
        reasons = rec["reason"].to_numpy(zero_copy_only=False)[bad]
        if len(bad):
            rejected = table.take(pa.array(bad)).select(self._rejected_schema.names[:-1])
            rejected = rejected.append_column(REJECT_REASON, pa.array(reasons, pa.string()))
            files.append(self._name("rejected", unit_index))
            storage.write_parquet(rejected, files[-1])
        self._rows_written.inc(len(kept))

        yield unit_index, files
        yield beam.pvalue.TaggedOutput(self.METRICS, self._metrics(rec, status, reasons))

    @staticmethod
    def _metrics(rec: pa.Table, status: np.ndarray, reasons: np.ndarray) -> pa.Table:
        category = np.full(len(status), None, dtype=object)
        category[status == REJECTED] = [reason_category(r) for r in reasons]
        return row_metrics(rec["batch"].combine_chunks(), status, category.tolist())


class WriteScored(beam.PTransform):
    """(unit, records) for every row -> staged scored/rejected Parquet, one file per unit.

    Outputs: `files` ((unit, [staged paths])) and `metrics` (one ROW_METRICS table per unit).
    """

    def __init__(self, plan: InputPlan, output: str):
        super().__init__()
        self._plan = plan
        self._output = output

    def expand(self, unit_records):
        written = (
            unit_records
            | "GroupByUnit" >> beam.GroupByKey()
            | "ReadBackAndWrite"
            >> beam.ParDo(_WriteUnit(self._plan, staging_dir(self._output))).with_outputs(
                _WriteUnit.METRICS, main="files"
            )
        )
        return written.files, written.metrics


class _Finalize(beam.DoFn):
    def __init__(self, plan: InputPlan, output: str, run_info: dict):
        self._plan = plan
        self._output = output
        self._run_info = run_info

    def process(self, _, files, group_tables, row_tables):
        units = sorted(u for u, _ in files)
        if units != list(range(len(self._plan.units))):
            missing = sorted(set(range(len(self._plan.units))) - set(units))
            raise RuntimeError(f"internal error: read units {missing[:10]} produced no output")
        summary = summarize(group_tables, row_tables)
        totals = summary["totals"]
        accounted = totals["rows_written_original"] + totals["rows_filtered"] + totals["rows_rejected"]
        if totals["rows_read"] != self._plan.num_rows or accounted != self._plan.num_rows:
            raise RuntimeError(
                f"internal error: input has {self._plan.num_rows} rows, metrics account for "
                f"{totals['rows_read']} read and {accounted} written/filtered/rejected"
            )
        for _, paths in sorted(files):
            for staged in paths:
                final = storage.join(self._output, staged.rsplit("/", 1)[-1])
                if storage.exists(staged):
                    storage.rename(staged, final)
                elif not storage.exists(final):  # a retried finalize has already moved it
                    raise RuntimeError(f"staged output {staged} is missing")
        document = {**self._run_info, "input_files": len(self._plan.files), **summary}
        storage.write_text(storage.join(self._output, METRICS), json.dumps(document, indent=2) + "\n")
        storage.delete([staging_dir(self._output)])
        storage.write_text(storage.join(self._output, SUCCESS), "")
        yield document


def finalize(pipeline, plan: InputPlan, output: str, run_info: dict, files, group_tables, row_tables):
    """Publish the run once every unit is written: data files, metrics.json, then _SUCCESS."""
    return (
        pipeline
        | "FinalizeTrigger" >> beam.Create([None])
        | "Finalize"
        >> beam.ParDo(
            _Finalize(plan, output, run_info),
            files=beam.pvalue.AsList(files),
            group_tables=beam.pvalue.AsList(group_tables),
            row_tables=beam.pvalue.AsList(row_tables),
        )
    )

