"""The Arrow side of the strategies' optional capabilities (transforms/strategies/base.py):
the written rows as numpy for a strategy to read (`ArrowRows`, rows/unit_rows.py), token-level advantages, extra
output columns, and the action mask of rows a filter masks. The math stays in the strategies;
this module only reads Arrow columns into numpy and builds Arrow columns from what they return.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.schemas.lists import flat_list
from rescore.transforms.rows.unit_rows import ArrowRows
from rescore.transforms.strategies.base import ADVANTAGE, ClipsTokens, MasksRows, OutputColumn, TokenColumn
from rescore.transforms.strategies.chain import StrategyChain

__all__ = [
    "ArrowRows", "output_fields", "output_columns", "token_values", "masked_flags", "correction_fields", "corrected", "clip_fields",
    "clipped",
]

ACTION_MASK = "action_mask"


def _field(column: OutputColumn) -> pa.Field:
    return pa.field(column.name, pa.list_(pa.float32()) if column.per_token else pa.float32())


def output_fields(chain: StrategyChain, input_schema: pa.Schema) -> list[pa.Field]:
    """The columns the chain's stages add to the output, in order: the AddsColumns stages'
    (advantage, then filter), then the action_mask a masking filter rewrites."""
    fields = [_field(c) for s in chain.column_stages for c in s.output_columns(input_schema.names)]
    if chain.masking is not None and ACTION_MASK in input_schema.names:
        fields.append(input_schema.field(ACTION_MASK))
    return fields + correction_fields(chain, input_schema) + clip_fields(chain, input_schema)


ACTION_MASK_ORIGINAL = "action_mask_original"


def correction_fields(chain: StrategyChain, input_schema: pa.Schema) -> list[pa.Field]:
    """The columns an off-policy correction adds: is_weights, then the input's action_mask as
    action_mask_original (or, for an input without one, the written action_mask itself)."""
    stage = chain.correction
    if stage is None:
        return []
    fields = [_field(c) for c in stage.correction_columns(input_schema.names)]
    if ACTION_MASK in input_schema.names:
        return fields + [input_schema.field(ACTION_MASK).with_name(ACTION_MASK_ORIGINAL)]
    return fields + [pa.field(ACTION_MASK, pa.list_(pa.int8()))]


CORRECTION_AUDIT = [pa.field("offpolicy_seq_log_ratio", pa.float64()), pa.field("offpolicy_mask_reason", pa.string())]
"""--audit-columns of a run with a correction: each row's sum over action tokens of
logprobs - behaviour, and the first mask that removed any of its tokens (null: none)."""


def corrected(
    chain: StrategyChain, table: pa.Table, advantage: np.ndarray, fields: list[pa.Field], audit: dict | None = None,
    factor: np.ndarray | None = None,
) -> tuple[pa.Table, list[pa.Array]]:
    """(`table` with its action_mask replaced by the corrected one, the correction's columns
    for `fields` = correction_fields(...)): the rejections of chain.correction applied to the
    rows being written; `advantage` (n,) is each row's scalar advantage. `audit`, when given,
    receives the CORRECTION_AUDIT columns by name; `factor` (n,), each row's divisor of its
    weights (rollout_is_batch_normalize), or None."""
    stage = chain.correction
    rows = ArrowRows(table)
    weights, mask, values = stage.corrected_rows(rows, advantage, factor) if factor is not None else stage.corrected_rows(rows, advantage)
    if audit is not None:
        for f in CORRECTION_AUDIT:
            audit[f.name] = pa.array(values[f.name].tolist() if f.name.endswith("reason") else values[f.name], f.type)
    lengths = rows.response()[0]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = [pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(np.asarray(weights, dtype=np.float32))).cast(fields[0].type)]
    table, kept = _with_mask(table, offsets, mask, fields[1])
    return table, out + [kept]


def _with_mask(table: pa.Table, offsets: np.ndarray, mask: np.ndarray, field: pa.Field) -> tuple[pa.Table, pa.Array]:
    """(`table` with `mask` (flat 0/1 over the response tokens at `offsets`) as its action_mask,
    the column `field` to write: the table's previous action_mask as action_mask_original, or,
    for a table without one, the new action_mask itself)."""
    if ACTION_MASK in table.column_names:
        original = table[ACTION_MASK].combine_chunks()
        values = original.flatten()
        new_values = pa.array(mask != 0) if pa.types.is_boolean(values.type) else pa.array(mask.astype(np.int64)).cast(values.type)
        rebuilt = pa.LargeListArray.from_arrays(pa.array(offsets), new_values, mask=original.is_null()).cast(original.type)
        table = table.set_column(table.schema.get_field_index(ACTION_MASK), table.schema.field(ACTION_MASK), rebuilt)
        return table, original.cast(field.type)
    rebuilt = pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(mask.astype(np.int8))).cast(field.type)
    return table.append_column(field, rebuilt), rebuilt


def clip_fields(chain: StrategyChain, input_schema: pa.Schema) -> list[pa.Field]:
    """The columns an advantage stage that clips tokens (ClipsTokens: clipb) adds: the input's
    action_mask as action_mask_original (or, for an input without one, the written action_mask);
    none after a correction stage, which adds them already."""
    if not isinstance(chain.stage(ADVANTAGE), ClipsTokens) or chain.correction is not None:
        return []
    if ACTION_MASK in input_schema.names:
        return [input_schema.field(ACTION_MASK).with_name(ACTION_MASK_ORIGINAL)]
    return [pa.field(ACTION_MASK, pa.list_(pa.int8()))]


def clipped(chain: StrategyChain, table: pa.Table, score: np.ndarray, row_tokens: pa.Array | None, fields: list[pa.Field]) -> tuple[pa.Table, list[pa.Array]]:
    """(`table` with the tokens the ClipsTokens advantage stage drops removed from its
    action_mask, the columns of `fields` = clip_fields(...)); `score` (n,) and `row_tokens` are
    what its score() left for these rows."""
    rows = ArrowRows(table)
    back = None
    if row_tokens is not None:
        fl = flat_list(row_tokens)
        back = TokenColumn(fl.offsets, np.asarray(fl.values.to_numpy(zero_copy_only=False), dtype=np.float64))
    mask = chain.stage(ADVANTAGE).token_mask(rows, score, back)
    lengths = rows.response()[0]
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not fields:  # after a correction: its columns keep the input's mask
        return _with_mask(table, offsets, mask, table.schema.field(ACTION_MASK))[0], []
    table, column = _with_mask(table, offsets, mask, fields[0])
    return table, [column]


def output_columns(chain: StrategyChain, table: pa.Table, fields: list[pa.Field]) -> list[pa.Array]:
    """The values of `output_fields(chain, ...)` (given as `fields`) for the rows of `table`."""
    rows = ArrowRows(table)
    columns: list[pa.Array] = []
    for stage in chain.column_stages:
        mine = stage.output_columns(table.schema.names)
        for column, values, field in zip(mine, stage.output_values(rows, mine), fields[len(columns) : len(columns) + len(mine)]):
            if isinstance(values, TokenColumn):
                columns.append(pa.LargeListArray.from_arrays(pa.array(values.offsets), pa.array(values.values)).cast(field.type))
            else:
                columns.append(pa.array(values).cast(field.type))
    if chain.masking is not None and ACTION_MASK in table.column_names:
        columns.append(_zeroed_action_mask(table, masked_flags(chain.masking, table), fields[len(columns)]))
    return columns


def token_values(
    chain: StrategyChain, table: pa.Table, score: np.ndarray, row_value: np.ndarray, row_tokens: pa.Array | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(flat token advantages, per-row score) of a token-level chain for the rows of `table`;
    `score` and `row_value` (n,) are what the advantage stage's score() left (score, score *
    token_scale), `row_tokens` its Scores.row_tokens for these rows (a list array), if any.
    Rows a filter masks keep their place but train on nothing."""
    rows = ArrowRows(table)
    penalties = chain.token_penalties(rows)
    if penalties is not None:  # kl_penalty before verl's reinforce_plus_plus
        values, score = chain.stage(ADVANTAGE).token_values(rows, score, row_value, token_penalties=penalties)
    elif row_tokens is None:
        values, score = chain.stage(ADVANTAGE).token_values(rows, score, row_value)
    else:
        fl = flat_list(row_tokens)
        back = TokenColumn(fl.offsets, np.asarray(fl.values.to_numpy(zero_copy_only=False), dtype=np.float64))
        values, score = chain.stage(ADVANTAGE).token_values(rows, score, row_value, row_tokens=back)
    if chain.masking is not None:
        flags = masked_flags(chain.masking, table)
        if flags.any():
            lengths = rows.response()[0]
            values = np.where(np.repeat(flags, lengths), 0.0, values)
            score = np.where(flags, 0.0, score)
    return values, score


