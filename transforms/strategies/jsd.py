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
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
from torch import Tensor

from rescore.schemas.lists import flat_list, segment_sum
from rescore.transforms.strategies.base import ADVANTAGE, GroupedRows, Scores
from rescore.transforms.strategies.registry import ConfigError, integer, number, register
from rescore.transforms.strategies.distill import token_level_only


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
class JSD:
    lambda_coef: float = 0.5
    kl_coef: float = 1.0
    temperature: float = 1.0
    name: str = "jsd"
    params: Mapping[str, Any] = field(default_factory=dict)
    kind = ADVANTAGE
    needs: tuple[str, ...] = ("logprobs", "teacher_logprobs")
    batch_level = False

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        return token_level_only(rows)

    def token_values(self, table: pa.Table, score=None, row_value=None) -> tuple[np.ndarray, np.ndarray]:
        teacher = flat_list(table["teacher_logprobs"])
        student = flat_list(table["logprobs"])
        if "action_mask" in table.column_names:
            mask = np.asarray(flat_list(table["action_mask"]).values.to_numpy(zero_copy_only=False), np.float64)
        else:
            mask = np.ones(len(student.values), np.float64)
        jsd = jsd_per_token(
            student.values.to_numpy(zero_copy_only=False),
            teacher.values.to_numpy(zero_copy_only=False),
            self.lambda_coef,
            self.temperature,
        )
        values = -self.kl_coef * jsd * mask
        tokens = segment_sum(mask, student.offsets)
        with np.errstate(invalid="ignore", divide="ignore"):
            score = np.where(tokens > 0, segment_sum(values, student.offsets) / np.maximum(tokens, 1), 0.0)
        return values, score


@register(
    "jsd",
    kind=ADVANTAGE,
    defaults={"lambda_coef": 0.5, "kl_coef": 1.0, "temperature": 1.0, "chunk_size": None},
    summary="token-level -kl_coef * JSD(teacher, logprobs) (Trinity `jsd`); needs logprobs and teacher_logprobs",
)
def make_jsd(lambda_coef, kl_coef, temperature, chunk_size) -> JSD:
    name = "jsd"
    params = dict(
        lambda_coef=number(name, "lambda_coef", lambda_coef, minimum=0.0),
        kl_coef=number(name, "kl_coef", kl_coef),
        temperature=number(name, "temperature", temperature),
        # Trinity's chunk_size only bounds GPU memory; the result does not depend on it.
        chunk_size=None if chunk_size is None else integer(name, "chunk_size", chunk_size, minimum=1),
    )
    if params["lambda_coef"] > 1:
        raise ConfigError(f"{name}: parameter 'lambda_coef' must be between 0 and 1, got {lambda_coef!r}")
    if params["temperature"] <= 0:
        raise ConfigError(f"{name}: parameter 'temperature' must be > 0, got {temperature!r}")
    return JSD(
        lambda_coef=params["lambda_coef"], kl_coef=params["kl_coef"], temperature=params["temperature"], name=name, params=params
    )
