"""Several reward columns into one advantage: TRL's `multi_objective_aggregation=
"normalize_then_sum"` (GRPOTrainer, trl 1.16.0), beside verl's `gdpo` (estimators.py).

    normalize_then_sum   for each reward column k and group G, over the rows whose value is not
                         null: z_k = (x_k - mean_k(G)) / (std_k(G) + epsilon), std ddof 1;
                         s = sum_k w_k z_k, a null (abstaining) value contributing 0, and a
                         value alone in its group contributing 0 (TRL: NaN std, or one
                         generation); a row whose every column is null is unscorable;
                         score = (s - mean(batch)) / (std(batch) + epsilon) over the batch's
                         scorable rows (std ddof 1); 0 for an unscorable row and where the batch
                         has fewer than two scorable rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, Scores
from rescore.transforms.strategies.features import NullableColumn
from rescore.transforms.strategies.registry import ADVANTAGE, Column, ConfigError, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats, per_row, segment_sum
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def abstaining_zscores(values: Tensor, offsets: Tensor, epsilon: float) -> Tensor:
    """(n,) z-scores of one reward column within each group over its non-NaN values; 0 where
    the value is NaN or alone (non-NaN) in its group."""
    present = ~torch.isnan(values)
    x = torch.where(present, values, torch.zeros_like(values))
    count = segment_sum(present.to(torch.float64), offsets)
    mean = segment_sum(x, offsets) / torch.clamp(count, min=1)
    # Exactly that value where every present value of the group is equal.
    lo = torch.where(present, values, torch.full_like(values, float("inf")))
    hi = torch.where(present, values, torch.full_like(values, float("-inf")))
    gmin = torch.segment_reduce(lo, "min", offsets=offsets, unsafe=True) if values.numel() else mean
    gmax = torch.segment_reduce(hi, "max", offsets=offsets, unsafe=True) if values.numel() else mean
    equal = (count > 0) & (gmin == gmax)
    mean = torch.where(equal, gmin, mean)
    dev = torch.where(present, values - per_row(mean, offsets), torch.zeros_like(values))
    sq = segment_sum(dev * dev, offsets)
    sq = torch.where(equal, torch.zeros_like(sq), sq)
    std = torch.sqrt(sq / torch.clamp(count - 1, min=1))
    z = dev / (per_row(std, offsets) + epsilon)
    usable = present & per_row(count > 1, offsets)
    return torch.where(usable, z, torch.zeros_like(z))


@dataclass(frozen=True)
class NormalizeThenSumParams(StrategyParams):
    reward_keys: tuple[Column, ...] = param((), help="the reward columns (a null abstains); none: the `reward` column alone")
    reward_weights: tuple[float, ...] | None = param(None, help="w_k of the sum, one per column (null: all 1)")
    epsilon: float = param(1e-4, minimum=0.0, help="added to each column's group std and to the batch std")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        keys, weights = values["reward_keys"], values["reward_weights"]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"{strategy}: 'reward_keys' names a column twice")
        if weights is not None and len(weights) != max(len(keys), 1):
            raise ConfigError(f"{strategy}: 'reward_weights' has {len(weights)} weights for {max(len(keys), 1)} reward columns")


@register("normalize_then_sum", kind=ADVANTAGE, summary="per reward column: (x - mean(G)) / (std(G) + epsilon), nulls abstaining; weighted sum; whitened over the batch (TRL)")
class NormalizeThenSum(NormalizeThenSumParams):
    batch_level = True

    @property
    def needs(self) -> tuple[str, ...]:
        return tuple(NullableColumn(k) for k in self.reward_keys)

    @property
    def keys(self) -> tuple[str, ...]:
        return tuple(self.reward_keys) or ("reward",)

    @property
    def weights(self) -> tuple[float, ...]:
        return self.reward_weights if self.reward_weights is not None else (1.0,) * len(self.keys)

    def summed(self, rows: GroupedRows) -> tuple[Tensor, Tensor]:
        """((n,) the weighted sum of z-scores, (n,) bool scorable: some column has a value)."""
        total = torch.zeros_like(rows.reward)
        scorable = torch.zeros(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        for key, w in zip(self.keys, self.weights):
            values = rows.reward if key == "reward" else rows.columns[key].to(torch.float64)
            total = total + w * abstaining_zscores(values, rows.offsets, self.epsilon)
            scorable |= ~torch.isnan(values)
        return total, scorable

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        total, scorable = self.summed(rows)
        return rows.batch, torch.where(scorable, total, torch.zeros_like(total)), scorable.to(torch.float64)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        """(mean, std ddof 1, scorable rows) over the scorable rows (weight 1)."""
        x = values[weights > 0]
        if len(x) < 2:
            return (0.0, 1.0, float(len(x)))
        if bool((x == x[0]).all()):
            return (float(x[0]), 0.0, float(len(x)))
        mean = float(x.sum() / len(x))
        return (mean, float(np.sqrt(((x - mean) ** 2).sum() / (len(x) - 1))), float(len(x)))

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        total, scorable = self.summed(rows)
        mean, std, count = batch_stats[:, 0], batch_stats[:, 1], batch_stats[:, 2]
        score = (total - mean) / (std + self.epsilon)
        score = torch.where(scorable & (count >= 2), score, torch.zeros_like(score))
        g_mean, g_std = group_stats(rows.reward, rows.offsets)
        return Scores(score, torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device), g_mean, g_std)
