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
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, OutputColumn, Scores, TokenColumn, WrittenRows
from rescore.transforms.strategies.grpo import grpo_scores
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats, segment_sum
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor

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
class MixChordParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0, help="added to the std of the GRPO step over each group's non-expert rows")
    mu_warmup_steps: int = param(0, minimum=0, help="batches of linear warm-up of mu, from 0 to mu_peak")
    mu_decay_steps: int = param(0, minimum=0, help="batches of cosine decay of mu, from mu_peak to mu_valley, after the warm-up")
    mu_peak: float = param(0.1, between=(0.0, 1.0), help="mu at the end of the warm-up")
    mu_valley: float = param(
        0.1, between=(0.0, 1.0),
        help="mu after the decay (and throughout with the default 0 warm-up and decay steps)",
    )
    enable_phi_function: bool = param(
        True,
        help="write `sft_token_weights` phi(p) = p (1 - p), p = exp(logprob), where the input has logprobs",
    )


@register("mix_chord", kind=ADVANTAGE, summary="CHORD: mu schedule, loss weights (mu expert / 1 - mu others), GRPO for non-expert rows, phi token weights")
class MixChord(MixChordParams):
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

    def output_columns(self, input_names: Collection[str]) -> list[OutputColumn]:
        columns = [OutputColumn(MU), OutputColumn(LOSS_WEIGHT)]
        if self.enable_phi_function and "logprobs" in input_names:
            columns.append(OutputColumn(SFT_TOKEN_WEIGHTS, per_token=True))
        return columns

    def output_values(self, rows: WrittenRows, columns: list[OutputColumn]) -> list[np.ndarray | TokenColumn]:
        """mu, loss_weight (and sft_token_weights) for the written rows."""
        batch = np.asarray(rows.scalar("batch"), dtype=np.int64)
        expert = np.asarray(rows.scalar("expert"), dtype=bool)
        unique, inverse = np.unique(batch, return_inverse=True)
        mu = self.mu(unique)[inverse]
        values: list[np.ndarray | TokenColumn] = [mu.astype(np.float32), np.where(expert, mu, 1.0 - mu).astype(np.float32)]
        if len(columns) > 2:
            lp = rows.tokens("logprobs")
            values.append(TokenColumn(lp.offsets, phi(lp.values)))
        return values
