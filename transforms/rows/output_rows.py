"""The rows a read unit writes, built from its rows (read again) and their outcomes: scored rows
(with their copies, token columns, strategy and audit columns), filtered rows (with
--keep-filtered) and rejected rows, and the unit's row metrics. No I/O: WriteScored stages
the tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.schemas import REJECT_REASON, output_schema, reason_category, rejected_schema
from rescore.schemas.validation import readable_text
from rescore.schemas.experience import SCORE_FIELDS
from rescore.transforms.rows.audit import AUDIT_FIELDS, FILTER_REASON
from rescore.transforms.rows import strategy_columns
from rescore.transforms.rows.copies import copy_fields, expand_copies
from rescore.transforms.rows.metrics import row_metrics
from rescore.transforms.rows.outcomes import DUPLICATED, FILTERED, IS_NORM, REJECTED, ROW_TOKENS, SCORED, SHAPED_REWARD
from rescore.transforms.rows.tokens import score_columns
from rescore.transforms.strategies import StrategyChain
from rescore.transforms.strategies.base import ADVANTAGE, ClipsTokens

if TYPE_CHECKING:
    import torch

ACTION_MASK = strategy_columns.ACTION_MASK


@dataclass(frozen=True)
class OutputSchemas:
    """The schemas of a run's scored, filtered and rejected files, with the file metadata."""

    scored: pa.Schema
    filtered: pa.Schema
    rejected: pa.Schema
    base_names: list[str]
    """The input columns of a scored row (its schema less the columns Rescore adds)."""
    extra: list[pa.Field]
    """Added after the score columns: copy columns with duplication, then the strategy's own."""
    audit: list[pa.Field]
    """Audit columns, last (--audit-columns); empty without."""


def output_schemas(
    schema: pa.Schema, task_type: pa.DataType, scoring: StrategyChain, file_metadata: dict[str, str], audit_columns: bool
) -> OutputSchemas:
    """The output schemas of a run over input of `schema` (the plan's unified schema)."""
    extra = (copy_fields(task_type) if scoring.duplicates else []) + strategy_columns.output_fields(scoring, schema)
    metadata = {**(schema.metadata or {}), **{k.encode(): v.encode() for k, v in file_metadata.items()}}
    audit = list(AUDIT_FIELDS) + (strategy_columns.CORRECTION_AUDIT if scoring.correction is not None else []) if audit_columns else []
    scored = output_schema(schema, extra + audit).with_metadata(metadata)
    added = {f.name for f in (*SCORE_FIELDS, *extra, *audit)}
    rejected = rejected_schema(schema).with_metadata(metadata)
    filtered = pa.schema(
        [f for f in rejected if f.name not in (REJECT_REASON, FILTER_REASON)] + [pa.field(FILTER_REASON, pa.string())],
        metadata=metadata,
    )
    return OutputSchemas(scored, filtered, rejected, [n for n in scored.names if n not in added], extra, audit)


REWARD, REWARD_ORIGINAL = "reward", "reward_original"


def shaped_schema(schema: pa.Schema) -> pa.Schema:
    """The input schema of a run with reward shaping: `reward` float64 (the shaped reward), the
    input's kept as `reward_original` after the input's columns (where the model stage has not
    already kept it there)."""
    i = schema.get_field_index(REWARD)
    original = schema.field(REWARD).with_name(REWARD_ORIGINAL)
    schema = schema.set(i, pa.field(REWARD, pa.float64(), schema.field(REWARD).nullable))
    return schema if schema.get_field_index(REWARD_ORIGINAL) >= 0 else schema.append(original)


def shaped_table(table: pa.Table, rec: pa.Table, schema: pa.Schema) -> pa.Table:
    """A unit's rows (in row order, conformed to the plan's schema) with the shaped rewards of
    its records as `reward` and the input's as `reward_original`, in `schema` (shaped_schema);
    a row without a shaped reward (rejected) keeps its reward, as float64."""
    original = table[REWARD]
    reward = pc.cast(original, pa.float64())
    if SHAPED_REWARD in rec.column_names:
        shaped = rec[SHAPED_REWARD].combine_chunks()
        reward = pc.if_else(shaped.is_null(), reward, shaped)
    table = table.set_column(table.schema.get_field_index(REWARD), schema.field(REWARD), reward)
    if table.schema.get_field_index(REWARD_ORIGINAL) < 0:
        table = table.append_column(schema.field(REWARD_ORIGINAL), original)
    return table


def unit_outcomes(parts: list[pa.Table], unit_index: int, num_rows: int, path: str) -> pa.Table:
    """A read unit's records in row order; RuntimeError unless every row has exactly one."""
    rec = pa.concat_tables(parts, promote_options="default")  # audit columns: null on rejected rows
    rec = rec.take(pa.array(np.argsort(rec["row"].to_numpy(), kind="stable")))
    rows = rec["row"].to_numpy()
    if len(rows) != num_rows or not np.array_equal(rows, np.arange(num_rows)):
        raise RuntimeError(
            f"internal error: read unit {unit_index} ({path}) has {num_rows} rows but "
            f"{len(rows)} outcomes ({len(np.unique(rows))} distinct); refusing to write it"
        )
    return rec


