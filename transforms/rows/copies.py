"""Duplication (POLARIS, `duplicate_informative`): the one owner of copies, from plan to rows.

The strategy (strategies/variance.py) only says which groups are informative. Here:

- copy_groups: one small metadata row per scored group (task, rows before and after
  filtering, informative), split by batch for the shuffle by batch;
- plan_batch_copies / plan_copies: a batch's **copy plan**, how many copies of each group. A pure
  function of that metadata: a shuffle keyed by a fixed 64-bit hash of (seed, batch, the sorted
  group keys, round), never a global RNG or arrival order, so every rerun and every runner
  makes the same copies;
- copy_stride / copy_task_ids: the task id of copy k (integer tasks: task + k * stride;
  string tasks: 'task#copyK'), checked never to meet another group's;
- CopyIndex / expand_copies: where a read unit is written, its kept rows followed by their
  copies, with the columns copy_fields adds (COPY_INDEX, SOURCE_TASK).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.transforms.strategies.hashing import GOLDEN, mix64
from rescore.transforms.rows.keys import split_by, task_hash
from rescore.transforms.rows.metrics import COPY_METRICS

COPY_INDEX = "copy_index"
SOURCE_TASK = "source_task"


# --- the copy plan ----------------------------------------------------------------------------


def copy_groups(light: pa.Table, offsets: np.ndarray, kept: np.ndarray, informative: np.ndarray) -> Iterator[tuple[int, pa.Table]]:
    """(batch, group table) per batch of a scored bucket: task, size (rows before filtering),
    kept (rows after) and informative, one row per group.

    light: the bucket's sorted light rows; offsets: (G + 1,) group boundaries; kept, informative: (G,).
    """
    starts = offsets[:-1]
    meta = pa.table(
        {
            "batch": light["batch"].take(pa.array(starts)),
            "task": light["task"].take(pa.array(starts)),
            "size": np.diff(offsets),
            "kept": kept,
            "informative": informative,
        }
    )
    for batch, part in split_by(meta, meta["batch"].to_numpy()):
        yield batch, part.drop_columns(["batch"])


class BatchCopies(NamedTuple):
    """A batch's copy plan: the task-id stride between copies (0 for string tasks), the plan
    (columns task, copies: only groups with copies) and its COPY_METRICS row."""

    stride: int
    plan: pa.Table
    metrics: pa.Table


def plan_batch_copies(batch: int, groups: list[pa.Table], seed: int) -> BatchCopies | None:
    """The copy plan of one batch from its groups' metadata (copy_groups, in any order); None
    where no group is copied."""
    groups = pa.concat_tables(groups).sort_by("task")
    task = groups["task"].combine_chunks()
    sizes = groups["kept"].to_numpy()
    copies = plan_copies(
        task_hash(task),
        sizes,
        groups["informative"].to_numpy(zero_copy_only=False),
        target=int(groups["size"].to_numpy().sum()),
        seed=seed,
        batch=batch,
    )
    chosen = np.flatnonzero(copies)
    if not len(chosen):
        return None
    stride = copy_stride(batch, task, copies)
    plan = pa.table({"task": task.take(pa.array(chosen)), "copies": copies[chosen]})
    metrics = pa.Table.from_arrays(
        [pa.array([batch], pa.int64()), pa.array([int(copies.sum())], pa.int64()), pa.array([int((copies * sizes).sum())], pa.int64())],
        schema=COPY_METRICS,
    )
    return BatchCopies(stride, plan, metrics)


def _combine(values: np.ndarray) -> np.uint64:
    """One hash of a sequence of uint64 values that depends on their order."""
    if len(values) == 0:
        return np.uint64(0)
    with np.errstate(over="ignore"):
        position = mix64(np.arange(len(values), dtype=np.uint64) + GOLDEN)
        return np.bitwise_xor.reduce(mix64(values.astype(np.uint64) ^ position))


def plan_copies(key_hash: np.ndarray, sizes: np.ndarray, informative: np.ndarray, *, target: int, seed: int, batch: int) -> np.ndarray:
    """(G,) number of copies of each group of one batch.

    key_hash: (G,) uint64 fixed hashes of the group keys, in sorted key order.
    sizes: (G,) rows each group writes; informative: (G,) bool, the groups that may be copied.
    target: rows the batch had before filtering.

    Rounds of copies, each over every informative group in a shuffled order, go on until the
    written rows (informative originals + copies) reach `target`; the last round stops at the
    first group that reaches it, so the batch ends below target + the largest group. Whole
    rounds copy every group once, so only the last round's order matters; it is the order of
    mix64(base ^ mix64(round) ^ key hash), base = hash of (seed, batch, all informative keys).
    """
    copies = np.zeros(len(sizes), dtype=np.int64)
    idx = np.flatnonzero(informative)
    have = int(sizes[idx].sum())
    need = int(target) - have
    if have == 0 or need <= 0:
        return copies
    full = (need - 1) // have  # whole rounds; leaves 0 < remainder <= have
    copies[idx] = full
    remainder = need - full * have
    with np.errstate(over="ignore"):
        seed_hash = mix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF)) ^ mix64(np.uint64(batch & 0xFFFFFFFFFFFFFFFF) + GOLDEN)
        base = mix64(seed_hash ^ _combine(key_hash[idx]))
        order_key = mix64(key_hash[idx] ^ base ^ mix64(np.uint64(full + 1)))
    order = idx[np.argsort(order_key, kind="stable")]
    reached = np.cumsum(sizes[order]) >= remainder
    last = int(np.argmax(reached))
    copies[order[: last + 1]] += 1
    return copies


def copy_task_ids(task: pa.Array, copy_index: np.ndarray, stride: int) -> pa.Array:
    """The task id of copy k of a group: task + k * stride for integer tasks (stride = the span
    of the batch's task ids, so copies never meet an original or each other), and
    'task#copyK' for string tasks (copy_stride checks those are new)."""
    if pa.types.is_integer(task.type):
        values = np.asarray(task.to_numpy(zero_copy_only=False), dtype=np.int64)
        return pa.array(values + copy_index.astype(np.int64) * np.int64(stride), pa.int64())
    number = pc.cast(pa.array(np.asarray(copy_index, dtype=np.int64)), pa.string())
    return pc.binary_join_element_wise(task.cast(pa.string()), "#copy", number, "")


def copy_stride(batch: int, task: pa.Array, copies: np.ndarray) -> int:
    """The id offset between copies of a group (integer tasks), after checking that no copy id
    meets another group's; 0 for string tasks."""
    most = int(copies.max())
    if pa.types.is_integer(task.type):
        values = task.to_numpy().astype(np.int64)
        lo, hi = int(values.min()), int(values.max())
        stride = hi - lo + 1
        if hi + most * stride > np.iinfo(np.int64).max:
            raise ValueError(f"batch {batch}: task ids up to {hi} leave no room for {most} copies in int64")
        return stride
    chosen = np.flatnonzero(copies)
    new = copy_task_ids(
        task.take(pa.array(np.repeat(chosen, copies[chosen]))),
        np.concatenate([np.arange(1, k + 1) for k in copies[chosen]]),
        0,
    )
    clash = pc.is_in(new, value_set=task)
    if pc.any(clash).as_py():
        first = new.filter(clash)[0].as_py()
        raise ValueError(f"batch {batch}: the copy task id {first!r} already names a task; rename that task")
    return 0


# --- copies where a read unit is written -------------------------------------------------------


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
