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

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from rescore.transforms.strategies.base import ADVANTAGE, DUPLICATE, FILTER, GroupedRows, Scores
from rescore.transforms.strategies.registry import flag, integer, number, register
from rescore.transforms.strategies.segments import (
    group_stats,
    per_row,
    population_var,
    segment_max,
)

def informative_groups(reward: Tensor, offsets: Tensor, variance_threshold: float) -> Tensor:
    """(G,) bool: the group has at least 2 rows and population variance > threshold."""
    sizes = offsets[1:] - offsets[:-1]
    return (sizes >= 2) & (population_var(reward, offsets) > variance_threshold)


@dataclass(frozen=True)
class _Selection:
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    needs: tuple[str, ...] = ()
    batch_level = False

    def _stats(self, rows: GroupedRows):
        return group_stats(rows.reward, rows.offsets)


@dataclass(frozen=True)
class RewardVariance(_Selection):
    variance_threshold: float = 0.0
    kind = FILTER

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = per_row(informative_groups(rows.reward, rows.offsets, self.variance_threshold), rows.offsets)
        return Scores(None, keep, *self._stats(rows))


@dataclass(frozen=True)
class DuplicateInformative(RewardVariance):
    seed: int = 0
    kind = DUPLICATE


@dataclass(frozen=True)
class RAFT(_Selection):
    reward_threshold: float | None = 0.0
    top_only: bool = True
    weight: float = 1.0
    kind = ADVANTAGE

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        if self.top_only:
            keep &= rows.reward == per_row(segment_max(rows.reward, rows.offsets), rows.offsets)
        if self.reward_threshold is not None:
            keep &= rows.reward > self.reward_threshold
        return Scores(torch.full_like(rows.reward, self.weight), keep, *self._stats(rows))


@dataclass(frozen=True)
class Constant(_Selection):
    weight: float = 1.0
    kind = ADVANTAGE

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return Scores(torch.full_like(rows.reward, self.weight), keep, *self._stats(rows))


@register(
    "reward_variance",
    kind=FILTER,
    defaults={"variance_threshold": 0.0},
    summary="drop groups with fewer than 2 rows or reward variance (ddof=0) <= variance_threshold",
)
def make_reward_variance(variance_threshold) -> RewardVariance:
    params = dict(variance_threshold=number("reward_variance", "variance_threshold", variance_threshold))
    return RewardVariance(name="reward_variance", params=params, **params)


@register(
    "duplicate_informative",
    kind=DUPLICATE,
    defaults={"variance_threshold": 0.0, "seed": 0},
    summary="reward_variance, then copy kept groups until the batch has its rows again (POLARIS)",
)
def make_duplicate_informative(variance_threshold, seed) -> DuplicateInformative:
    name = "duplicate_informative"
    params = dict(
        variance_threshold=number(name, "variance_threshold", variance_threshold),
        seed=integer(name, "seed", seed, minimum=0),
    )
    return DuplicateInformative(name=name, params=params, **params)


@register(
    "raft",
    kind=ADVANTAGE,
    defaults={"reward_threshold": 0.0, "top_only": True, "weight": 1.0},
    summary="keep rows with the top reward of their group and reward > reward_threshold; score = weight",
)
def make_raft(reward_threshold, top_only, weight) -> RAFT:
    params = dict(
        reward_threshold=number("raft", "reward_threshold", reward_threshold, optional=True),
        top_only=flag("raft", "top_only", top_only),
        weight=number("raft", "weight", weight),
    )
    return RAFT(name="raft", params=params, **params)


@register("constant", kind=ADVANTAGE, defaults={"weight": 1.0}, summary="every row scores `weight` (SFT pass-through)")
def make_constant(weight) -> Constant:
    params = dict(weight=number("constant", "weight", weight))
    return Constant(name="constant", params=params, **params)
