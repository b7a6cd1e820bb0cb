"""On-policy distillation (`on_policy_distill`): token-level advantages from a teacher.

    advantages[t] = kl_coef * (teacher_logprobs[t] - logprobs[t]) * action_mask[t]

as in Trinity-RFT's `OnPolicyDistillAdvantage` (after Tinker's on-policy distillation): the
negative per-token reverse KL of the behaviour policy from the teacher. There is no group: the
advantage is per token, computed where the row is written. The scalar `score` is the mean token
advantage over action tokens (0 for a row without any).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, Scores, WrittenRows
from rescore.transforms.strategies.flat import flat_segment_sum
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def token_level_only(rows: GroupedRows) -> Scores:
    """Scores of a strategy whose advantages are per token (teacher log-probs): every row kept,
    scalar score 0 here; `token_values` fills the advantages in when the row is written."""
    keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
    return Scores(torch.zeros_like(rows.reward), keep, *group_stats(rows.reward, rows.offsets))


def masked_token_mean(
    values: np.ndarray, mask: np.ndarray | None, offsets: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(values * action_mask (T,) float64, per-row mean over action tokens (n,) float64, 0 for a
    row without any) of flat per-token values (T,) with row offsets (n + 1,)."""
    weights = np.ones_like(values) if mask is None else np.asarray(mask, np.float64)
    values = values * weights
    tokens = flat_segment_sum(weights, offsets)
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.where(tokens > 0, flat_segment_sum(values, offsets) / np.maximum(tokens, 1), 0.0)
    return values, score


def distill_token_advantages(
    teacher: np.ndarray, student: np.ndarray, mask: np.ndarray | None, offsets: np.ndarray, kl_coef: float
) -> tuple[np.ndarray, np.ndarray]:
    """(flat token advantages (T,) float64, per-row score (n,) float64) over flat token arrays
    with row offsets (n + 1,)."""
    values = kl_coef * (np.asarray(teacher, np.float64) - np.asarray(student, np.float64))
    return masked_token_mean(values, mask, offsets)


class TeacherTokens:
    """A strategy whose advantage is per token, from the row's log-probs and a teacher's
    (`on_policy_distill`, `jsd`): no group, every row kept; where the row is written, the
    subclass's `teacher_values(student, teacher)` (flat (T,) float64) times the action mask
    are the advantages and their mean over action tokens the score."""

    needs: tuple[str, ...] = ("logprobs", "teacher_logprobs")
    batch_level = False

    def teacher_values(self, student: np.ndarray, teacher: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        return token_level_only(rows)

    def token_values(self, rows: WrittenRows, score: np.ndarray, row_value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat advantages over the response tokens, scalar score) for the written rows."""
        teacher = rows.tokens("teacher_logprobs")
        student = rows.tokens("logprobs")
        mask = rows.tokens("action_mask").values if "action_mask" in rows.names else None
        return masked_token_mean(self.teacher_values(student.values, teacher.values), mask, student.offsets)


@dataclass(frozen=True)
class OnPolicyDistillParams(StrategyParams):
    kl_coef: float = param(1.0, help="advantages[t] = kl_coef * (teacher_logprobs[t] - logprobs[t]) * action_mask[t]")


@register("on_policy_distill", kind=ADVANTAGE, summary="token-level kl_coef * (teacher_logprobs - logprobs); needs logprobs and teacher_logprobs")
class OnPolicyDistill(TeacherTokens, OnPolicyDistillParams):
    def teacher_values(self, student: np.ndarray, teacher: np.ndarray) -> np.ndarray:
        return self.kl_coef * (np.asarray(teacher, np.float64) - np.asarray(student, np.float64))
