"""Row-level validation: which rows of a table break the contract, and why.

A bad row is never fatal and never silent: it goes to `rejected-*.parquet` with a reason of the
form `category: detail` (the category is what metrics.json counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.needs import column_of
from rescore.schemas.lists import FlatList, flat_list, row_of_value


@dataclass(frozen=True)
class RowCheck:
    ok: np.ndarray
    """(n,) bool: the row may be scored."""
    reasons: np.ndarray
    """(n,) object: None for good rows, else 'category: detail[; category: detail...]'."""
    response_length: np.ndarray
    """(n,) int64: response tokens of the row (0 where the row is bad or has no lists)."""
    lists: dict[str, FlatList]
    """The flat views of the list columns present, for callers that need the values."""


class _Reasons:
    def __init__(self, n: int):
        self.reasons = np.full(n, None, dtype=object)
        self.bad = np.zeros(n, dtype=bool)

    def add(self, bad: np.ndarray, make) -> None:
        """Record a reason for every row where `bad` is set; `make(i)` builds its text."""
        self.bad |= bad
        for i in np.flatnonzero(bad):
            text = make(int(i))
            prev = self.reasons[i]
            self.reasons[i] = text if prev is None else f"{prev}; {text}"


_NOT_SCALAR = ("logprobs", "teacher_logprobs", "expert", "action_mask", "tokens", "prompt_length")


def _np(col) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False)


def _integers_within(values, low: int, high: int) -> bool:
    """Whether `values` are integers without nulls, all within [low, high]: one pass for their
    range, no copy. False sends the caller to its value-by-value check (which also sees what a
    null or a float turns into)."""
    if not pa.types.is_integer(values.type) or values.null_count:
        return False
    if len(values) == 0:
        return True
    bounds = pc.min_max(values)
    return low <= bounds["min"].as_py() and bounds["max"].as_py() <= high


LOGPROB_SUFFIXES = ("logprobs", "logprobs_original")


def _not_utf8(column: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """(n,) bool: the rows of a string column whose bytes are not valid UTF-8; None where every
    value is (one validating pass in Arrow; the values are only decoded one by one where one is
    not)."""
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return None
    try:
        column.validate(full=True)
        return None
    except pa.ArrowInvalid:
        pass
    bad = []
    for value in column.cast(pa.large_binary()).to_pylist():
        try:
            bad.append(value is not None and value.decode("utf-8") is None)
        except UnicodeDecodeError:
            bad.append(True)
    return np.asarray(bad, dtype=bool)


def readable_text(table: pa.Table) -> pa.Table:
    """`table` with every string value that is not valid UTF-8 decoded with U+FFFD in place of
    the bad bytes (the row's reason keeps them), so that any reader can open what is written."""
    for i, field in enumerate(table.schema):
        bad = _not_utf8(table.column(i))
        if bad is None:
            continue
        fixed = [None if v is None else v.decode("utf-8", "replace") for v in table.column(i).cast(pa.large_binary()).to_pylist()]
        table = table.set_column(i, field, pa.array(fixed, pa.large_string()).cast(field.type))
    return table


def logprob_needs(needs: tuple, names) -> list[str]:
    """The log-prob list columns among `needs` that the table has: every log-prob column a
    strategy names ends in 'logprobs' or 'logprobs_original' (`logprobs`, `teacher_logprobs`,
    the behaviour policy's `logprobs_original`, a reference model's `ref_logprobs`; the catalog
    refuses other names)."""
    return [n for n in dict.fromkeys(needs) if isinstance(n, str) and n.endswith(LOGPROB_SUFFIXES) and n in names]


def _check_logprob_values(out: _Reasons, n: int, name: str, fl: FlatList) -> None:
    """Reject the rows of `fl` (a log-prob list column) holding NaN, +-inf or a value > 0. The
    values are read in place (float32 stays float32): one min and one max over them, and the
    value-by-value pass only where one is bad."""
    values = fl.values
    if len(values) == 0:
        return
    if values.null_count:  # (null elements are rejected above)
        values = pc.fill_null(values, 0)
    if not pa.types.is_floating(values.type):
        values = pc.cast(values, pa.float64())
    numbers = np.asarray(_np(values))
    high, low = numbers.max(), numbers.min()  # NaN where any value is NaN
    if high <= 0 and low > -np.inf:
        return
    finite = np.isfinite(numbers)
    row_of = row_of_value(fl.offsets)
    for bad, what in (
        (np.isnan(numbers), "NaN"), (np.isposinf(numbers), "+inf"), (np.isneginf(numbers), "-inf"), (finite & (numbers > 0), None),
    ):
        if not bad.any():
            continue
        first = np.full(n, -1, dtype=np.int64)  # each row's first such value, for its reason
        at = np.flatnonzero(bad)[::-1]
        first[row_of[at]] = at
        rows = first >= 0
        if what is None:
            out.add(rows, lambda i, name=name, first=first: f"bad_logprobs: {name} holds {float(numbers[first[i]])!r} > 0 (a log-probability is <= 0)")
        else:
            out.add(rows, lambda i, name=name, what=what: f"bad_logprobs: {name} contain {what}")


def check_rows(table: pa.Table, *, needs: tuple = ()) -> RowCheck:
    """Validate every row of `table` (whose schema already passed validate_file_schema).

    `needs`: what the strategy uses (rescore/needs.py; a column name, OptionalColumn,
    NullableColumn, or a feature computed from the columns, which is not checked here); the
    columns' values are checked too (log-probs that are not finite or above 0, null or non-0/1
    `expert`, a null or non-finite scalar)."""
    n = table.num_rows
    names = table.column_names
    out = _Reasons(n)

    for name in ("batch", "task", "run", "step", "reward"):
        if name in names:
            nulls = _np(table[name].is_null())
            out.add(nulls, lambda i, name=name: f"null_value: {name} is null")

    # Text the job compares (the task id, a string column a strategy reads) must be UTF-8: a
    # row holding other bytes is rejected with them, never a failed run.
    for name in ("task", *(n for n in needs if isinstance(n, str))):
        if name in names:
            bad = _not_utf8(table[name])
            if bad is not None:
                raw = table[name].cast(pa.large_binary()).to_pylist()
                category = "bad_task" if name == "task" else "bad_value"
                out.add(bad, lambda i, name=name, raw=raw, category=category: f"{category}: {name} is not valid UTF-8 ({raw[i][:60]!r})")

    if "reward" in names:
        reward = _np(pc.cast(table["reward"], pa.float64()).fill_null(0.0))
        out.add(np.isnan(reward), lambda i: "bad_reward: reward is NaN")
        out.add(np.isposinf(reward), lambda i: "bad_reward: reward is +inf")
        out.add(np.isneginf(reward), lambda i: "bad_reward: reward is -inf")

    list_names = ("action_mask", "logprobs", "tokens", *(("teacher_logprobs",) if "teacher_logprobs" in needs else ()))
    lists = {name: flat_list(table[name]) for name in list_names if name in names}
    for name, fl in lists.items():
        out.add(~fl.valid, lambda i, name=name: f"null_value: {name} is null")
    # A null inside a list the job reads (tokens give the length, the mask and used log-probs
    # the values) has no meaning: the row is rejected, never written as scored.
    for name, fl in lists.items():
        if name in ("logprobs", "teacher_logprobs") and name not in needs:
            continue
        if fl.values.null_count:
            holes = np.asarray(fl.values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            rows = np.zeros(n, dtype=bool)
            rows[row_of_value(fl.offsets)[holes]] = True
            out.add(rows, lambda i, name=name: f"null_value: {name} has a null element")

    # Each present list gives the response length; all of them must agree.
    lengths: dict[str, np.ndarray] = {}
    for name in ("action_mask", "logprobs", "teacher_logprobs"):
        if name in lists:
            lengths[name] = np.where(lists[name].valid, lists[name].lengths, -1)
    if "tokens" in lists:
        prompt = table["prompt_length"]
        prompt_valid = _np(prompt.is_valid())
        prompt = np.asarray(_np(pc.cast(prompt, pa.int64()).fill_null(0)), dtype=np.int64)
        out.add(~prompt_valid, lambda i: "null_value: prompt_length is null")
        tok = lists["tokens"]
        bad_prompt = prompt_valid & tok.valid & ((prompt < 0) | (prompt > tok.lengths))
        out.add(
            bad_prompt,
            lambda i: f"bad_prompt_length: prompt_length {prompt[i]} outside 0..{tok.lengths[i]} (tokens)",
        )
        usable = tok.valid & prompt_valid & ~bad_prompt
        lengths["tokens - prompt_length"] = np.where(usable, tok.lengths - prompt, -1)

    response_length = np.zeros(n, dtype=np.int64)
    if lengths:
        names_in_order = list(lengths)
        ref_name = names_in_order[0]
        ref = lengths[ref_name]
        for other in names_in_order[1:]:
            val = lengths[other]
            mismatch = (ref >= 0) & (val >= 0) & (ref != val)
            out.add(
                mismatch,
                lambda i, other=other, val=val: (
                    f"length_mismatch: {ref_name} has {ref[i]} tokens but {other} has {val[i]}"
                ),
            )
        stacked = np.stack([lengths[k] for k in names_in_order])
        response_length = np.maximum(stacked.max(axis=0), 0)

    if "action_mask" in lists:
        fl = lists["action_mask"]
        # One pass over the values for their range; the values are only copied out where one
        # is out of range, to find its row.
        if not pa.types.is_boolean(fl.values.type) and not _integers_within(fl.values, 0, 1):
            values = _np(fl.values)
            bad_values = (values != 0) & (values != 1)
            if bad_values.any():
                bad_rows = np.zeros(n, dtype=bool)
                bad_rows[row_of_value(fl.offsets)[bad_values]] = True
                out.add(bad_rows, lambda i: "bad_action_mask: action_mask values must be 0 or 1")

    for name in logprob_needs(needs, names):
        # Log-probs a stage reads (the policy's, the behaviour policy's, a reference or teacher
        # model's): aligned with the response, every value finite and <= 0. Anything else
        # (NaN, +-inf, a log-probability above 0) is an input error of the row, never a number
        # for the math: each stage that reads them (rollout correction, kl_penalty, token
        # baselines, clipb, distillation) sees only rows that pass here.
        fl = lists.get(name)
        if fl is None:  # not a list checked above (a behaviour or reference column)
            fl = flat_list(table[name])
            out.add(~fl.valid, lambda i, name=name: f"null_value: {name} is null")
            other = np.where(fl.valid, fl.lengths, -1)
            mismatch = (other >= 0) & (response_length != other) & ~out.bad
            out.add(
                mismatch,
                lambda i, name=name, other=other: (
                    f"length_mismatch: the response has {response_length[i]} tokens but {name} has {other[i]}"
                ),
            )
            if fl.values.null_count:
                holes = np.asarray(fl.values.is_null().to_numpy(zero_copy_only=False), dtype=bool)
                rows = np.zeros(n, dtype=bool)
                rows[row_of_value(fl.offsets)[holes]] = True
                out.add(rows, lambda i, name=name: f"null_value: {name} has a null element")
        _check_logprob_values(out, n, name, fl)

    if "expert" in needs and "expert" in names:
        expert = table["expert"]
        out.add(_np(expert.is_null()), lambda i: "null_value: expert is null")
        if not pa.types.is_boolean(expert.type):
            values = np.asarray(_np(expert.fill_null(0)), dtype=np.int64)
            out.add((values != 0) & (values != 1), lambda i: f"bad_expert: expert must be 0 or 1, got {values[i]}")

    if "source_error" in names:  # rows a staging reader (SQL buffer, verl dump) could not decode
        has_error = _np(table["source_error"].is_valid())
        if has_error.any():
            texts = table["source_error"].to_pylist()
            out.reasons[has_error] = [texts[i] for i in np.flatnonzero(has_error)]
            out.bad |= has_error
    for need in needs:
        # Scalar columns a strategy reads (a metric, a baseline reward, a state id): a null or
        # a non-finite number cannot be scored. OptionalColumn / NullableColumn may be null (missing: NaN).
        name = column_of(need)  # None: a feature computed from the columns
        if name is None or name in _NOT_SCALAR or name not in names:
            continue
        column = table[name]
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            continue  # a token column (log-probs: checked above)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            continue  # a null status or state id means "none" (Trinity's info.get(key) is None)
        if name == need:
            out.add(_np(column.is_null()), lambda i, name=name: f"null_value: {name} is null")
        if pa.types.is_floating(column.type):
            values = np.asarray(_np(column.fill_null(0.0)), dtype=np.float64)
            out.add(~np.isfinite(values), lambda i, name=name, values=values: f"bad_value: {name} is {values[i]}")

    ok = ~out.bad
    response_length = np.where(ok, response_length, 0)
    return RowCheck(ok=ok, reasons=out.reasons, response_length=response_length, lists=lists)


def reason_category(reason: str) -> str:
    """'length_mismatch' for 'length_mismatch: logprobs has 5 ...' (first reason of a row)."""
    return reason.split(":", 1)[0]
