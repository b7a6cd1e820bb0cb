"""The reward-variance filter and POLARIS duplication.

    reward_variance        drop groups with < 2 rows or var(r) <= variance_threshold (ddof=0)
    duplicate_informative  the same filter, then copy whole kept groups until the batch has at
                           least as many rows as before filtering (POLARIS; Trinity-RFT
                           `DuplicateInformativeAddStrategy`)

duplicate_informative only says which groups are informative; how many copies each gets (the
copy plan) and how they are written is the row layer's (transforms/rows/copies.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, Scores, audit_rows, group_reasons
from rescore.transforms.strategies.registry import (
    DUPLICATE,
    FILTER,
    WHOLE_BATCH,
    StrategyParams,
    param,
    register,
)
from rescore.transforms.strategies.segments import group_stats, masked_group_stats, per_row, population_var
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def informative_groups(reward: Tensor, offsets: Tensor, variance_threshold: float) -> Tensor:
    """(G,) bool: the group has at least 2 rows and population variance > threshold."""
    sizes = offsets[1:] - offsets[:-1]
    return (sizes >= 2) & (population_var(reward, offsets) > variance_threshold)


class _Groups:
    needs: tuple[str, ...] = ()
    batch_level = False

    def _stats(self, rows: GroupedRows):
        return group_stats(rows.reward, rows.offsets)


class _VarianceFilter(_Groups):
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


@dataclass(frozen=True)
class RewardVarianceParams(StrategyParams):
    variance_threshold: float = param(0.0, help="drop groups whose reward variance (ddof 0) ≤ variance_threshold")


@register("reward_variance", kind=FILTER, summary="drop groups with fewer than 2 rows or reward variance (ddof=0) <= variance_threshold")
class RewardVariance(_VarianceFilter, RewardVarianceParams):
    pass


@dataclass(frozen=True)
class DuplicateInformativeParams(StrategyParams):
    variance_threshold: float = param(
        0.0,
        help="the filter before copying: drop groups whose reward variance (ddof 0) ≤ variance_threshold",
    )
    seed: int = param(0, minimum=0, help="seeds the shuffle that picks the last round's copies")
    min_replace_ratio: float | None = param(
        None, between=(0.0, 1.0), hidden_at_default=True,
        help="rebalance a batch only where its informative groups are more than this share of its groups (POLARIS "
             "/ SkyRL replace sampling); null: always",
    )


@register("duplicate_informative", kind=DUPLICATE, summary="reward_variance, then copy kept groups until the batch has its rows again (POLARIS)")
class DuplicateInformative(_VarianceFilter, DuplicateInformativeParams):
    """The variance filter as the duplicate stage; the copies are planned by the row layer
    from the groups it keeps, seeded with `seed`. With `min_replace_ratio`, a batch with too few
    informative groups is kept whole and not copied (`copyable`); its rows then all go to one
    shuffle bucket, so the stage sees the batch whole."""

    @property
    def needs(self) -> tuple[str, ...]:
        return () if self.min_replace_ratio is None else (WHOLE_BATCH,)

    def _kept_whole(self, rows: GroupedRows) -> Tensor:
        """(G,) bool: the group's batch has informative groups <= min_replace_ratio * groups."""
        informative = informative_groups(rows.reward, rows.offsets, self.variance_threshold)
        if self.min_replace_ratio is None:
            return torch.zeros_like(informative)
        _, batch_of = torch.unique(rows.group_batch, return_inverse=True)
        groups = torch.bincount(batch_of)
        good = torch.bincount(batch_of, weights=informative.to(torch.float64)).to(torch.int64)
        # POLARIS: replace only when len(good) > len(all) * min_replace_ratio
        return ~(good.to(torch.float64) > groups.to(torch.float64) * self.min_replace_ratio)[batch_of]

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = per_row(informative_groups(rows.reward, rows.offsets, self.variance_threshold) | self._kept_whole(rows), rows.offsets)
        return Scores(None, keep, *self._stats(rows))

    def copyable(self, rows: GroupedRows) -> Tensor:
        """(G,) bool: the groups the copy plan may copy (not those of a batch kept whole)."""
        return ~self._kept_whole(rows)
