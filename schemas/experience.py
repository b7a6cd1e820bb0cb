"""The Arrow schemas of the input/output contract (see docs/output.md).

Input: one row per experience, Trinity-RFT `Experience`/`EID` column names. Output: every input
column unchanged plus `advantages`, `returns` and `score`; rejected rows plus `reject_reason`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.types as pat

from rescore.errors import SchemaError
from rescore.needs import required_column

ID_COLUMNS = ("batch", "task", "run", "step")
"""The experience id. `step` is optional and defaults to 0."""

SCORE_COLUMNS = ("advantages", "returns", "score")
REJECT_REASON = "reject_reason"


def _is_int(t: pa.DataType) -> bool:
    return pat.is_integer(t)


def _is_float(t: pa.DataType) -> bool:
    return pat.is_floating(t)


def _is_reward(t: pa.DataType) -> bool:
    # Integer rewards (0/1 correctness) are common and convert to float64 exactly.
    return pat.is_floating(t) or pat.is_integer(t)


def _is_task(t: pa.DataType) -> bool:
    return pat.is_integer(t) or pat.is_string(t) or pat.is_large_string(t)


def _list_of(pred: Callable[[pa.DataType], bool]) -> Callable[[pa.DataType], bool]:
    def check(t: pa.DataType) -> bool:
        return (pat.is_list(t) or pat.is_large_list(t)) and pred(t.value_type)

    return check


def _is_mask_value(t: pa.DataType) -> bool:
    return pat.is_boolean(t) or pat.is_integer(t)


@dataclass(frozen=True)
class Column:
    name: str
    required: bool
    accepts: Callable[[pa.DataType], bool]
    expected: str
    """What the contract allows, in words, for error messages."""


INPUT_COLUMNS: tuple[Column, ...] = (
    Column("batch", True, _is_int, "an integer"),
    Column("task", True, _is_task, "an integer or a string"),
    Column("run", True, _is_int, "an integer"),
    Column("step", False, _is_int, "an integer"),
    Column("reward", True, _is_reward, "a float (or integer)"),
    Column("tokens", False, _list_of(_is_int), "a list of integers"),
    Column("prompt_length", False, _is_int, "an integer"),
    Column("logprobs", False, _list_of(_is_float), "a list of floats"),
    Column("action_mask", False, _list_of(_is_mask_value), "a list of bools or integers"),
)
INPUT_BY_NAME = {c.name: c for c in INPUT_COLUMNS}

NEEDED_COLUMNS: dict[str, Column] = {
    "expert": Column("expert", False, _is_mask_value, "a bool (or 0/1 integer)"),
    "teacher_logprobs": Column("teacher_logprobs", False, _list_of(_is_float), "a list of floats"),
    "sum_pi_squared": Column("sum_pi_squared", False, _list_of(_is_float), "a list of floats"),
    "is_weights": Column("is_weights", False, _list_of(_is_float), "a list of floats"),
    "entropy": Column("entropy", False, _list_of(_is_float), "a list of floats"),
}
"""Optional columns outside the core contract that some strategies need (mix_chord: expert;
on_policy_distill: teacher_logprobs)."""
_LOGPROB_LIST = Column("logprobs_original", False, _list_of(_is_float), "a list of floats")
"""Any other needed column named *logprobs or *logprobs_original is a per-token list
(rollout_correction's behaviour log-probs)."""

NEEDED_WHY = {
    "logprobs": "the behaviour policy's log-probs of the response tokens",
    "expert": "True for expert (SFT) rows, False for the model's own rollouts",
    "logprobs_original": (
        "the behaviour (rollout) policy's log-probs; --logprob-model keeps the input's logprobs under "
        "this name, or name another column with the behaviour_logprobs parameter"
    ),
    "sum_pi_squared": (
        "per response token, the sum over the vocabulary of p^2 under the policy that gave logprobs; "
        "pass --logprob-model DIR --sum-pi-squared to compute it"
    ),
    "is_weights": "per response token importance weights, as a rollout_correction run writes them",
    "entropy": "per response token entropy of the policy that gave logprobs; pass --logprob-model DIR --entropy to compute it",
    "teacher_logprobs": (
        "the teacher model's log-probs of each response token; pass --teacher-model DIR to compute "
        "them, or score the logged responses with the teacher (e.g. a prompt_logprobs pass in vLLM) "
        "and add them as a list column"
    ),
}
LIST_COLUMNS = ("tokens", "logprobs", "action_mask")

INPUT_SCHEMA = pa.schema(
    [
        pa.field("batch", pa.int64(), nullable=False),
        pa.field("task", pa.int64(), nullable=False),  # or pa.string()
        pa.field("run", pa.int64(), nullable=False),
        pa.field("step", pa.int64()),
        pa.field("reward", pa.float64(), nullable=False),  # or float32
        pa.field("tokens", pa.list_(pa.int64())),
        pa.field("prompt_length", pa.int64()),
        pa.field("logprobs", pa.list_(pa.float32())),
        pa.field("action_mask", pa.list_(pa.bool_())),
    ]
)
"""The canonical input schema. Compatible types are accepted too (see INPUT_COLUMNS)."""

SCORE_FIELDS = (
    pa.field("advantages", pa.list_(pa.float32())),
    pa.field("returns", pa.list_(pa.float32())),
    pa.field("score", pa.float32()),
)

AUDIT_FIELDS = [
    pa.field("group_size", pa.int64()),
    pa.field("group_reward_mean", pa.float64()),
    pa.field("group_reward_std", pa.float64()),
    pa.field("batch_reward_std", pa.float64()),
    pa.field("baseline", pa.float64()),
]
"""The audit columns of scored rows (--audit-columns, docs/output.md; computed in rows/audit.py)."""
AUDIT_NAMES = [f.name for f in AUDIT_FIELDS]
FILTER_REASON = "filter_reason"
"""The column of filtered-*.parquet that says why a row was filtered (--keep-filtered)."""


def _columns_hint(name: str, names: list[str]) -> str:
    """" (the file has 'rewards': should it be named 'reward'?); the file's columns: ...": what the file has instead."""
    import difflib

    by_lower = {n.lower(): n for n in names}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.7)
    shown = ", ".join(names[:20]) + (f", ... ({len(names)} in all)" if len(names) > 20 else "")
    return (f" (the file has {by_lower[close[0]]!r}: should it be named {name!r}?)" if close else "") + f"; the file's columns: {shown or '(none)'}"


