"""CHORD mixing weights (`mix_chord`): the offline part of the CHORD loss (arXiv 2508.11408,
Trinity-RFT `MIXCHORDPolicyLossFn`).

The trainer's loss is (1 - mu) * GRPO loss on the model's own rows + mu * SFT loss on expert
rows, mu following `mu_schedule` over training steps. Rescore writes what can be computed
offline, per row: `mu` at the row's batch (the explore step), `loss_weight` = mu for expert
rows and 1 - mu for the others, GRPO advantages for the non-expert rows (expert rows score 0:
the SFT term does not use advantages), and with `logprobs` and `enable_phi_function` the
token weights phi(p) = p (1 - p), p = exp(logprob) of the logged (behaviour) policy. CHORD
computes phi from the live policy during training; the logged values are the offline
stand-in and are documented as such.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from torch import Tensor

from rescore.schemas.lists import flat_list
from rescore.transforms.strategies.base import ADVANTAGE, GroupedRows, Scores
from rescore.transforms.strategies.grpo import grpo_scores
from rescore.transforms.strategies.registry import ConfigError, flag, integer, number, register
from rescore.transforms.strategies.segments import group_stats, segment_sum

MU, LOSS_WEIGHT, SFT_TOKEN_WEIGHTS = "mu", "loss_weight", "sft_token_weights"


def mu_schedule(step: float, warmup_steps: int, decay_steps: int, peak: float, valley: float) -> float:
    """Linear warm-up from 0 to `peak` over `warmup_steps`, then cosine decay to `valley` over
    `decay_steps`, then `valley` (Trinity-RFT `mu_schedule_function`)."""
    if step < warmup_steps:
        return step / warmup_steps * peak
    if step >= warmup_steps + decay_steps:
        return valley
    cosine = 0.5 * (1 + math.cos(math.pi * (step - warmup_steps) / decay_steps))
    return (peak - valley) * cosine + valley


def phi(logprobs: np.ndarray) -> np.ndarray:
    """phi(p) = p (1 - p) with p = exp(logprob), per token (float32)."""
    p = np.exp(np.asarray(logprobs, dtype=np.float64))
    return (p * (1.0 - p)).astype(np.float32)


@dataclass(frozen=True)
class MixChord:
    epsilon: float = 1e-6
    mu_warmup_steps: int = 0
    mu_decay_steps: int = 0
    mu_peak: float = 0.1
    mu_valley: float = 0.1
    enable_phi_function: bool = True
    name: str = "mix_chord"
    params: Mapping[str, Any] = field(default_factory=dict)
    kind = ADVANTAGE
    needs: tuple[str, ...] = ("expert",)
    batch_level = False

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        """GRPO over each group's non-expert rows; expert rows score 0 and are kept."""
        expert = rows.expert
        usual = rows.select(~expert)
        score = torch.zeros_like(rows.reward)
        mean, std = group_stats(rows.reward, rows.offsets)
        if usual.num_rows:
            s = grpo_scores(usual.reward, usual.offsets, epsilon=self.epsilon)
            score[~expert] = s.score
            # Report the statistics GRPO used for groups that have non-expert rows.
            has_usual = segment_sum(~expert, rows.offsets) > 0
            mean[has_usual], std[has_usual] = s.group_mean, s.group_std
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return Scores(score, keep, mean, std)

    def mu(self, batch: np.ndarray) -> np.ndarray:
        return np.array(
            [mu_schedule(float(b), self.mu_warmup_steps, self.mu_decay_steps, self.mu_peak, self.mu_valley) for b in batch.tolist()],
            dtype=np.float64,
        )

    def output_fields(self, input_schema: pa.Schema) -> list[pa.Field]:
        fields = [pa.field(MU, pa.float32()), pa.field(LOSS_WEIGHT, pa.float32())]
        if self.enable_phi_function and "logprobs" in input_schema.names:
            fields.append(pa.field(SFT_TOKEN_WEIGHTS, pa.list_(pa.float32())))
        return fields

    def output_columns(self, table: pa.Table, fields: list[pa.Field]) -> list[pa.Array]:
        """mu, loss_weight (and sft_token_weights) for the written rows of `table`."""
        batch = np.asarray(table["batch"].to_numpy(), dtype=np.int64)
        expert = np.asarray(table["expert"].to_numpy(zero_copy_only=False), dtype=bool)
        unique, inverse = np.unique(batch, return_inverse=True)
        mu = self.mu(unique)[inverse]
        columns = [pa.array(mu.astype(np.float32)), pa.array(np.where(expert, mu, 1.0 - mu).astype(np.float32))]
        if len(fields) > 2:
            lp = flat_list(table["logprobs"])
            values = phi(lp.values.to_numpy(zero_copy_only=False))
            weights = pa.LargeListArray.from_arrays(pa.array(lp.offsets), pa.array(values))
            columns.append(weights.cast(fields[2].type))
        return columns


@register(
    "mix_chord",
    kind=ADVANTAGE,
    defaults={
        "epsilon": 1e-6,
        "mu_warmup_steps": 0,
        "mu_decay_steps": 0,
        "mu_peak": 0.1,
        "mu_valley": 0.1,
        "enable_phi_function": True,
    },
    summary="CHORD: mu schedule, loss weights (mu expert / 1 - mu others), GRPO for non-expert rows, phi token weights",
)
def make_mix_chord(epsilon, mu_warmup_steps, mu_decay_steps, mu_peak, mu_valley, enable_phi_function) -> MixChord:
    name = "mix_chord"
    params = dict(
        epsilon=number(name, "epsilon", epsilon, minimum=0.0),
        mu_warmup_steps=integer(name, "mu_warmup_steps", mu_warmup_steps, minimum=0),
        mu_decay_steps=integer(name, "mu_decay_steps", mu_decay_steps, minimum=0),
        mu_peak=number(name, "mu_peak", mu_peak),
        mu_valley=number(name, "mu_valley", mu_valley),
        enable_phi_function=flag(name, "enable_phi_function", enable_phi_function),
    )
    for key in ("mu_peak", "mu_valley"):
        if not 0.0 <= params[key] <= 1.0:
            raise ConfigError(f"{name}: parameter {key!r} must be between 0 and 1, got {params[key]!r}")
    return MixChord(**params, name=name, params=params)
