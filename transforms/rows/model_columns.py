"""The columns a model stage computes, and how they join back into a read unit's rows.

The model stage (transforms/models.py) writes one side file per read unit, row for row:
`row` (int32), one column per computed value (teacher_logprobs, logprobs: list<float32>;
reward: float64) and MODEL_REJECT (string: why the row could not be scored, else null).
read_unit() joins it wherever a unit is read (the light read before the shuffle and the
write step after it), so neither the tokens nor the computed lists cross the shuffle. No Beam
here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MODEL_REJECT = "_model_reject"
"""Side-file column: the reject reason of a row the model stage could not score."""
LIST_TYPE = pa.list_(pa.float32())
ORIGINAL = "_original"
"""A computed column that the input already has keeps the input's values as NAME_original."""


@dataclass(frozen=True)
class ModelOptions:
    """The model flags of a run (see docs/models.md)."""

    teacher_model: str | None = None
    logprob_model: str | None = None
    reward_model: str | None = None
    reward_fn: str | None = None
    tokenizer: str | None = None
    dtype: str = "auto"
    batch_size: int = 16
    batch_tokens: int = 0
    padding_side: str = "right"
    accelerator: str | None = None
    entropy: bool = False
    """--entropy: per-token entropy from --logprob-model's forward pass."""
    sum_pi_squared: bool = False
    """--sum-pi-squared: per-token sum over the vocabulary of p^2, from the same pass."""
    ref_model: str | None = None
    """--ref-model: a reference causal LM filling ref_logprobs (the log-prob code path)."""

    @property
    def enabled(self) -> bool:
        return bool(self.teacher_model or self.logprob_model or self.reward_model or self.reward_fn or self.ref_model)

    @property
    def token_stats(self) -> tuple[str, ...]:
        """The per-token statistics --logprob-model's pass also writes."""
        return tuple(n for n, on in (("entropy", self.entropy), ("sum_pi_squared", self.sum_pi_squared)) if on)

    @property
    def columns(self) -> tuple[str, ...]:
        """The input columns this run computes, in a fixed order."""
        out = []
        if self.teacher_model:
            out.append("teacher_logprobs")
        if self.logprob_model:
            out.append("logprobs")
        if self.reward_model or self.reward_fn:
            out.append("reward")
        if self.logprob_model:
            out.extend(self.token_stats)
        if self.ref_model:
            out.append("ref_logprobs")
        return tuple(out)


def side_schema(columns: tuple[str, ...]) -> pa.Schema:
    fields = [pa.field("row", pa.int32())]
    fields += [pa.field(c, pa.float64() if c == "reward" else LIST_TYPE) for c in columns]
    return pa.schema(fields + [pa.field(MODEL_REJECT, pa.string())])


def extend_schema(schema: pa.Schema, columns: tuple[str, ...]) -> pa.Schema:
    """The unified input schema as the rest of the run sees it: computed list columns typed
    list<float32> (in place where the input has them, else appended), `reward` keeping its
    type, and NAME_original after the columns the input already had."""
    for name in columns:
        i = schema.get_field_index(name)
        new_type = schema.field(name).type if name == "reward" else LIST_TYPE
        if i >= 0:
            original = schema.field(name).with_name(name + ORIGINAL)
            schema = schema.set(i, pa.field(name, new_type))
            if schema.get_field_index(original.name) < 0:
                schema = schema.append(original)
        else:
            schema = schema.append(pa.field(name, new_type))
    return schema


def join_model_columns(table: pa.Table, side: pa.Table) -> pa.Table:
    """`table` (a read unit's rows in file order) with the side file's columns joined in:
    computed columns replace the input's (kept as NAME_original), MODEL_REJECT is added.

    A computed reward is cast to the input's reward type, so the reward the scores are
    computed from is the one written; where the stage computed none (the row is rejected) the
    original stays.
    """
    if side.num_rows != table.num_rows or not np.array_equal(side["row"].to_numpy(), np.arange(table.num_rows)):
        raise RuntimeError(
            f"internal error: the model side file has {side.num_rows} rows, the read unit {table.num_rows}"
        )
    for name in side.column_names:
        if name == "row":
            continue
        values = side[name]
        i = table.schema.get_field_index(name)
        if i < 0:
            table = table.append_column(name, values)
            continue
        original = table[name]
        if name == "reward":
            values = pc.if_else(values.is_null(), pc.cast(original, pa.float64()), values).cast(original.type)
        table = table.set_column(i, pa.field(name, values.type), values)
        if table.schema.get_field_index(name + ORIGINAL) < 0:
            table = table.append_column(pa.field(name + ORIGINAL, original.type), original)
    return table


def apply_model_rejects(table: pa.Table, check):
    """RowCheck `check` with the model stage's rejections: a row the model could not score is
    rejected with the model's reason (which explains any null computed column too)."""
    if MODEL_REJECT not in table.column_names:
        return check
    reasons = table[MODEL_REJECT].to_numpy(zero_copy_only=False)
    rejected = np.array([r is not None for r in reasons], dtype=bool)
    if not rejected.any():
        return check
    merged = check.reasons.copy()
    merged[rejected] = reasons[rejected]
    ok = check.ok & ~rejected
    return replace(check, ok=ok, reasons=merged, response_length=np.where(ok, check.response_length, 0))
