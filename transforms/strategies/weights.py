"""Fixed-weight advantages: RAFT and constant.

    raft       keep the rows with the top reward of their group (and reward > reward_threshold);
               score = weight (RAFT, arXiv 2304.06767)
    constant   every row scores `weight` (the `sft` algorithm)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, Scores, audit_rows
from rescore.transforms.strategies.function_estimator import estimator
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats, per_row, segment_max
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


class _FixedWeight:
    needs: tuple[str, ...] = ()
    batch_level = False

    def _stats(self, rows: GroupedRows):
        return group_stats(rows.reward, rows.offsets)


@dataclass(frozen=True)
class RAFTParams(StrategyParams):
    reward_threshold: float | None = param(0.0, help="keep rows whose reward > reward_threshold (null: no bound)")
    top_only: bool = param(True, help="keep only rows with the group's top reward (ties all kept)")
    weight: float = param(1.0, help="the score of every kept row")


@register("raft", kind=ADVANTAGE, summary="keep rows with the top reward of their group and reward > reward_threshold; score = weight")
class RAFT(_FixedWeight, RAFTParams):
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


def _no_baseline(reward: Tensor) -> np.ndarray:
    """constant subtracts nothing from a reward it ignores: no audit baseline (NaN)."""
    return np.full(reward.shape[0], np.nan)


@estimator("constant", summary="every row scores `weight` (SFT pass-through)", baseline=_no_baseline)
def constant_scores(reward: Tensor, *, weight: float = param(1.0, help="the score of every row")) -> Tensor:
    """(n,) `weight` for every row (the `sft` algorithm)."""
    return torch.full_like(reward, weight)
