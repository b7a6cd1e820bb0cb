"""The whole off-policy correction of a row batch: every setting of a rollout_correction
(RolloutCorrectionParams) applied in the libraries' order, and the padded tensors a stage reads
from its rows. Public: the correction stage (offpolicy.py) and the token-level estimators that
run after it (token_baseline.py) share it. Pure torch and numpy; no Beam, no Arrow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import WrittenRows
from rescore.transforms.strategies.offpolicy_openrlhf import openrlhf_gate
from rescore.transforms.strategies.offpolicy_skyrl import skyrl_outlier, skyrl_sequence_mask, skyrl_tis, skyrl_token_mask
from rescore.transforms.strategies.offpolicy_spec import RolloutCorrectionParams, parse_rs
from rescore.transforms.strategies.offpolicy_tensors import padded
from rescore.transforms.strategies.offpolicy_trl import trl_weights
from rescore.transforms.strategies.offpolicy_verl import verl_rejection, verl_weights
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor

REASONS = (
    "",
    "rollout_rs",
    "outlier_token",
    "token_mask",
    "sequence_mask",
    "is_correction_gate",
    "behaviour_logprobs",
)


@dataclass(frozen=True)
class Correction:
    """What the correction decided for B rows (padded to T tokens)."""

    weights: Tensor
    """(B, T) float64 importance weights, zero where the input mask is zero (ones without an
    importance-weight setting)."""
    mask: Tensor
    """(B, T) float64 the input mask times every rejection (OPSM not applied: it needs the
    advantage)."""
    reason: Tensor
    """(B,) int64 index in REASONS of the first mask that left the row no token (0: none)."""
    touched: Tensor | None = None
    """(B,) int64 index in REASONS of the first mask that removed any of the row's tokens."""


def correct(p: RolloutCorrectionParams, logprobs: Tensor, behaviour: Tensor, mask: Tensor) -> Correction:
    """Apply every setting of `p` to (B, T) padded log-probs and input mask (0/1 float64)."""
    log_ratio = (logprobs - behaviour) * (mask > 0)  # padding and non-action tokens: ratio 1
    had = mask.sum(-1) > 0
    reason = torch.zeros(mask.shape[0], dtype=torch.int64)
    touched = torch.zeros(mask.shape[0], dtype=torch.int64)
    current = mask

    def reject(keep: Tensor, code: int) -> None:
        nonlocal current
        after = current * keep
        emptied = had & (reason == 0) & (after.sum(-1) == 0)
        reason[emptied] = code
        touched[(touched == 0) & (after.sum(-1) < current.sum(-1))] = code
        current = after

    # SkyRL's token masks first: its TIS ratio and sequence mask read the mask they leave.
    sky_mask = mask
    if p.outlier_token_is_threshold_low is not None or p.outlier_token_is_threshold_high is not None:
        keep = skyrl_outlier(log_ratio, mask, p.outlier_token_is_threshold_low, p.outlier_token_is_threshold_high)
        sky_mask = sky_mask * keep
        reject(keep, REASONS.index("outlier_token"))
    if p.token_mask_is_threshold_low is not None and p.token_mask_is_threshold_high is not None:
        keep = skyrl_token_mask(log_ratio, sky_mask, p.token_mask_is_threshold_low, p.token_mask_is_threshold_high)
        sky_mask = sky_mask * keep
        reject(keep, REASONS.index("token_mask"))

    weights = mask.clone()
    if p.rollout_is is not None:
        weights = verl_weights(log_ratio, mask, p.rollout_is, p.rollout_is_threshold)
    elif p.vllm_importance_sampling_mode is not None:
        weights = trl_weights(log_ratio, mask, p.vllm_importance_sampling_mode, p.vllm_importance_sampling_clip_min, p.vllm_importance_sampling_clip_max)
    elif p.tis_ratio_type is not None:
        weights = skyrl_tis(log_ratio, sky_mask, p.tis_ratio_type, p.token_tis_ratio_clip_high, p.sequence_tis_ratio_clip_high) * mask
    if p.rollout_rs is not None:
        reject(verl_rejection(log_ratio, mask, parse_rs(p.rollout_rs, p.rollout_rs_threshold)), REASONS.index("rollout_rs"))
    if p.sequence_mask_metric is not None:
        low, high = (p.geo_mask_low, p.geo_mask_high) if p.sequence_mask_metric == "geometric" else (p.product_mask_low, p.product_mask_high)
        reject(skyrl_sequence_mask(log_ratio, sky_mask, p.sequence_mask_metric, low, high), REASONS.index("sequence_mask"))
    if p.is_correction_level != "off":
        low, high = p.is_correction_threshold
        coef, keep = openrlhf_gate(logprobs, behaviour, mask, p.is_correction_level, p.is_correction_mode, p.is_correction_gating, low, high)
        weights = coef * mask
        reject(keep, REASONS.index("is_correction_gate"))
    return Correction(weights, current, reason, touched)


def rows_tensors(p: RolloutCorrectionParams, rows: WrittenRows) -> tuple[np.ndarray, Tensor, Tensor, Tensor, np.ndarray]:
    """(response lengths, logprobs, behaviour, mask (B, T), bad (B,) rows whose log-prob lists
    do not line up with the response)."""
    lengths, flat_mask = rows.response()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    bad = np.zeros(len(lengths), dtype=bool)
    cols = []
    for name in ("logprobs", p.behaviour_logprobs):
        col = rows.tokens(name)
        n = np.diff(col.offsets)
        ok = n == lengths
        bad |= ~ok
        values = np.asarray(col.values, dtype=np.float64)
        if not ok.all():  # rebuild row by row: the bad rows get zeros
            fixed = np.zeros(int(lengths.sum()), dtype=np.float64)
            for i in np.flatnonzero(ok):
                fixed[offsets[i] : offsets[i + 1]] = values[col.offsets[i] : col.offsets[i + 1]]
            values = fixed
        nan = np.isnan(values)
        if nan.any():
            bad[np.repeat(np.arange(len(lengths)), lengths)[nan]] = True
            values = np.where(nan, 0.0, values)
        cols.append(padded(offsets, values))
    return lengths, cols[0], cols[1], padded(offsets, flat_mask), bad