def validate_file_schema(
    path: str, schema: pa.Schema, *, needs: tuple = ()
) -> list[str]:
    """Check one file's schema against the contract.

    Raises SchemaError naming the file and the first offending column. `needs` lists what the
    chosen strategy reads (rescore/needs.py): each column name and NullableColumn is a column
    every file must have (e.g. `logprobs` for rank correction).
    Returns the warnings (non-fatal) as one-line strings.
    """
    names = schema.names
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise SchemaError(f"{path}: column {duplicates[0]!r} appears more than once")
    for col in INPUT_COLUMNS:
        if col.name not in names:
            if col.required:
                raise SchemaError(f"{path}: missing required column {col.name!r}{_columns_hint(col.name, names)}")
            continue
        t = schema.field(col.name).type
        if not col.accepts(t):
            raise SchemaError(f"{path}: column {col.name!r} has type {t}, expected {col.expected}")
    for need in needs:
        name = required_column(need)  # a column, or a NullableColumn's (nulls allowed)
        if name is None:  # an OptionalColumn, or a feature computed from the columns
            continue
        if name not in names:
            why = f" ({NEEDED_WHY[name]})" if name in NEEDED_WHY else ""
            raise SchemaError(f"{path}: missing column {name!r}, which the chosen strategy needs{why}{_columns_hint(name, names)}")
        col = NEEDED_COLUMNS.get(name) or (_LOGPROB_LIST if name.endswith(("logprobs", "logprobs_original")) else None)
        if col is not None and not col.accepts(schema.field(name).type):
            raise SchemaError(f"{path}: column {name!r} has type {schema.field(name).type}, expected {col.expected}")
        t = schema.field(name).type
        if col is None and name not in LIST_COLUMNS and not (
            pat.is_integer(t) or pat.is_floating(t) or pat.is_boolean(t) or pat.is_string(t) or pat.is_large_string(t)
        ):
            raise SchemaError(f"{path}: column {name!r} has type {t}, expected a scalar (number, bool or string)")
    if "tokens" in names and "prompt_length" not in names:
        raise SchemaError(f"{path}: column 'tokens' needs 'prompt_length' to find the response")
    warnings = []
    replaced = [n for n in (*SCORE_COLUMNS, REJECT_REASON) if n in names]
    if replaced:
        warnings.append(f"{path}: input columns {replaced} will be replaced by this run's values")
    return warnings


def task_kind(schema: pa.Schema) -> str:
    """'int' or 'string': how the file stores task ids."""
    return "int" if pat.is_integer(schema.field("task").type) else "string"


def output_schema(input_schema: pa.Schema, extra: list[pa.Field] | tuple = ()) -> pa.Schema:
    """The scored-*.parquet schema for an input schema: inputs unchanged, score columns added,
    then the `extra` columns of the strategy (copy ids, CHORD weights), which replace input
    columns of the same name."""
    base = _without(input_schema, (*SCORE_COLUMNS, REJECT_REASON, *(f.name for f in extra)))
    for f in (*SCORE_FIELDS, *extra):
        base = base.append(f)
    return base


def rejected_schema(input_schema: pa.Schema) -> pa.Schema:
    """The rejected-*.parquet schema: inputs unchanged plus `reject_reason`."""
    base = _without(input_schema, (*SCORE_COLUMNS, REJECT_REASON))
    return base.append(pa.field(REJECT_REASON, pa.string()))


def _without(schema: pa.Schema, names: tuple[str, ...]) -> pa.Schema:
    for n in names:
        i = schema.get_field_index(n)
        if i >= 0:
            schema = schema.remove(i)
    return schema


def unify(paths_and_schemas: list[tuple[str, pa.Schema]]) -> pa.Schema:
    """One schema for all input files: extra columns are kept (null where a file lacks them),
    and a column's types are widened by the one rule of `schemas/widening.py` (int -> float,
    int32 -> int64, bool -> int8, list<int32> -> list<int64>, ...). Raises SchemaError, naming
    the column and the two files, where two files' types cannot be widened to one."""
    kinds = {}
    for path, schema in paths_and_schemas:
        kinds.setdefault(task_kind(schema), path)
    if len(kinds) > 1:
        raise SchemaError(
            f"column 'task' is an integer in {kinds['int']} but a string in {kinds['string']};"
            " use one type for task ids across all input files"
        )
    from rescore.schemas.widening import widen_schemas

    try:
        return widen_schemas(paths_and_schemas)
    except SchemaError as e:
        raise SchemaError(f"input files have incompatible schemas: {e}") from None
