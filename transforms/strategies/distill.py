"""On-policy distillation (`on_policy_distill`): token-level advantages from a teacher.

    advantages[t] = kl_coef * (teacher_logprobs[t] - logprobs[t]) * action_mask[t]

as in Trinity-RFT's `OnPolicyDistillAdvantage` (after Tinker's on-policy distillation): the
negative per-token reverse KL of the behaviour policy from the teacher. There is no group: the
advantage is per token, computed where the row is written. The scalar `score` is the mean token
advantage over action tokens (0 for a row without any).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor

from rescore.schemas.lists import flat_list, segment_sum
from rescore.transforms.strategies.base import ADVANTAGE, GroupedRows, Scores
from rescore.transforms.strategies.registry import number, register
from rescore.transforms.strategies.segments import group_stats


def token_level_only(rows: GroupedRows) -> Scores:
    """Scores of a strategy whose advantages are per token (teacher log-probs): every row kept,
    scalar score 0 here; `token_values` fills the advantages in when the row is written."""
    keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
    return Scores(torch.zeros_like(rows.reward), keep, *group_stats(rows.reward, rows.offsets))


def distill_token_advantages(
    teacher: np.ndarray, student: np.ndarray, mask: np.ndarray | None, offsets: np.ndarray, kl_coef: float
) -> tuple[np.ndarray, np.ndarray]:
    """(flat token advantages (T,) float64, per-row score (n,) float64) over flat token arrays
    with row offsets (n + 1,)."""
    values = kl_coef * (np.asarray(teacher, np.float64) - np.asarray(student, np.float64))
    weights = np.ones_like(values) if mask is None else np.asarray(mask, np.float64)
    values = values * weights
    tokens = segment_sum(weights, offsets)
    with np.errstate(invalid="ignore", divide="ignore"):
        score = np.where(tokens > 0, segment_sum(values, offsets) / np.maximum(tokens, 1), 0.0)
    return values, score


@dataclass(frozen=True)
class OnPolicyDistill:
    kl_coef: float = 1.0
    name: str = "on_policy_distill"
    params: Mapping[str, Any] = field(default_factory=dict)
    kind = ADVANTAGE
    needs: tuple[str, ...] = ("logprobs", "teacher_logprobs")
    batch_level = False

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        return token_level_only(rows)

    def token_values(self, table: pa.Table, score=None, row_value=None) -> tuple[np.ndarray, np.ndarray]:
        """(flat advantages over the response tokens, scalar score) for the rows of `table`."""
        teacher = flat_list(table["teacher_logprobs"])
        student = flat_list(table["logprobs"])
        mask = None
        if "action_mask" in table.column_names:
            mask = flat_list(table["action_mask"]).values.to_numpy(zero_copy_only=False)
        return distill_token_advantages(
            teacher.values.to_numpy(zero_copy_only=False),
            student.values.to_numpy(zero_copy_only=False),
            mask,
            student.offsets,
            self.kl_coef,
        )


@register(
    "on_policy_distill",
    kind=ADVANTAGE,
    defaults={"kl_coef": 1.0},
    summary="token-level kl_coef * (teacher_logprobs - logprobs); needs logprobs and teacher_logprobs",
)
def make_on_policy_distill(kl_coef) -> OnPolicyDistill:
    params = dict(kl_coef=number("on_policy_distill", "kl_coef", kl_coef))
    return OnPolicyDistill(name="on_policy_distill", params=params, **params)
