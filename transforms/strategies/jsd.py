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
from dataclasses import dataclass

import numpy as np

from rescore.transforms.strategies.distill import TeacherTokens
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, register


def jsd_per_token(student: np.ndarray, teacher: np.ndarray, lambda_coef: float, temperature: float) -> np.ndarray:
    s = np.asarray(student, np.float64) / temperature
    t = np.asarray(teacher, np.float64) / temperature
    if lambda_coef == 0:
        return s - t
    if lambda_coef == 1:
        return t - s
    m = np.logaddexp(s + math.log1p(-lambda_coef), t + math.log(lambda_coef))
    return lambda_coef * (t - m) + (1 - lambda_coef) * (s - m)


@dataclass(frozen=True)
class JSDParams(StrategyParams):
    lambda_coef: float = param(
        0.5, minimum=0.0, between=(0.0, 1.0),
        help="beta of the JSD mixture, in [0, 1] (0: s - t, 1: t - s)",
    )
    kl_coef: float = param(1.0, help="advantages[t] = -kl_coef * jsd * action_mask")
    temperature: float = param(1.0, positive=True, help="divides logprobs and teacher_logprobs")
    chunk_size: int | None = param(None, minimum=1, help="memory only in Trinity; accepted and ignored")


@register("jsd", kind=ADVANTAGE, summary="token-level -kl_coef * JSD(teacher, logprobs) (Trinity `jsd`); needs logprobs and teacher_logprobs")
class JSD(TeacherTokens, JSDParams):
    def teacher_values(self, student: np.ndarray, teacher: np.ndarray) -> np.ndarray:
        return -self.kl_coef * jsd_per_token(student, teacher, self.lambda_coef, self.temperature)
