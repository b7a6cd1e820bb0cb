"""Selection: reward-variance filtering, POLARIS-style duplication, RAFT and constant weights.

    reward_variance        drop groups with < 2 rows or var(r) <= variance_threshold (ddof=0)
    duplicate_informative  the same filter, then copy whole kept groups until the batch has at
                           least as many rows as before filtering (POLARIS; Trinity-RFT
                           `DuplicateInformativeAddStrategy`)
    raft                   keep the rows with the top reward of their group (and reward >
                           reward_threshold); score = weight (RAFT, arXiv 2304.06767)
    constant               every row scores `weight` (the `sft` algorithm)

duplicate_informative only says which groups are informative; how many copies each gets (the
copy plan) and how they are written is the row layer's (transforms/rows/copies.py).
"""

from __future__ import annotations

import numpy as np
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