def masked_flags(stage: MasksRows, table: pa.Table) -> np.ndarray:
    """(n,) bool: the rows of `table` that `stage` masks (its column is non-zero, or equals its
    status string; a null flags nothing)."""
    column = table[stage.mask_column]
    if pa.types.is_boolean(column.type) or pa.types.is_integer(column.type) or pa.types.is_floating(column.type):
        return np.asarray(pc.fill_null(pc.cast(column, pa.float64()), 0.0).to_numpy(), dtype=np.float64) != 0
    equal = pc.equal(column.cast(pa.string()), stage.mask_status)
    return np.asarray(pc.fill_null(equal, False).to_numpy(zero_copy_only=False), dtype=bool)


def _zeroed_action_mask(table: pa.Table, flags: np.ndarray, field: pa.Field) -> pa.Array:
    """`action_mask` with every value of a flagged row set to 0 (Trinity zeroes the mask)."""
    mask = table[ACTION_MASK].combine_chunks()
    lengths = np.asarray(pc.fill_null(pc.list_value_length(mask), 0).to_numpy(), dtype=np.int64)
    zero = np.repeat(flags, lengths)
    values = mask.flatten()
    new_values = pc.if_else(pa.array(zero), pa.scalar(False if pa.types.is_boolean(values.type) else 0, values.type), values)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    rebuilt = pa.ListArray.from_arrays(pa.array(offsets), new_values, mask=mask.is_null())
    return rebuilt.cast(field.type)
