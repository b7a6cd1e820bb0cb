"""`jsd`: token advantages from the Jensen-Shannon divergence to a teacher (Trinity-RFT 0.6.0
`JSDAdvantage`, trinity/algorithm/advantage_fn/jsd_advantage.py).

With s = logprobs / temperature, t = teacher_logprobs / temperature and beta = lambda_coef:

    beta = 0:  jsd = s - t                     (KL(student || teacher) estimate)
    beta = 1:  jsd = t - s
    else:      m = logsumexp(s + log(1 - beta), t + log(beta))
               jsd = beta (t - m) + (1 - beta) (s - m)
    advantages[t] = -kl_coef * jsd * action_mask

Trinity computes this in the trainer from the actor's recomputed log-probs (`old_log_probs`);
offline, `logprobs` are the logged behaviour log-probs, the same values for an on-policy run.
`score` is the mean token advantage over action tokens (0 without any).
"""

from __future__ import annotations

import math
import numpy as np
from torch import Tensor

from rescore.transforms.strategies.base import GroupedRows, Scores, WrittenRows
from rescore.transforms.strategies.catalog import JSDParams
from rescore.transforms.strategies.distill import token_level_only
from rescore.transforms.strategies.flat import flat_segment_sum


def jsd_per_token(student: np.ndarray, teacher: np.ndarray, lambda_coef: float, temperature: float) -> np.ndarray:
    s = np.asarray(student, np.float64) / temperature
    t = np.asarray(teacher, np.float64) / temperature
    if lambda_coef == 0:
        return s - t
    if lambda_coef == 1:
        return t - s
    m = np.logaddexp(s + math.log1p(-lambda_coef), t + math.log(lambda_coef))
    return lambda_coef * (t - m) + (1 - lambda_coef) * (s - m)


class JSD(JSDParams):
    needs: tuple[str, ...] = ("logprobs", "teacher_logprobs")
    batch_level = False

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        return token_level_only(rows)

    def token_values(self, rows: WrittenRows, score: np.ndarray, row_value: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat advantages over the response tokens, scalar score) for the written rows."""
        teacher = rows.tokens("teacher_logprobs")
        student = rows.tokens("logprobs")
        if "action_mask" in rows.names:
            mask = np.asarray(rows.tokens("action_mask").values, np.float64)
        else:
            mask = np.ones(len(student.values), np.float64)
        jsd = jsd_per_token(student.values, teacher.values, self.lambda_coef, self.temperature)
        values = -self.kl_coef * jsd * mask
        tokens = flat_segment_sum(mask, student.offsets)
        with np.errstate(invalid="ignore", divide="ignore"):
            score = np.where(tokens > 0, flat_segment_sum(values, student.offsets) / np.maximum(tokens, 1), 0.0)
        return values, score
