"""GRPO group advantages and rank-bias correction.

score_i = (r_i - mean(G)) / (std + epsilon), std = std(G) (ddof=1) or the batch std.
References: Trinity-RFT `GRPOGroupedAdvantage` and `CorrectBiasAddStrategy`; verl
`compute_grpo_outcome_advantage`; rank-bias correction from arXiv 2506.02355.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from rescore.transforms.strategies.base import (
    GroupedRows,
    ScoreExplanation,
    Scores,
    audit_rows,
    group_reasons,
)
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, register
from rescore.transforms.strategies.segments import (
    group_stats,
    per_row,
    rank_within_groups,
    single_units,
    std_of,
)
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def rank_corrected_rewards(reward: Tensor, mean_logprob: Tensor, offsets: Tensor, rank_penalty: float) -> Tensor:
    """r'_i = r_i * (1 - rank_i / n * rank_penalty), rank 0 = least likely row of the group.

    reward, mean_logprob: (n,) float64, rows sorted by group then (run, step); offsets (G + 1,).
    Ties in mean_logprob rank in (run, step) order.
    """
    rank = rank_within_groups(mean_logprob, offsets).to(reward.dtype)
    sizes = per_row((offsets[1:] - offsets[:-1]).to(reward.dtype), offsets)
    return reward * (1.0 - rank / sizes * rank_penalty)


def grpo_scores(
    reward: Tensor,
    offsets: Tensor,
    *,
    epsilon: float,
    batch_std: Tensor | None = None,
    std_threshold: float | None = None,
) -> Scores:
    """GRPO over many groups at once.

    reward: (n,) float64, sorted by group; offsets: (G + 1,) int64.
    batch_std: (n,) float64 std of each row's batch, replacing the group std as the
    denominator (std_cal_level=batch); the mean is always the group's.
    std_threshold: drop groups of one row and groups whose std(G) <= threshold.

    A group of one row has mean 0 and std 1, so its score is r / (1 + epsilon) (or
    r / (batch std + epsilon) with a batch std), as in Trinity-RFT.

    Zero spread is exact (segments.zero_spread): a group whose rewards are all equal has
    r - mean = 0 and std = 0, and a row whose std (group or batch) is exactly 0 scores exactly
    0, with epsilon = 0 too (never 0 / 0 = NaN or r / 0 = inf).
    """
    single = (offsets[1:] - offsets[:-1]) == 1
    mean, std = group_stats(reward, offsets)
    denominator = batch_std if batch_std is not None else per_row(std, offsets)
    score = (reward - per_row(mean, offsets)) / (denominator + epsilon)
    score = torch.where(denominator == 0, torch.zeros_like(score), score)
    if std_threshold is None:
        keep_group = torch.ones_like(single)
    else:
        keep_group = ~single & (std > std_threshold)
    return Scores(score=score, keep=per_row(keep_group, offsets), group_mean=mean, group_std=std)


class GroupStdOptions(ScoreExplanation):
    """What GRPO and step-wise GRPO share beyond the math: `std_cal_level` (group or batch
    std), `std_threshold` (drops groups; its own metrics.json counter and filter reasons) and
    the batch std in the audit columns. `audit_unit` is what a group of one is made of."""

    std_cal_level: str
    std_threshold: float | None
    audit_unit = "row"

    @property
    def batch_level(self) -> bool:
        return self.std_cal_level == "batch"

    @property
    def dropped_groups_metric(self) -> str | None:
        return "std_threshold_skipped" if self.std_threshold is not None else None

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        """std_threshold's drops; `group_std` is the std it compared (over last steps for
        step_wise_grpo, whose unit is a run)."""
        _, offsets, g, _ = audit_rows(rows)
        if self.std_threshold is None:
            return [f"{self.name}: dropped by the {self.kind} stage"] * len(dropped)
        thr = float(self.std_threshold)
        run = rows.run.detach().cpu().numpy().astype(np.int64)
        single = single_units(run, offsets, reached, per_run=self.audit_unit == "run")
        return group_reasons(
            g, dropped,
            lambda i: f"{self.name}: group of one {self.audit_unit} (std_threshold drops it)" if single[i]
            else f"{self.name}: std {group_std[i]:.6g} <= {thr:g}",
        )

    def audit_batch_std(self, batch_stats: Tensor) -> np.ndarray | None:
        return batch_stats[:, 0].detach().cpu().numpy().astype(np.float64)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        return (float(std_of(torch.from_numpy(values))),)


class _GRPOScoring(GroupStdOptions):
    """GRPO with optional batch std, std threshold and rank-bias correction (see module doc),
    over the parameters of the declaration it is mixed into."""

    epsilon: float
    rank_penalty: float | None

    @property
    def needs(self) -> tuple[str, ...]:
        return ("logprobs",) if self.rank_penalty is not None else ()

    @property
    def host_math(self) -> bool:
        """These options have a numpy implementation (`score_host`, `batch_stats_host`,
        grpo_np.py): no rank penalty."""
        return self.rank_penalty is None

    def score_host(self, reward: np.ndarray, offsets: np.ndarray, batch_std: np.ndarray | None = None):
        """`score` over numpy arrays (reward (n,) float64, offsets (G + 1,) int64, batch_std (n,)
        float64 with std_cal_level=batch): a HostScores."""
        from rescore.transforms.strategies import grpo_np

        return grpo_np.grpo_scores(
            reward, offsets, epsilon=self.epsilon, batch_std=batch_std if self.batch_level else None,
            std_threshold=self.std_threshold,
        )

    def batch_stats_host(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        """`batch_stats` on numpy (segments_np.std_of)."""
        from rescore.transforms.strategies import segments_np

        return (segments_np.std_of(values),)

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        # The batch std is over every reward the strategy sees in the batch, before any group
        # is dropped by std_threshold, and over raw (not rank-corrected) rewards, as in
        # Trinity-RFT.
        return rows.batch, rows.reward, torch.ones_like(rows.reward)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        reward = rows.reward
        if self.rank_penalty is not None:
            reward = rank_corrected_rewards(reward, rows.mean_logprob, rows.offsets, self.rank_penalty)
        return grpo_scores(
            reward,
            rows.offsets,
            epsilon=self.epsilon,
            batch_std=batch_stats[:, 0] if self.batch_level else None,
            std_threshold=self.std_threshold,
        )


@dataclass(frozen=True)
class GRPOParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0, help="added to the std")
    std_cal_level: Literal["group", "batch"] = param(
        "group",
        help="`group`: std(G); `batch`: the std of **all** rewards the stage sees in the batch (1.0 when the batch"
             " has one row); the mean is always the group's",
    )
    std_threshold: float | None = param(
        None, minimum=0.0,
        help="if set, groups of one row and groups with std(G) ≤ threshold are dropped (counted as filtered; "
             "`std_threshold_skipped` in the metrics)",
    )
    rank_penalty: float | None = param(None, help="if set, rank-bias correction as in `correct_bias` before the GRPO step")


@register("grpo", kind=ADVANTAGE, summary="(r - mean(G)) / (std + epsilon), group or batch std, optional threshold and rank penalty")
class GRPO(_GRPOScoring, GRPOParams):
    pass


@dataclass(frozen=True)
class CorrectBiasParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0, help="added to the std of the corrected rewards")
    rank_penalty: float = param(0.25, help="r'_i = r_i * (1 - rank_i / n * rank_penalty), rank by mean logprob ascending")


@register("correct_bias", kind=ADVANTAGE, summary="GRPO on rank-bias-corrected rewards (arXiv 2506.02355); needs logprobs")
class CorrectBias(_GRPOScoring, CorrectBiasParams):
    """GRPO over the group std on rank-bias-corrected rewards: `grpo` without its other options."""

    std_cal_level = "group"
    std_threshold = None
