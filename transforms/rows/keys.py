"""The light rows that cross the shuffle (ids, reward and a few per-row features), task hashes
and shuffle buckets.

Token columns never cross the shuffle. Each valid row is reduced to a handful of scalars and a
locator (read unit, row); after scoring, the locator brings the score back to the row where the
row already is (WriteScored).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.needs import NullableColumn, OptionalColumn, column_of
from rescore.schemas.experience import INPUT_BY_NAME
from rescore.schemas.lists import flat_list
from rescore.schemas.validation import RowCheck
from rescore.transforms.rows.unit_rows import UnitRows
from rescore.transforms.strategies.features import WHOLE_BATCH, Feature  # noqa: F401  (WHOLE_BATCH re-exported)
from rescore.transforms.strategies.flat import TokenColumn, flat_segment_sum
from rescore.transforms.strategies.hashing import exact_codes, mix64, string_keys
from rescore.transforms.rows.task_stats import TaskPassRates

ID_KEYS = ("batch", "task", "run", "step")
SORT_KEYS = [(k, "ascending") for k in ID_KEYS]
EXTRA_PREFIX = "x."
"""Light column `x.NAME` carries the scalar input column NAME a strategy needs (float64 for
numbers and bools, the string itself for strings: rows/groups.py gives it exact codes)."""
NOT_EXTRA = ("logprobs", "teacher_logprobs", "expert", "action_mask", "tokens", "prompt_length")


def light_columns(needs: tuple) -> list[str]:
    """The input columns a read for light rows takes: the contract's, each column `needs` names
    (a column name, an OptionalColumn's or NullableColumn's; a Feature is computed from the
    columns its stage names beside it), and `source_error` where a source staged one."""
    wanted = [name for name in map(column_of, needs) if name is not None]
    return list(dict.fromkeys([*INPUT_BY_NAME, *wanted, "source_error"]))


def light_rows(unit: int, table: pa.Table, check: RowCheck, *, task_type: pa.DataType, needs: tuple = (),
               task_history: dict[str, TaskPassRates] | None = None) -> pa.Table:
    """One light row per valid row of `table` (a read unit's rows, in file order).

    Columns: unit, row (locator), batch, task, run, step, reward (float64), action_tokens
    (int64), response_length (int64), last_action (bool); x.NAME for each scalar column NAME
    in `needs` (see EXTRA_PREFIX; a string column as large_string, null kept) and for each
    OptionalColumn / NullableColumn (float64, NaN for a missing value); x.NAME for each light
    column a Feature in `needs` computes (strategies/features.py); mean_logprob (float64, mean
    over action tokens, -inf without any) when `needs` has logprobs; expert (bool) when it has
    expert. task_history: the task-stats tables a Feature may ask for (UnitRows.task_history),
    by path, as the launcher read them before the run (pipelines/task_history.py).
    """
    with_logprobs = "logprobs" in needs
    ok_rows = np.flatnonzero(check.ok)
    all_ok = len(ok_rows) == table.num_rows
    valid = table if all_ok else table.take(pa.array(ok_rows))
    n = valid.num_rows

    def ints(name: str) -> pa.Array:
        if name not in valid.column_names:
            return pa.array(np.zeros(n, dtype=np.int64))
        return pc.cast(valid[name], pa.int64()).combine_chunks()

    names = valid.column_names
    mask = None
    if "action_mask" in names:  # the flat view validation made, where every row is kept
        mask = check.lists.get("action_mask") if all_ok else None
        mask = mask or flat_list(valid["action_mask"])
    # Valid rows' mask values are 0 or 1: summed as integers, as float64 only where a need
    # weighs values with them (one byte per token copied out, not eight).
    mask_raw = mask.values.to_numpy(zero_copy_only=False) if mask else None
    response_length = check.response_length[ok_rows]
    action_tokens = flat_segment_sum(mask_raw, mask.offsets) if mask else response_length

    columns = {
        "unit": pa.array(np.full(n, unit, dtype=np.int32)),
        "row": pa.array(ok_rows.astype(np.int32)),
        "batch": ints("batch"),
        "task": pc.cast(valid["task"], task_type).combine_chunks(),
        "run": ints("run"),
        "step": ints("step"),
        "reward": pc.cast(valid["reward"], pa.float64()).combine_chunks(),
        "action_tokens": pa.array(action_tokens),
    }
    if with_logprobs:
        lp = flat_list(valid["logprobs"])
        lp_values = np.asarray(lp.values.to_numpy(zero_copy_only=False), dtype=np.float64)
        weights = np.asarray(mask_raw, dtype=np.float64) if mask is not None else np.ones_like(lp_values)
        # Rows are valid here, so the mask and logprobs line up value for value.
        sums = flat_segment_sum(lp_values * weights, lp.offsets)
        with np.errstate(invalid="ignore", divide="ignore"):
            mean = np.where(action_tokens > 0, sums / np.maximum(action_tokens, 1), -np.inf)
        columns["mean_logprob"] = pa.array(mean)
    if "expert" in needs:
        columns["expert"] = pc.cast(valid["expert"], pa.bool_()).combine_chunks()
    # Token layout for token-level estimators (REINFORCE++ discounting): the response length
    # and whether its last token is an action token (where the outcome reward sits).
    columns["response_length"] = pa.array(response_length.astype(np.int64))
    if mask is not None:
        ends = mask.offsets[1:]
        nonempty = ends > mask.offsets[:-1]
        last = np.zeros(n, dtype=bool)
        last[nonempty] = mask_raw[ends[nonempty] - 1] != 0
    else:
        last = response_length > 0
    columns["last_action"] = pa.array(last)
    unit_rows = None
    for need in needs:
        if isinstance(need, Feature):  # light columns the stage's own Feature computes
            unit_rows = unit_rows or UnitRows(valid, response_length, mask_raw, columns["task"], task_history or {})
            for key, values in need.light(unit_rows).items():
                columns[EXTRA_PREFIX + key] = _light_array(values)
            continue
        if isinstance(need, (OptionalColumn, NullableColumn)):
            # A number column used where present: NaN where the file has no such column and
            # for a null (the key is missing from that row, as a Trinity info key can be; the
            # strategy decides what a missing value means, e.g. gigpo.py per run).
            if need.name in valid.column_names:
                values = pc.fill_null(pc.cast(valid[need.name], pa.float64()), float("nan")).combine_chunks()
            else:
                values = pa.array(np.full(n, np.nan))
            columns[EXTRA_PREFIX + need.name] = values
            continue
        name = need  # a column name
        if name in NOT_EXTRA:
            continue
        column = valid[name].combine_chunks()
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            continue  # a token column a strategy reads where rows are written (behaviour log-probs)
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type) or pa.types.is_binary(column.type):
            # Strings cross as themselves (a null as null): the bucket gives them codes that
            # are equal exactly where the strings are (rows/groups.py), never a hash's say.
            columns[EXTRA_PREFIX + name] = column.cast(pa.large_string())
        else:
            columns[EXTRA_PREFIX + name] = pc.cast(column, pa.float64())
    return pa.table(columns)


def _light_array(values) -> pa.Array:
    """A Feature's light column: list<float64> (large) for a TokenColumn, else float64."""
    if isinstance(values, TokenColumn):
        offsets = pa.array(np.asarray(values.offsets, dtype=np.int64))
        return pa.LargeListArray.from_arrays(offsets, pa.array(np.asarray(values.values, dtype=np.float64)))
    return pa.array(np.asarray(values, dtype=np.float64))


def task_hash(task: pa.Array) -> np.ndarray:
    """(n,) uint64 hash of task ids, the same in every process (unlike Python's hash()): it
    chooses a shuffle bucket or seeds a draw, never decides that two tasks are one (groups are
    cut where the task value changes; a task's history is matched by value)."""
    if pa.types.is_integer(task.type):
        return mix64(np.asarray(task.to_numpy(zero_copy_only=False)).view(np.uint64))
    encoded = pc.dictionary_encode(task).combine_chunks() if isinstance(task, pa.ChunkedArray) else pc.dictionary_encode(task)
    per_value = string_keys(encoded.dictionary.to_pylist())
    return per_value[np.asarray(encoded.indices.to_numpy(zero_copy_only=False), dtype=np.int64)]


def string_codes(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(n,) int64 codes of a string column (hashing.exact_codes: equal exactly where the
    strings are equal); 0 for a null ("none")."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    encoded = pc.dictionary_encode(column)
    codes = np.append(exact_codes(encoded.dictionary.to_pylist()), 0)  # index -1: null
    index = np.asarray(encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return codes[index]


def bucket_of(light: pa.Table, buckets: int, *, whole_batches: bool = False) -> np.ndarray:
    """(n,) int64 shuffle bucket of each row: a hash of (batch, task) modulo `buckets`, or of
    the batch alone with `whole_batches` (a strategy that needs WHOLE_BATCH).

    Every row of a task group lands in the same bucket, so a bucket holds whole groups.
    """
    batch = np.asarray(light["batch"].to_numpy(), dtype=np.int64).view(np.uint64)
    if whole_batches:
        return (mix64(mix64(batch)) % np.uint64(buckets)).astype(np.int64)
    h = mix64(mix64(batch) ^ task_hash(light["task"].combine_chunks()))
    return (h % np.uint64(buckets)).astype(np.int64)


def split_by(table: pa.Table, keys: np.ndarray):
    """Yield (key, rows of table with that key) in key order; each part is a fresh copy."""
    if table.num_rows == 0:
        return
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    bounds = np.flatnonzero(np.diff(sorted_keys)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(keys)]])
    for s, e in zip(starts, ends):
        yield int(sorted_keys[s]), table.take(pa.array(order[s:e]))
