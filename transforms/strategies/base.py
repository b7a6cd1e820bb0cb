"""What every strategy sees and returns. Pure torch; no Beam here.

A strategy scores many task groups at once. Its input rows are sorted by
(batch, task, run, step), so each group is a contiguous segment described by `offsets`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Protocol

from torch import Tensor


@dataclass(frozen=True)
class GroupedRows:
    """The light columns of n rows in G task groups, sorted by (batch, task, run, step).

    Shapes: every per-row tensor is (n,); `offsets` is (G + 1,) int64 with group g in rows
    offsets[g]:offsets[g + 1]. Rewards are float64 so that group statistics do not depend on
    summation order at float32 precision.
    """

    reward: Tensor
    """(n,) float64 scalar reward."""
    offsets: Tensor
    """(G + 1,) int64 group boundaries."""
    batch: Tensor
    """(n,) int64 batch id of the row."""
    run: Tensor
    """(n,) int64 run id."""
    step: Tensor
    """(n,) int64 step id (0 for single-step data)."""
    action_tokens: Tensor
    """(n,) int64 number of action tokens (sum of action_mask)."""
    mean_logprob: Optional[Tensor] = None
    """(n,) float64 mean of logprobs over action tokens (-inf without action tokens); only
    present when the strategy asked for logprobs."""

    @property
    def num_rows(self) -> int:
        return int(self.reward.shape[0])

    @property
    def num_groups(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def sizes(self) -> Tensor:
        """(G,) int64 rows per group."""
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def group_batch(self) -> Tensor:
        """(G,) int64 batch id of each group."""
        return self.batch[self.offsets[:-1]]


@dataclass(frozen=True)
class Scores:
    """A strategy's answer for GroupedRows.

    `score` is the scalar advantage of each row; the token-level advantages are
    `score * token_scale * action_mask`.
    """

    score: Tensor
    """(n,) float64 scalar advantage."""
    keep: Tensor
    """(n,) bool: False where the row is filtered out (dropped, not rejected)."""
    group_mean: Tensor
    """(G,) float64 reward mean of the group as the strategy used it (metrics)."""
    group_std: Tensor
    """(G,) float64 reward std of the group as the strategy used it (metrics)."""
    token_scale: Optional[Tensor] = None
    """(n,) float64 per-row factor applied to every token, or None for 1."""


class Strategy(Protocol):
    """A scoring strategy with its parameters bound."""

    name: str
    params: Mapping[str, Any]
    needs: tuple[str, ...]
    """Optional input columns this strategy cannot work without (e.g. ('logprobs',))."""

    batch_level: bool
    """True when scores need a per-batch std computed over the whole batch first."""

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor]:
        """(batch ids (k,), values (k,)) whose per-batch std the strategy needs; only called
        when batch_level is set."""

    def score(self, rows: GroupedRows, batch_std: Optional[Tensor]) -> Scores:
        """Score every row. `batch_std` is (n,) float64, the std of each row's batch's
        batch_values, when batch_level is set, else None."""
