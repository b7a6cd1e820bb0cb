"""expand_copies (transforms/rows/copies.py) is vectorised: its output must be byte-identical to the
per-batch loop it replaced, which is kept here verbatim as the reference."""

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from rescore.transforms.rows.copies import copy_task_ids
from rescore.transforms.rows.copies import expand_copies


def _old_copy_task_ids(task: pa.Array, copy_index: np.ndarray, stride: int) -> pa.Array:
    if pa.types.is_integer(task.type):
        values = np.asarray(task.to_numpy(zero_copy_only=False), dtype=np.int64)
        return pa.array(values + copy_index.astype(np.int64) * np.int64(stride), pa.int64())
    suffix = pa.array([f"#copy{k}" for k in copy_index.tolist()], pa.string())
    return pc.binary_join_element_wise(task.cast(pa.string()), suffix, "")


def old_expand_copies(table: pa.Table, copy_plans: dict, task_type: pa.DataType):
    """The implementation before issue 13 item 11 (a Python loop over the unit's batches)."""
    n = table.num_rows
    copies = np.zeros(n, dtype=np.int64)
    strides = np.zeros(n, dtype=np.int64)
    batch = np.asarray(table["batch"].to_numpy(), dtype=np.int64) if n else np.zeros(0, np.int64)
    task = pc.cast(table["task"], task_type).combine_chunks() if n else pa.array([], task_type)
    for b in np.unique(batch).tolist():
        if b not in copy_plans:
            continue
        stride, plan = copy_plans[b]
        at = np.flatnonzero(batch == b)
        where = pc.index_in(task.take(pa.array(at)), value_set=plan["task"].combine_chunks())
        found = np.asarray(where.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        idx = np.asarray(where.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
        copies[at[found]] = plan["copies"].to_numpy()[idx[found]]
        strides[at] = stride
    source = np.repeat(np.arange(n), copies)
    index = np.concatenate([np.arange(1, k + 1) for k in copies[copies > 0]]) if copies.any() else np.zeros(0, np.int64)
    rows_out = np.concatenate([np.arange(n), source])
    copy_index = np.concatenate([np.zeros(n, np.int64), index]).astype(np.int32)
    source_task = task.take(pa.array(rows_out))
    out = table.take(pa.array(rows_out)) if len(source) else table
    if len(source):
        new_task = task.take(pa.array(source))
        if pa.types.is_integer(task_type):
            new_task = pa.array(np.asarray(new_task.to_numpy(), dtype=np.int64) + index * strides[source], pa.int64())
        else:
            new_task = _old_copy_task_ids(new_task, index, 0)
        task_col = pa.concat_arrays([task, new_task]).cast(table.schema.field("task").type)
        out = out.set_column(out.schema.get_field_index("task"), table.schema.field("task"), task_col)
    return out, rows_out, [pa.array(copy_index), source_task]


def unit_and_plans(seed: int, *, batches: int, string_tasks: bool, chunks: int = 3):
    """Kept rows of a read unit (shuffled, several chunks) and copy plans for some of its
    batches, including batches without a plan, plan tasks this unit does not hold, and
    groups copied 1-4 times."""
    rng = random.Random(seed)
    rows, plans = [], {}
    for b in range(batches):
        tasks = rng.sample(range(100), rng.randint(1, 6))
        for t in tasks:
            for run in range(rng.randint(1, 4)):
                rows.append({"batch": b * 3 + 1, "task": f"t{t}" if string_tasks else t, "run": run, "x": rng.random()})
        if rng.random() < 0.7:
            chosen = rng.sample(tasks, rng.randint(1, len(tasks))) + [1000 + b]  # 1000+b: not in this unit
            task_type = pa.string() if string_tasks else pa.int64()
            plan = pa.table(
                {
                    "task": pa.array([f"t{t}" if string_tasks else t for t in chosen], task_type),
                    "copies": pa.array([rng.randint(1, 4) for _ in chosen], pa.int64()),
                }
            )
            plans[b * 3 + 1] = (0 if string_tasks else 107, plan)
    rng.shuffle(rows)
    table = pa.Table.from_pylist(rows)
    size = -(-len(rows) // chunks)
    table = pa.concat_tables([table.slice(i * size, size) for i in range(chunks)])
    return table, plans


def _parquet_bytes(table: pa.Table, tmp_path, name: str) -> bytes:
    path = tmp_path / name
    pq.write_table(table, path)
    return path.read_bytes()


@pytest.mark.parametrize("string_tasks", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorised_expand_copies_is_identical_to_the_loop(tmp_path, seed, string_tasks):
    table, plans = unit_and_plans(seed, batches=40, string_tasks=string_tasks)
    task_type = pa.string() if string_tasks else pa.int64()
    new_out, new_rows, new_extra = expand_copies(table, plans, task_type)
    old_out, old_rows, old_extra = old_expand_copies(table, plans, task_type)
    assert new_out.num_rows > table.num_rows, "the data should make copies"
    assert new_out.equals(old_out)
    assert np.array_equal(new_rows, old_rows) and new_rows.dtype == old_rows.dtype
    assert all(a.equals(b) for a, b in zip(new_extra, old_extra))
    assert [a.type for a in new_extra] == [b.type for b in old_extra]
    full_new = new_out.append_column("copy_index", new_extra[0]).append_column("source_task", new_extra[1])
    full_old = old_out.append_column("copy_index", old_extra[0]).append_column("source_task", old_extra[1])
    assert _parquet_bytes(full_new, tmp_path, "new.parquet") == _parquet_bytes(full_old, tmp_path, "old.parquet")


def test_copies_follow_the_plan():
    """Independent of the old code: row i of a planned group appears 1 + copies times, copy k
    with task + k * stride, in row order after all originals."""
    table = pa.table({"batch": [5, 5, 7, 7, 5, 9], "task": [1, 2, 1, 1, 1, 3], "run": [0, 0, 0, 1, 1, 0]})
    plans = {
        5: (2, pa.table({"task": pa.array([1], pa.int64()), "copies": pa.array([2], pa.int64())})),
        7: (1, pa.table({"task": pa.array([1], pa.int64()), "copies": pa.array([1], pa.int64())})),
    }
    out, rows, (copy_index, source_task) = expand_copies(table, plans, pa.int64())
    assert rows.tolist() == [0, 1, 2, 3, 4, 5, 0, 0, 2, 3, 4, 4]
    assert copy_index.to_pylist() == [0] * 6 + [1, 2, 1, 1, 1, 2]
    assert out["task"].to_pylist() == [1, 2, 1, 1, 1, 3, 3, 5, 2, 2, 3, 5]
    assert source_task.to_pylist() == [1, 2, 1, 1, 1, 3, 1, 1, 1, 1, 1, 1]
    assert out["run"].to_pylist() == [0, 0, 0, 1, 1, 0, 0, 0, 0, 1, 1, 1]


def test_string_copy_ids_and_no_plan():
    table = pa.table({"batch": [1, 1, 2], "task": ["a", "b", "a"]})
    plans = {1: (0, pa.table({"task": pa.array(["b"]), "copies": pa.array([3], pa.int64())}))}
    out, rows, (copy_index, _) = expand_copies(table, plans, pa.string())
    assert out["task"].to_pylist() == ["a", "b", "a", "b#copy1", "b#copy2", "b#copy3"]
    assert copy_index.to_pylist() == [0, 0, 0, 1, 2, 3]
    assert copy_task_ids(pa.array(["x", "y"]), np.array([10, 2], np.int32), 0).to_pylist() == ["x#copy10", "y#copy2"]
    same, rows, (copy_index, _) = expand_copies(table, {}, pa.string())
    assert same.equals(table) and rows.tolist() == [0, 1, 2] and copy_index.to_pylist() == [0, 0, 0]
    empty, rows, extra = expand_copies(table.slice(0, 0), plans, pa.string())
    assert empty.num_rows == 0 and len(rows) == 0 and len(extra[0]) == 0


def test_each_call_follows_its_own_plans():
    """Calls with different plan dicts (the next Beam bundle, another run in the same process)
    each get their own answer: nothing is carried over between calls."""
    table = pa.table({"batch": [1, 1], "task": [4, 5]})

    def plans(k):
        return {1: (2, pa.table({"task": pa.array([4], pa.int64()), "copies": pa.array([k], pa.int64())}))}

    for k in (1, 3, 2, 1):
        out, rows, _ = expand_copies(table, plans(k), pa.int64())
        assert rows.tolist() == [0, 1] + [0] * k
    first = plans(2)
    assert expand_copies(table, first, pa.int64())[0].num_rows == 4
    assert expand_copies(table, plans(0), pa.int64())[0].num_rows == 2
    assert expand_copies(table, first, pa.int64())[0].num_rows == 4
