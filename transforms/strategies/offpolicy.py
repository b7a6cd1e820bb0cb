"""Off-policy (rollout) correction: importance weights and rejection masks between the
training-time log-probs `logprobs` (pi_train, refreshed by --logprob-model or logged) and the
behaviour log-probs that generated the rollout (`logprobs_original`, pi_rollout).

Per response token t of a row, with m_t the input action mask:

    log r_t   = logprobs_t - behaviour_t                 (log(pi_train / pi_rollout))
    k1_t      = -log r_t,   k2_t = (log r_t)^2 / 2,   k3_t = exp(log r_t) - 1 - log r_t
    seq_sum   = sum_t m_t x_t,   seq_mean = seq_sum / max(sum_t m_t, 1),   seq_max = max_{m_t=1} x_t

Each family is the framework's own definition (the tests compare with its function):

verl 0.9.1 (`rollout_corr_helper.py`), over the input mask:
    rollout_is = token:    w_t = exp(clamp(log r_t, -20, 20))
    rollout_is = sequence: w_t = exp(clamp(seq_sum(log r), -20, 20))
    rollout_is_threshold "U" (TIS): w = min(w, U);  "L_U" (IcePop): w = 0 outside [L, U]
    rollout_rs options (comma list, all must pass), log r clamped to +-20 first:
        token_k1 / seq_sum_k1 / seq_mean_k1: keep log L <= stat <= log U ("L_U"; "U" means L = 1/U)
        token_k2|k3, seq_sum_k2|k3, seq_mean_k2|k3, seq_max_k2|k3: keep stat <= U
TRL 1.16.0 (GRPOTrainer, vllm_importance_sampling_mode), over the input mask:
    d_t = m_t log r_t (NaN -> 0); token_*: rho_t = exp(d_t); sequence_*: rho = exp(sum_t d_t)
    *_truncate: clamp(rho, C_min, C_max);  *_mask: rho = 0 outside [C_min, C_max]
    off_policy_mask_threshold delta (DeepSeek-V3.2 OPSM): a row is masked when its advantage < 0
    and mean_t m_t (behaviour_t - logprobs_t) > delta
SkyRL (`off_policy_correction_utils.py`), applied in SkyRL's order:
    outlier tokens: a row is masked when any action token's exp(clamp(log r)) leaves [low, high];
    token mask: tokens with exp(clamp(log r)) outside [low, high] are masked;
    TIS (tis_ratio_type): min(exp(clamp(log r_t)), token cap) or min(exp(clamp(seq_sum)), seq cap),
        the sum over the mask left by the two masks above;
    sequence mask: geometric exp(clamp(seq_mean(log r))) or product exp(clamp(seq_sum(log r)))
        outside [low, high] masks the row (over the mask left by the token masks).
OpenRLHF 0.11.2 (PolicyLoss is_correction_*): statistic per token or per row (level seq: the
    ratio's geometric mean, a divergence's plain mean) of gating ratio (exp(log r)), binary_kl
    (p log(p/q) + (1-p) log((1-p)/(1-q)), p = exp(behaviour), q = exp(logprobs), both clamped to
    [1e-6, 1 - 1e-6]) or tv (|p - q|); mode mask: units outside [low, high] are rejected and the
    survivors weigh exp(log r_t); mode clip (token ratio only): w_t = clamp(r_t, low, high).

The written mask is the input's times every rejection; `is_weights` are zero where the input
mask is zero. Pure torch over padded (rows, tokens) arrays; no Beam, no Arrow.

Where each part lives: one module per library (offpolicy_verl.py, offpolicy_trl.py,
offpolicy_skyrl.py, offpolicy_openrlhf.py) over the shared padded arrays (offpolicy_tensors.py);
the settings applied in order (offpolicy_correct.py: correct, REASONS); the parameters' parsing
(offpolicy_spec.py); this module: the registered stage, rollout_correction and its presets.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import (
    GroupedRows,
    OutputColumn,
    Scores,
    WrittenRows,
)
from rescore.transforms.strategies.features import Feature, FeatureRows
from rescore.transforms.strategies.offpolicy_correct import REASONS, correct, rows_tensors
from rescore.transforms.strategies.offpolicy_spec import RolloutCorrectionParams, parse_is_threshold
from rescore.transforms.strategies.offpolicy_tensors import seq_sum, unpadded
from rescore.transforms.strategies.offpolicy_trl import off_policy_sequence_mask
from rescore.transforms.strategies.offpolicy_verl import METRIC_SUMS, batch_normalize_factor, batch_normalize_terms, metric_terms, offpolicy_metrics
from rescore.transforms.strategies.registry import spec
from rescore.transforms.strategies.segments import group_stats
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


class RolloutCorrection(RolloutCorrectionParams):
    """A filter stage: rows that every token of which a rejection mask removes are dropped
    (ExplainsDrops says which), the others written with `is_weights` and the rejections zeroed
    in `action_mask` (the input's kept as `action_mask_original`)."""

    @property
    def needs(self) -> tuple:
        out = ["logprobs", self.behaviour_logprobs, CorrectionMasks(self)]
        if self.max_staleness is not None:
            out.append(self.model_version_key)
        return tuple(out)

    @property
    def batch_level(self) -> bool:
        return False

    # --- before the shuffle: what decides whether a row is kept ---------------------------------

    def light_features(self, rows: WrittenRows) -> dict[str, np.ndarray]:
        """x.offpolicy_kept (tokens left) and x.offpolicy_reason of each row, as float64."""
        lengths, logprobs, behaviour, mask, bad = rows_tensors(self, rows)
        c = correct(self, logprobs, behaviour, mask)
        reason = c.reason.numpy().astype(np.float64)
        reason[bad] = REASONS.index("behaviour_logprobs")
        kept = c.mask.sum(-1).numpy()
        kept[bad] = 0.0
        had = mask.sum(-1).numpy() > 0
        kept = np.where(had | bad, kept, -1.0)  # -1: nothing to train on in the input already
        out = {"offpolicy_kept": kept, "offpolicy_reason": reason}
        upper, lower = parse_is_threshold(self.rollout_is_threshold) if self.rollout_is is not None else (math.inf, None)
        terms = metric_terms(
            logprobs, behaviour, mask, c.weights if self.rollout_is is not None else None, upper, self.rollout_is or "token", lower
        )
        for k, v in terms.items():
            out["offpolicy_m_" + k] = np.where(bad, 0.0, v)
        if self.rollout_is_batch_normalize:  # verl's batch mean, over the input mask of every row
            num, den = batch_normalize_terms(c.weights, mask, self.rollout_is)
            out[BN_NUM], out[BN_DEN] = np.where(bad, 0.0, num.numpy()), np.where(bad, 0.0, den.numpy())
        return out

    def norm_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        """(batch ids, numerators, denominators) (n,) of the rows' batch_normalize_terms."""
        return rows.batch, rows.columns[BN_NUM], rows.columns[BN_DEN]

    def norm_factor(self, numerator: float, denominator: float) -> float:
        """verl's divisor of the weights from a batch's summed terms (1 where the mean is ~0)."""
        return batch_normalize_factor(numerator, denominator, self.rollout_is)

    def group_metric_sums(self, rows: GroupedRows) -> dict[str, np.ndarray]:
        """(G,) per group: the sums of metric_terms over its rows (rows whose log-probs did not
        line up count nowhere), and log_ppl_diff's max and min (NaN where no row counts)."""
        offsets = rows.offsets.cpu().numpy()
        g = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        counted = rows.columns["offpolicy_m_rows"].cpu().numpy() > 0
        out = {}
        for k in METRIC_SUMS:
            if "offpolicy_m_" + k not in rows.columns:  # the weights' sums: rollout_is only
                continue
            v = rows.columns["offpolicy_m_" + k].cpu().numpy()
            out[k] = np.array([math.fsum(v[offsets[i] : offsets[i + 1]]) for i in range(len(offsets) - 1)])
        d = rows.columns["offpolicy_m_log_ppl_diff"].cpu().numpy()
        high = np.full(len(offsets) - 1, -np.inf)
        low = np.full(len(offsets) - 1, np.inf)
        np.maximum.at(high, g[counted], d[counted])
        np.minimum.at(low, g[counted], d[counted])
        out["log_ppl_diff_max"], out["log_ppl_diff_min"] = high, low
        return out

    def _stale(self, rows: GroupedRows) -> Tensor:
        if self.max_staleness is None:
            return torch.zeros(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        if self.current_model_version is None:  # the launcher sets it to the input's newest version
            raise RuntimeError(f"internal error: {self.name}: max_staleness without a current_model_version")
        version = rows.columns[self.model_version_key]
        return version < (self.current_model_version - self.max_staleness)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        kept = rows.columns["offpolicy_kept"]
        keep = (kept != 0) & ~self._stale(rows)
        mean, std = group_stats(rows.reward, rows.offsets)
        return Scores(None, keep, mean, std)

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        stale = self._stale(rows).cpu().numpy()
        reason = rows.columns["offpolicy_reason"].cpu().numpy().astype(np.int64)
        version = rows.columns[self.model_version_key].cpu().numpy() if self.max_staleness is not None else None
        out = []
        for i in np.flatnonzero(dropped) if dropped.dtype == bool else dropped:
            if stale[i]:
                out.append(
                    f"{self.name}: model_version {version[i]:g} is more than max_staleness {self.max_staleness}"
                    f" behind {self.current_model_version}"
                )
            elif REASONS[reason[i]] == "behaviour_logprobs":
                out.append(f"{self.name}: {self.behaviour_logprobs} or logprobs do not line up with the response (or hold NaN)")
            else:
                out.append(f"{self.name}: every action token rejected ({REASONS[reason[i]] or 'masks'})")
        return out

    # --- where a row is written ---------------------------------------------------------------

    def correction_columns(self, input_names: Collection[str]) -> list[OutputColumn]:
        return [OutputColumn("is_weights", per_token=True)]

    def token_correction(self, rows: WrittenRows, advantage: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(flat is_weights (T,), flat corrected mask (T,)) over the rows' response tokens;
        `advantage` (n,) is each row's scalar advantage (the OPSM reads its sign)."""
        weights, mask, _ = self.corrected_rows(rows, advantage)
        return weights, mask

    def corrected_rows(
        self, rows: WrittenRows, advantage: np.ndarray, factor: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        """token_correction's (weights, mask) and the audit values of each row: the sequence
        log ratio sum_t m_t (logprobs_t - behaviour_t) and the first mask that removed any of
        its tokens (None: none). `factor` (n,): each row's batch divisor of the weights
        (rollout_is_batch_normalize), or None."""
        lengths, logprobs, behaviour, mask, bad = rows_tensors(self, rows)
        c = correct(self, logprobs, behaviour, mask)
        new_mask = c.mask
        why = np.array([REASONS[i] or None for i in c.touched.tolist()], dtype=object)
        if self.off_policy_mask_threshold is not None:
            keep = off_policy_sequence_mask(logprobs, behaviour, mask, torch.as_tensor(advantage, dtype=torch.float64), self.off_policy_mask_threshold)
            hit = (~keep).numpy() & (new_mask.sum(-1) > 0).numpy()
            why[hit & (why == None)] = "off_policy_mask"  # noqa: E711  (an object array)
            new_mask = new_mask * keep.unsqueeze(-1).to(new_mask.dtype)
        weights = c.weights
        if factor is not None:
            weights = weights / torch.tensor(np.asarray(factor, dtype=np.float64)).unsqueeze(-1)
        if bad.any():
            b = torch.from_numpy(bad)
            new_mask[b] = 0.0
            weights[b] = 0.0
            why[bad] = "behaviour_logprobs"
        audit = {"offpolicy_seq_log_ratio": seq_sum((logprobs - behaviour) * (mask > 0), mask).numpy(), "offpolicy_mask_reason": why}
        return unpadded(weights, lengths), unpadded(new_mask, lengths), audit

    def metrics(self, rows: WrittenRows) -> dict[str, float]:
        """verl's off-policy diagnostics over these rows."""
        lengths, logprobs, behaviour, mask, bad = rows_tensors(self, rows)
        keep = torch.from_numpy(~bad)
        return offpolicy_metrics(logprobs[keep], behaviour[keep], mask[keep])


BN_NUM, BN_DEN = "offpolicy_bn_num", "offpolicy_bn_den"
"""Light columns of rollout_is_batch_normalize: each row's batch_normalize_terms."""


@dataclass(frozen=True)
class CorrectionMasks(Feature):
    """Need of a rollout_correction `stage`: light columns x.offpolicy_kept (tokens the rejection
    masks leave), x.offpolicy_reason (REASONS index of the first mask that emptied the row), the
    metric terms x.offpolicy_m_NAME and, with rollout_is_batch_normalize, BN_NUM and BN_DEN
    (RolloutCorrection.light_features)."""

    stage: RolloutCorrection

    def light(self, rows: FeatureRows) -> dict[str, np.ndarray]:
        return self.stage.light_features(rows)


_PRESETS: dict[type, type] = {}


def preset(**values):
    """The factory of the presets (offpolicy_spec.py registers each under the framework's name): a
    RolloutCorrection that is also an instance of the preset's own declaration."""
    params = spec(values["name"]).params
    if params not in _PRESETS:
        _PRESETS[params] = type(params.__name__.removesuffix("Params"), (RolloutCorrection, params), {})
    return _PRESETS[params](**values)
