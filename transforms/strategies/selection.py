"""Selection: reward-variance filtering, POLARIS-style duplication, RAFT and constant weights.

    reward_variance        drop groups with < 2 rows or var(r) <= variance_threshold (ddof=0)
    duplicate_informative  the same filter, then copy whole kept groups until the batch has at
                           least as many rows as before filtering (POLARIS; Trinity-RFT
                           `DuplicateInformativeAddStrategy`)
    raft                   keep the rows with the top reward of their group (and reward >
                           reward_threshold); score = weight (RAFT, arXiv 2304.06767)
    constant               every row scores `weight` (the `sft` algorithm)

The copy plan is a pure function of light per-group metadata (plan_copies): a shuffle keyed
by a fixed 64-bit hash of (seed, batch, the sorted group keys, round), never a global RNG or
arrival order, so every rerun and every runner makes the same copies.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from torch import Tensor

from rescore.transforms.strategies.base import GroupedRows, Scores, audit_rows, group_reasons
from rescore.transforms.strategies.catalog import (
    ConstantParams,
    DuplicateInformativeParams,
    RAFTParams,
    RewardVarianceParams,
)
from rescore.transforms.strategies.segments import (
    group_stats,
    masked_group_stats,
    per_row,
    population_var,
    segment_max,
)

COPY_INDEX = "copy_index"
SOURCE_TASK = "source_task"


def informative_groups(reward: Tensor, offsets: Tensor, variance_threshold: float) -> Tensor:
    """(G,) bool: the group has at least 2 rows and population variance > threshold."""
    sizes = offsets[1:] - offsets[:-1]
    return (sizes >= 2) & (population_var(reward, offsets) > variance_threshold)


class _Selection:
    needs: tuple[str, ...] = ()
    batch_level = False

    def _stats(self, rows: GroupedRows):
        return group_stats(rows.reward, rows.offsets)


class _VarianceFilter(_Selection):
    variance_threshold: float

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        reward, offsets, g, _ = audit_rows(rows)
        count, var, _ = masked_group_stats(reward, offsets, reached)
        thr = float(self.variance_threshold)
        return group_reasons(
            g, dropped,
            lambda i: f"{self.name}: group of {count[i]} row{'' if count[i] == 1 else 's'} < 2 rows" if count[i] < 2
            else f"{self.name}: var {var[i]:.6g} <= {thr:g}",
        )

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = per_row(informative_groups(rows.reward, rows.offsets, self.variance_threshold), rows.offsets)
        return Scores(None, keep, *self._stats(rows))


class RewardVariance(_VarianceFilter, RewardVarianceParams):
    pass


class DuplicateInformative(_VarianceFilter, DuplicateInformativeParams):
    """The variance filter as the duplicate stage; the copies are planned by the row layer
    from the groups it keeps, seeded with `seed`."""


class RAFT(_Selection, RAFTParams):
    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        reward, offsets, g, _ = audit_rows(rows)
        thr = self.reward_threshold
        top = np.full(len(offsets) - 1, -np.inf)
        np.maximum.at(top, g[reached], reward[reached])
        reasons = []
        for i in dropped:
            if thr is not None and reward[i] <= thr:
                reasons.append(f"{self.name}: reward {reward[i]:.6g} <= {float(thr):g}")
            else:
                reasons.append(f"{self.name}: reward {reward[i]:.6g} < the group's top {top[g[i]]:.6g}")
        return reasons

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        if self.top_only:
            keep &= rows.reward == per_row(segment_max(rows.reward, rows.offsets), rows.offsets)
        if self.reward_threshold is not None:
            keep &= rows.reward > self.reward_threshold
        return Scores(torch.full_like(rows.reward, self.weight), keep, *self._stats(rows))


class Constant(_Selection, ConstantParams):
    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return Scores(torch.full_like(rows.reward, self.weight), keep, *self._stats(rows))


# --- the copy plan ----------------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(x) -> np.ndarray:
    """splitmix64 finaliser over uint64 values (wrapping arithmetic, platform independent)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return x


def _combine(values: np.ndarray) -> np.uint64:
    """One hash of a sequence of uint64 values that depends on their order."""
    if len(values) == 0:
        return np.uint64(0)
    with np.errstate(over="ignore"):
        position = mix64(np.arange(len(values), dtype=np.uint64) + _GOLDEN)
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
        seed_hash = mix64(np.uint64(seed & 0xFFFFFFFFFFFFFFFF)) ^ mix64(np.uint64(batch & 0xFFFFFFFFFFFFFFFF) + _GOLDEN)
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
    'task#copyK' for string tasks (plan checks those are new)."""
    if pa.types.is_integer(task.type):
        values = np.asarray(task.to_numpy(zero_copy_only=False), dtype=np.int64)
        return pa.array(values + copy_index.astype(np.int64) * np.int64(stride), pa.int64())
    number = pc.cast(pa.array(np.asarray(copy_index, dtype=np.int64)), pa.string())
    return pc.binary_join_element_wise(task.cast(pa.string()), "#copy", number, "")