def scored_rows(
    table: pa.Table, rec: pa.Table, schemas: OutputSchemas, scoring: StrategyChain, copy_plans: dict | None,
    task_type: pa.DataType, device: torch.device | None,
) -> tuple[pa.Table, pa.Array]:
    """(the unit's scored rows, then their copies; the batch of each copy).

    table: the unit's rows (conformed to the plan's schema); rec: its records (unit_outcomes).
    """
    status = rec["status"].to_numpy()
    kept = np.flatnonzero(status == SCORED)
    scored = table if len(kept) == table.num_rows else table.take(pa.array(kept))
    score_col = rec["score"].combine_chunks().take(pa.array(kept))
    valid = np.asarray(score_col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    score = np.asarray(score_col.fill_null(0.0).to_numpy(), dtype=np.float64)
    row_value = score * rec["token_scale"].to_numpy()[kept]
    row_tokens = rec[ROW_TOKENS].combine_chunks().take(pa.array(kept)) if ROW_TOKENS in rec.column_names else None
    is_norm = np.asarray(rec[IS_NORM].combine_chunks().take(pa.array(kept)).to_numpy(zero_copy_only=False), dtype=np.float64) if IS_NORM in rec.column_names else None
    extra_columns: list = []
    copied_batch = pa.array([], pa.int64())
    copies = scoring.duplicates
    if copies:
        scored, source, extra_columns = expand_copies(scored, copy_plans or {}, task_type)
        score, row_value, valid = score[source], row_value[source], valid[source]
        row_tokens = None if row_tokens is None else row_tokens.take(pa.array(source))
        is_norm = None if is_norm is None else is_norm[source]
        copied_batch = rec["batch"].combine_chunks().take(pa.array(kept[source[len(kept):]]))
    stage_fields = schemas.extra[2 if copies else 0 :]
    clip_fields = strategy_columns.clip_fields(scoring, table.schema)
    if clip_fields:
        stage_fields = stage_fields[: -len(clip_fields)]
    correction: list = []
    correction_audit: dict = {}
    if scoring.correction is not None:  # rejected tokens zeroed in action_mask before the advantages
        n_corr = len(strategy_columns.correction_fields(scoring, table.schema))
        stage_fields, corr_fields = stage_fields[:-n_corr], stage_fields[-n_corr:]
        scored, correction = strategy_columns.corrected(scoring, scored, row_value, corr_fields, correction_audit, is_norm)
    clip: list = []
    if isinstance(scoring.stage(ADVANTAGE), ClipsTokens):  # clipb: tokens leave the written action_mask
        had_mask = ACTION_MASK in table.column_names
        scored, clip = strategy_columns.clipped(scoring, scored, score, row_tokens, clip_fields)
        if correction and not had_mask:  # the correction wrote the only action_mask column: the clipped one
            correction[-1] = scored[ACTION_MASK].combine_chunks().cast(correction[-1].type)
    extra_columns += strategy_columns.output_columns(scoring, scored, stage_fields) + correction + clip
    if schemas.audit:
        at = pa.array(kept if not copies else kept[source])
        extra_columns += [
            correction_audit[f.name] if f.name in correction_audit else _audit_column(rec, f).take(at) for f in schemas.audit
        ]
    token_values = None
    if scoring.token_level:
        token_values, score = strategy_columns.token_values(scoring, scored, score, row_value, row_tokens)
    columns = scored.select(schemas.base_names).columns + score_columns(
        scored, row_value, score, None if valid.all() else valid, token_values, device
    )
    return pa.Table.from_arrays(columns + extra_columns, schema=schemas.scored), copied_batch


def written_rows(
    table: pa.Table, rec: pa.Table, schemas: OutputSchemas, scoring: StrategyChain, copy_plans: dict | None,
    task_type: pa.DataType, device: torch.device | None,
) -> tuple[pa.Table, pa.Array, pa.Table]:
    """scored_rows, and the records it leaves: a scored row with a number Rescore adds that is
    not finite once written (a token advantage of a log-prob of -1e300 is beyond float32, where
    its row's score was not) is rejected with the reason, never published. (scored rows, batch
    of each copy, the unit's records.)"""
    scored, copied_batch = scored_rows(table, rec, schemas, scoring, copy_plans, task_type, device)
    kept = np.flatnonzero(rec["status"].to_numpy() == SCORED)
    added = [f.name for f in (*SCORE_FIELDS, *schemas.extra) if pa.types.is_floating(_value_type(f.type))]
    bad = _unwritable(scored.slice(0, len(kept)), added)
    if bad is None:
        return scored, copied_batch, rec
    status = rec["status"].to_numpy().copy()
    reasons = rec["reason"].to_pylist()
    for i in np.flatnonzero(bad):
        status[kept[i]] = REJECTED
        reasons[kept[i]] = f"non_finite_score: {bad[i]} is not finite once written (the row's inputs pass the float range)"
    rec = rec.set_column(rec.schema.get_field_index("status"), rec.schema.field("status"), pa.array(status, pa.int8()))
    rec = rec.set_column(rec.schema.get_field_index("reason"), rec.schema.field("reason"), pa.array(reasons, pa.string()))
    scored, copied_batch = scored_rows(table, rec, schemas, scoring, copy_plans, task_type, device)
    return scored, copied_batch, rec


def _value_type(t: pa.DataType) -> pa.DataType:
    return t.value_type if pa.types.is_list(t) or pa.types.is_large_list(t) else t


def _unwritable(scored: pa.Table, names: list[str]) -> np.ndarray | None:
    """(n,) object: for each row of `scored`, the first of `names` holding a NaN or +-inf (None:
    none); None where no row has one.

    Chunk by chunk, never joined (a join copied every token value of `advantages` and of
    `returns` once more per unit written); a column whose chunks are the very arrays of one
    checked before (`returns` shares `advantages`' buffers, rows/tokens.py) has the same rows."""
    out = np.full(scored.num_rows, None, dtype=object)
    checked: set[tuple] = set()
    for name in names:
        if name not in scored.column_names:
            continue
        column = scored[name]
        same = tuple((c.offset, len(c), *(b.address if b is not None else 0 for b in c.buffers())) for c in column.chunks)
        if same in checked:
            continue
        checked.add(same)
        start = 0
        for chunk in column.chunks:
            for r in _non_finite_rows(chunk):
                if out[start + r] is None:
                    out[start + r] = name
            start += len(chunk)
    return out if any(v is not None for v in out) else None


def _non_finite_rows(chunk: pa.Array) -> np.ndarray:
    """Rows of `chunk` (a float column, or a list of floats) with a NaN or +-inf, ascending."""
    if pa.types.is_list(chunk.type) or pa.types.is_large_list(chunk.type):
        finite = pc.fill_null(pc.is_finite(chunk.flatten()), True)
        if pc.all(finite).as_py() is not False:
            return np.empty(0, np.int64)
        parents = np.asarray(pc.list_parent_indices(chunk).to_numpy(zero_copy_only=False))
        return np.unique(parents[~np.asarray(finite.to_numpy(zero_copy_only=False), dtype=bool)])
    finite = pc.fill_null(pc.is_finite(chunk), True)
    if pc.all(finite).as_py() is not False:
        return np.empty(0, np.int64)
    return np.flatnonzero(~np.asarray(finite.to_numpy(zero_copy_only=False), dtype=bool))


def _audit_column(rec: pa.Table, field: pa.Field) -> pa.Array:
    """(records,) the unit's `field` audit values: null on rejected rows, and all null where
    every row of the unit was rejected (no record of it carries the column)."""
    if field.name not in rec.column_names:
        return pa.nulls(rec.num_rows, field.type)
    return rec[field.name].combine_chunks().cast(field.type)


def filtered_rows(table: pa.Table, rec: pa.Table, schemas: OutputSchemas) -> pa.Table | None:
    """The unit's filtered rows with the reason each was dropped; None where there are none."""
    dropped = np.flatnonzero(rec["status"].to_numpy() == FILTERED)
    if not len(dropped):
        return None
    filtered = table.take(pa.array(dropped)).select(schemas.filtered.names[:-1])
    why = rec["reason"].combine_chunks().take(pa.array(dropped))
    filtered = filtered.append_column(FILTER_REASON, why.cast(pa.string()))
    return filtered.replace_schema_metadata(schemas.filtered.metadata)


def rejected_reasons(rec: pa.Table) -> np.ndarray:
    """(rejected rows,) why each rejected row of the unit was rejected, in row order."""
    bad = np.flatnonzero(rec["status"].to_numpy() == REJECTED)
    return rec["reason"].to_numpy(zero_copy_only=False)[bad]


def rejected_rows(table: pa.Table, rec: pa.Table, schemas: OutputSchemas) -> pa.Table | None:
    """The unit's rejected rows with their reason; None where there are none."""
    bad = np.flatnonzero(rec["status"].to_numpy() == REJECTED)
    if not len(bad):
        return None
    rejected = table.take(pa.array(bad)).select(schemas.rejected.names[:-1])
    rejected = rejected.append_column(REJECT_REASON, pa.array(rejected_reasons(rec), pa.string()))
    return readable_text(rejected).replace_schema_metadata(schemas.rejected.metadata)  # (a bad_task row's bytes)


def unit_metrics(rec: pa.Table, copied_batch: pa.Array) -> pa.Table:
    """The unit's ROW_METRICS: its records' outcomes (reject reasons by category) and its copies."""
    status = rec["status"].to_numpy()
    category = np.full(len(status), None, dtype=object)
    category[status == REJECTED] = [reason_category(r) for r in rejected_reasons(rec)]
    batch = pa.concat_arrays([rec["batch"].combine_chunks(), copied_batch])
    status = np.concatenate([status, np.full(len(copied_batch), DUPLICATED, np.int8)])
    return row_metrics(batch, status, category.tolist() + [None] * len(copied_batch))
