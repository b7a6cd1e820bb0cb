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

from rescore.transforms.settings import option, seconds_arg

MODEL_REJECT = "_model_reject"
"""Side-file column: the reject reason of a row the model stage could not score."""
LIST_TYPE = pa.list_(pa.float32())
ORIGINAL = "_original"
"""A computed column that the input already has keeps the input's values as NAME_original."""


DTYPES = ("auto", "float32", "bfloat16", "float16")
"""--model-dtype's values."""

DEFAULT_REWARD_FN_TIMEOUT = 60.0
"""--reward-fn-timeout default, seconds per verifier call. A verifier call worth running takes
milliseconds to seconds (parsing an answer, running a unit test); a call still running after a
minute is stuck (an endless loop, a sandbox that never answers), and without a limit one such
row stalls the whole run forever with no message. 60 s stays far above any sane call and far
below a scheduler's or Dataflow's stuck-work alarms. 0 turns it off: the verifier then runs in
the worker's own process (no worker process, no pickling of rows), as before the flag."""


@dataclass(frozen=True)
class ModelOptions:
    """The model stage's options of a run (see docs/models.md), declared like every other run
    option (transforms/settings.py `option`): each field is its flag, its key under `models:` in a
    --config file and its --help line; pipelines/options.py builds the parser group from them and
    pipelines/model_flags.py checks the values."""

    teacher_model: str | None = option(None, metavar="DIR", help="Hugging Face causal LM directory: fills teacher_logprobs")
    logprob_model: str | None = option(
        None, metavar="DIR", help="Hugging Face causal LM directory: fills logprobs (the input's kept as logprobs_original)",
    )
    reward_model: str | None = option(
        None, metavar="DIR",
        help="Hugging Face sequence-classification reward model: replaces reward (kept as reward_original)",
    )
    reward_fn: str | None = option(
        None, metavar="MODULE:FUNCTION",
        help="Python verifier over prompt/response text or tokens: replaces reward (kept as reward_original)",
    )
    tokenizer: str | None = option(None, metavar="DIR", help="Hugging Face tokenizer directory, for a --reward-fn that takes text")
    dtype: str = option(
        "auto", flags=("--model-dtype", "--model_dtype"), dest="model_dtype", choices=DTYPES,
        help="model weights' dtype (default auto: bfloat16/float16 on a GPU, float32 on CPU)",
    )
    batch_size: int = option(
        16, flags=("--model-batch-size", "--model_batch_size"), dest="model_batch_size", help="rows per model batch (default 16)",
    )
    batch_tokens: int = option(
        0, flags=("--model-batch-tokens", "--model_batch_tokens"), dest="model_batch_tokens",
        help="tokens per model batch instead of a row count (default 0: off)",
    )
    padding_side: str = option(
        "right", flags=("--model-padding-side", "--model_padding_side"), dest="model_padding_side", choices=("right", "left"),
        help="padding of model batches (default right; results do not depend on it)",
    )
    accelerator: str | None = option(
        None, flags=("--model-accelerator", "--model_accelerator"), dest="model_accelerator", metavar="SPEC",
        help="accelerator resource hint for the model stage only, e.g. 'type:nvidia-l4;count:1;install-nvidia-driver'",
    )
    reward_fn_timeout: float | None = option(
        None, metavar="SECONDS", parse=seconds_arg,
        help=f"with --reward-fn: seconds one verifier call may take before its row is rejected "
        f"(default {DEFAULT_REWARD_FN_TIMEOUT:g}; 0: no limit, the verifier runs in the worker's own process)",
    )
    """Seconds per --reward-fn call (0: no limit); None without a --reward-fn."""
    entropy: bool = option(False, help="with --logprob-model: also write per-token entropy (same forward pass)")
    """--entropy: per-token entropy from --logprob-model's forward pass."""
    sum_pi_squared: bool = option(
        False,
        help="with --logprob-model: also write per-token sum_pi_squared, the sum over the vocabulary of p^2 (same forward pass)",
    )
    """--sum-pi-squared: per-token sum over the vocabulary of p^2, from the same pass."""
    ref_model: str | None = option(
        None, metavar="DIR", help="Hugging Face causal LM directory: fills ref_logprobs (the reference policy, for KL)",
    )
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


UNIT_RECORD = "unit"
"""First field of the one record per read unit the model stage sends with its row results:
("unit", rows, {row: reason the row went to no model})."""


def unit_side_table(items, columns: tuple[str, ...]) -> pa.Table:
    """A read unit's side file (side_schema) from everything the model stage sent for it: one
    unit record and the row results (kind, row, value, reject reason or None) of each model.

    The result does not depend on the order of `items` (Beam delivers a GroupByKey's values in
    no particular order): the unit record's reasons (rows no model saw) come first, then, for a
    row some model could not score, the reason of the first such model in `columns` order.
    RuntimeError unless there is exactly one unit record and every result names a row of it.
    """
    items = list(items)
    units = [item for item in items if item[0] == UNIT_RECORD]
    if len(units) != 1:
        raise RuntimeError(f"internal error: the model stage sent {len(units)} unit records for one read unit")
    _, n, reasons = units[0]
    reasons = dict(reasons)
    results: dict[str, dict[int, object]] = {c: {} for c in columns}
    failed: dict[int, dict[str, str]] = {}
    for item in items:
        if item[0] == UNIT_RECORD:
            continue
        kind, row, value, reason = item
        column = "reward" if kind == "reward_fn" else kind
        if column not in results or not 0 <= row < n:
            raise RuntimeError(f"internal error: a model result for column {column!r}, row {row} of a {n}-row unit")
        if reason is not None:
            failed.setdefault(row, {})[column] = reason
        elif isinstance(value, dict):  # log-probs with token statistics (--entropy, --sum-pi-squared)
            for name, values in value.items():
                results[name][row] = values
        else:
            results[column][row] = value
    for row, by_column in failed.items():
        if row not in reasons:
            reasons[row] = next(by_column[c] for c in columns if c in by_column)
    arrays = [pa.array(np.arange(n, dtype=np.int32))]
    for c in columns:
        got = results[c]
        if c == "reward":
            arrays.append(pa.array([None if i in reasons else got.get(i) for i in range(n)], pa.float64()))
        else:
            arrays.append(_list_column([None if i in reasons else got.get(i) for i in range(n)]))
    arrays.append(pa.array([reasons.get(i) for i in range(n)], pa.string()))
    return pa.Table.from_arrays(arrays, schema=side_schema(columns))


def _list_column(values: list) -> pa.Array:
    """list<float32> from per-row arrays (None: null), built from one flat buffer."""
    lengths = np.array([0 if v is None else len(v) for v in values], dtype=np.int64)
    offsets = np.zeros(len(values) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    present = [v for v in values if v is not None and len(v)]
    flat = np.concatenate(present).astype(np.float32) if present else np.zeros(0, np.float32)
    nulls = pa.array([v is None for v in values], pa.bool_())
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat), type=LIST_TYPE, mask=nulls)


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
