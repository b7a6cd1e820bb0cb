"""What every strategy sees and returns. Pure torch; no Beam here.

A strategy scores many task groups at once. Its input rows are sorted by
(batch, task, run, step), so each group is a contiguous segment described by `offsets`.

Strategies come in three kinds, applied in this order when a run composes them
(see transforms/strategies/plan.py): a `filter` drops whole groups, an `advantage` strategy
scores the rows that are left (and may drop groups itself, e.g. `std_threshold`), a
`duplicate` strategy drops uninformative groups and marks the rest for copying.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import numpy as np
import torch
from torch import Tensor

from rescore.transforms.strategies.segments import segment_sum

FILTER, ADVANTAGE, DUPLICATE = "filter", "advantage", "duplicate"
KINDS = (FILTER, ADVANTAGE, DUPLICATE)


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
    mean_logprob: Tensor | None = None
    """(n,) float64 mean of logprobs over action tokens (-inf without action tokens); only
    present when the strategy asked for logprobs."""
    expert: Tensor | None = None
    """(n,) bool, the `expert` column; only present when the strategy asked for it."""
    response_length: Tensor | None = None
    """(n,) int64 response tokens (action or not); None where the caller did not provide it."""
    last_action: Tensor | None = None
    """(n,) bool: the last response token is an action token (the outcome reward's token)."""
    task_key: Tensor | None = None
    """(n,) int64 fixed hash of the row's task id (seeds per-group randomness)."""
    columns: Mapping[str, Tensor] = field(default_factory=dict)
    """Scalar input columns the strategy needs, by name: (n,) float64 values, or int64 hashes
    for string columns."""

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

    def select(self, keep: Tensor) -> GroupedRows:
        """The rows where `keep` (n,) is set, still sorted; groups left empty disappear."""
        if bool(keep.all()):
            return self
        counts = segment_sum(keep, self.offsets)
        counts = counts[counts > 0]
        offsets = torch.zeros(counts.numel() + 1, dtype=torch.int64, device=keep.device)
        torch.cumsum(counts, 0, out=offsets[1:])

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t[keep]

        return replace(
            self,
            reward=self.reward[keep],
            offsets=offsets,
            batch=self.batch[keep],
            run=self.run[keep],
            step=self.step[keep],
            action_tokens=self.action_tokens[keep],
            mean_logprob=pick(self.mean_logprob),
            expert=pick(self.expert),
            response_length=pick(self.response_length),
            last_action=pick(self.last_action),
            task_key=pick(self.task_key),
            columns={k: v[keep] for k, v in self.columns.items()},
        )


@dataclass(frozen=True)
class Scores:
    """A strategy's answer for GroupedRows.

    `score` is the scalar advantage of each row (None where the strategy computes none, e.g. a
    filter); the token-level advantages are `score * token_scale * action_mask`.
    """

    score: Tensor | None
    """(n,) float64 scalar advantage, or None."""
    keep: Tensor
    """(n,) bool: False where the row is filtered out (dropped, not rejected)."""
    group_mean: Tensor
    """(G,) float64 reward mean of the group as the strategy used it (metrics)."""
    group_std: Tensor
    """(G,) float64 reward std of the group as the strategy used it (metrics)."""
    token_scale: Tensor | None = None
    """(n,) float64 per-row factor applied to every token, or None for 1."""


class Strategy(Protocol):
    """A scoring strategy with its parameters bound."""

    name: str
    params: Mapping[str, Any]
    kind: str
    """FILTER, ADVANTAGE or DUPLICATE."""
    needs: tuple[str, ...]
    """Optional input columns this strategy cannot work without (e.g. ('logprobs',))."""

    batch_level: bool
    """True when scores need statistics over the whole batch (across task groups) first."""

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        """(batch ids (k,), values (k,), weights (k,)) that the per-batch statistics are
        computed from; only called when batch_level is set."""

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        """The statistics of one batch from all its values and weights, sorted by
        (value, weight) so that the result never depends on arrival order. The arrays may be
        empty (a filter stage dropped every group of the batch): return finite placeholders
        then; no row of such a batch is scored."""

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        """Score every row. `batch_stats` is (n, k) float64, the batch_stats of each row's
        batch, when batch_level is set, else None."""
