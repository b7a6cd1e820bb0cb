"""Step-wise GRPO for multi-step runs (Trinity-RFT `step_wise_grpo`, the `multi_step_grpo`
algorithm).

Per task group, each run's outcome is the reward of its last step, the row with the largest
`step` (rows are sorted by (run, step), so that is the run's last row; never "the last row
seen", which a distributed job does not define). GRPO over those outcomes, one per run, gives
score_k, and every step of run k gets score_k. With `enable_step_norm` the token advantages of
run k are divided by its number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rescore.transforms.strategies.base import GroupedRows, Scores
from rescore.transforms.strategies.grpo import GroupStdOptions, grpo_scores
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, register
from rescore.transforms.strategies.segments import per_row, run_offsets
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class RunView:
    """The runs of GroupedRows: one entry per (batch, task, run)."""

    offsets: Tensor
    """(R + 1,) row boundaries of the runs."""
    group_offsets: Tensor
    """(G + 1,) run boundaries of the groups."""
    last_reward: Tensor
    """(R,) reward of each run's last step."""
    batch: Tensor
    """(R,) batch of each run."""


def runs_of(rows: GroupedRows) -> RunView:
    offsets = run_offsets(rows.run, rows.offsets)
    starts = offsets[:-1]
    # Group g's runs are those starting inside rows offsets[g]:offsets[g + 1].
    group_offsets = torch.searchsorted(starts, rows.offsets)
    return RunView(offsets, group_offsets, rows.reward[offsets[1:] - 1], rows.batch[starts])


def step_wise_grpo_scores(
    rows: GroupedRows,
    *,
    epsilon: float,
    enable_step_norm: bool,
    batch_std: Tensor | None = None,
    std_threshold: float | None = None,
) -> Scores:
    """batch_std: (R,) std of each run's batch's last-step rewards, or None for group std."""
    runs = runs_of(rows)
    per_run = grpo_scores(
        runs.last_reward, runs.group_offsets, epsilon=epsilon, batch_std=batch_std, std_threshold=std_threshold
    )
    steps = (runs.offsets[1:] - runs.offsets[:-1]).to(torch.float64)
    score = per_row(per_run.score, runs.offsets)
    keep = per_row(per_run.keep, runs.offsets)
    token_scale = per_row(1.0 / steps, runs.offsets) if enable_step_norm else None
    return Scores(score, keep, per_run.group_mean, per_run.group_std, token_scale)


@dataclass(frozen=True)
class StepWiseGRPOParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0, help="as in GRPO")
    enable_step_norm: bool = param(False, help="`advantages = score_k * action_mask / (steps of run k)`; `score` stays `score_k`")
    std_cal_level: Literal["group", "batch"] = param(
        "group",
        help="`batch`: the std of the last-step rewards of every run of the batch",
    )
    std_threshold: float | None = param(None, minimum=0.0, help="groups with one run, or std ≤ threshold, are dropped whole")


@register("step_wise_grpo", kind=ADVANTAGE, summary="multi-step runs: GRPO over each run's last-step reward, broadcast to all its steps")
class StepWiseGRPO(GroupStdOptions, StepWiseGRPOParams):
    needs: tuple[str, ...] = ()
    audit_unit = "run"

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        # One value per run: its last-step reward.
        runs = runs_of(rows)
        return runs.batch, runs.last_reward, torch.ones_like(runs.last_reward)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        batch_std = None
        if self.batch_level:
            # batch_stats is per row; every row of a run has its run's batch.
            batch_std = batch_stats[run_offsets(rows.run, rows.offsets)[:-1], 0]
        return step_wise_grpo_scores(
            rows,
            epsilon=self.epsilon,
            enable_step_norm=self.enable_step_norm,
            batch_std=batch_std,
            std_threshold=self.std_threshold,
        )
