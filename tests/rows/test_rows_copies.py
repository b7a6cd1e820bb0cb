"""Row-layer duplication (rows/copies.py) and the one splitmix64 (strategies/hashing.py)."""

import numpy as np
import pyarrow as pa
import pytest

from rescore.transforms.rows.copies import copy_groups, copy_stride, plan_batch_copies
from rescore.transforms.strategies.hashing import mix64
from rescore.transforms.rows.keys import bucket_of, task_hash

M64 = (1 << 64) - 1


def _splitmix64_finaliser(x: int) -> int:
    """The reference splitmix64 finaliser in Python integers (Vigna's splitmix64.c)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & M64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & M64
    return x ^ (x >> 31)


def test_mix64_is_splitmix64_and_every_hash_uses_it():
    values = [0, 1, 2, 12345, (1 << 63) + 7, M64]
    assert mix64(np.array(values, np.uint64)).tolist() == [_splitmix64_finaliser(v) for v in values]
    assert int(mix64(np.uint64(7))) == _splitmix64_finaliser(7)
    tasks = pa.array([3, -1, 1 << 40], pa.int64())
    assert task_hash(tasks).tolist() == [_splitmix64_finaliser(v & M64) for v in (3, -1, 1 << 40)]
    light = pa.table({"batch": pa.array([5, 5], pa.int64()), "task": tasks.slice(0, 2)})
    expected = [_splitmix64_finaliser(_splitmix64_finaliser(5) ^ _splitmix64_finaliser(t & M64)) % 16 for t in (3, -1)]
    assert bucket_of(light, 16).tolist() == expected


def test_copy_stride_spans_the_batch_tasks_and_refuses_clashes():
    assert copy_stride(0, pa.array([3, 5, 9], pa.int64()), np.array([0, 2, 1])) == 7
    with pytest.raises(ValueError, match=r"batch 4: task ids up to \d+ leave no room for 2 copies in int64"):
        copy_stride(4, pa.array([0, np.iinfo(np.int64).max // 2], pa.int64()), np.array([2, 0]))
    assert copy_stride(0, pa.array(["a", "b"]), np.array([2, 0])) == 0
    with pytest.raises(ValueError, match=r"batch 1: the copy task id 'a#copy1' already names a task"):
        copy_stride(1, pa.array(["a", "a#copy1"]), np.array([1, 0]))


def test_copy_groups_describe_each_group_once_per_batch():
    light = pa.table({"batch": pa.array([0, 0, 0, 2, 2], pa.int64()), "task": pa.array(["x", "x", "y", "x", "x"])})
    parts = dict(copy_groups(light, np.array([0, 2, 3, 5]), np.array([2, 0, 2]), np.array([True, False, True])))
    assert sorted(parts) == [0, 2]
    assert parts[0].to_pylist() == [
        {"task": "x", "size": 2, "kept": 2, "informative": True}, {"task": "y", "size": 1, "kept": 0, "informative": False},
    ]
    assert parts[2].to_pylist() == [{"task": "x", "size": 2, "kept": 2, "informative": True}]


def test_a_batch_that_lost_nothing_gets_no_plan():
    groups = pa.table({"task": pa.array([1, 2], pa.int64()), "size": [2, 3], "kept": [2, 3], "informative": [True, True]})
    assert plan_batch_copies(0, [groups], seed=0) is None
    lost = pa.table({"task": pa.array([1, 2], pa.int64()), "size": [2, 3], "kept": [2, 0], "informative": [True, False]})
    planned = plan_batch_copies(0, [lost], seed=0)  # 5 rows before, 2 kept: one whole round, then one more copy
    assert planned.plan.to_pylist() == [{"task": 1, "copies": 2}] and planned.stride == 2
    assert planned.metrics.to_pylist() == [{"batch": 0, "groups_duplicated": 2, "rows_duplicated": 4}]
