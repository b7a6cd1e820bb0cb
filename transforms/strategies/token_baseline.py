"""verl's optimal token baseline (and its TIR variant) and Trinity's clip_B as registered stages;
their formulas are in token_baseline_math.py.

How they run in the job (the registered classes at the end of this module):

  optimal_token_baseline  each row's W_t m_t is computed where the row is read (light_features)
                          and crosses the shuffle as a token feature (GroupedRows.token_columns);
                          score() forms each group's B_t and returns each row's own baselines
                          (Scores.row_tokens, carried back in the row's record) with G as its
                          score; token_values writes (G - B_t) m_t. After rollout_correction in
                          the same chain (needs_after), W reads the corrected mask and is_weights.
  clipb                   each row's sums of S and S^2 over its action tokens are light features,
                          the batch's ES and varS batch statistics; score() returns (ES, varS) per
                          row as row_tokens; token_mask (ClipsTokens) removes the clipped tokens
                          from the written action_mask and token_values writes A * mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, Scores, Strategy, TokenColumn, WrittenRows
from rescore.transforms.strategies.features import Feature, FeatureRows
from rescore.transforms.strategies.flat import action_means, flat_segment_sum
from rescore.transforms.strategies.offpolicy_correct import correct, rows_tensors
from rescore.transforms.strategies.offpolicy_tensors import unpadded
from rescore.transforms.strategies.registry import ADVANTAGE, ConfigError, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats
from rescore.transforms.strategies.tensors import torch
from rescore.transforms.strategies.token_baseline_math import clipb_scores, clipb_signal, moment_values, path_variance, token_baselines

if TYPE_CHECKING:
    from torch import Tensor

# --- the registered estimators (optimal_token_baseline, tir_optimal_token_baseline) ----------

PATH_VARIANCE, BAD, LAST = "otb_path_variance", "otb_bad", "otb_last"
IS_WEIGHTS = "is_weights"
"""The token column rollout_is_weights=true reads (what a rollout_correction run writes)."""


def _aligned(rows: WrittenRows, name: str, lengths: np.ndarray, bad: np.ndarray) -> np.ndarray:
    """(T,) float64 the token column `name` over the response tokens; rows whose list does not
    line up with the response (or holds NaN) are marked in `bad` and read as zeros."""
    col = rows.tokens(name)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    ok = np.diff(col.offsets) == lengths
    values = np.asarray(col.values, dtype=np.float64)[int(col.offsets[0]) : int(col.offsets[-1])]
    if not ok.all():  # rebuild row by row: the rows that do not line up get zeros
        start = np.asarray(col.offsets, dtype=np.int64) - int(col.offsets[0])
        fixed = np.zeros(int(offsets[-1]), dtype=np.float64)
        for i in np.flatnonzero(ok):
            fixed[offsets[i] : offsets[i + 1]] = values[start[i] : start[i + 1]]
        values = fixed
    nan = ~np.isfinite(values)
    if nan.any():
        bad[np.repeat(np.arange(len(lengths)), lengths)[nan]] = True
        values = np.where(nan, 0.0, values)
    bad |= ~ok
    return values


@dataclass(frozen=True)
class OptimalTokenBaselineParams(StrategyParams):
    handle_zero_tail: bool = param(
        True,
        help="verl's default: where one row alone has the most action tokens (L1, the next most L2), its baseline "
             "is 0 from position L2 on",
    )
    epsilon: float = param(1e-8, minimum=0.0, help="added to the denominator of B_t")
    rollout_is_weights: bool = param(
        False,
        help="read an `is_weights` column of the input as rho_t (what an earlier correction run wrote)",
    )


@register("optimal_token_baseline", kind=ADVANTAGE, summary="G_t - B_t, B_t per group and position weighted by the path variance (verl); needs logprobs and sum_pi_squared")
class OptimalTokenBaseline(OptimalTokenBaselineParams):
    """verl's optimal token baseline (see the module doc). The path variance W_t m_t of each row
    is computed where the row is read and crosses the shuffle as a token feature; score() forms
    each group's per-position baseline B_t and returns it per row (Scores.row_tokens) with the
    row's return G (the reward where the last response token is an action token, else 0) as
    its score; token_values writes (G - B_t) m_t."""

    tir = False
    batch_level = False

    @property
    def needs(self) -> tuple[str, ...]:
        return self.needs_after(None)

    def needs_after(self, correction: Strategy | None) -> tuple:
        """`needs` in a chain whose filter stage is `correction` (rollout_correction, or None):
        the path variance then reads the corrected mask and the correction's is_weights, as
        verl's trainer runs its rollout correction before the advantage."""
        extra = (IS_WEIGHTS,) if self.rollout_is_weights else ()
        return ("logprobs", "sum_pi_squared", *extra, PathVariance(self, correction))

    def check_chain(self, chain) -> None:
        correction = chain.correction
        if correction is not None and self.rollout_is_weights:
            raise ConfigError(
                f"{self.name}: rollout_is_weights=true reads an is_weights column, but {correction.name} in the same "
                "run computes the weights itself; drop one of them"
            )

    def light_features(self, rows: WrittenRows, correction=None) -> dict[str, np.ndarray | TokenColumn]:
        """x.otb_path_variance (path_variance's values per row), x.otb_last (1.0 where the last
        response token is an action token: the reward counts) and x.otb_bad (1.0 where a row's
        logprobs, sum_pi_squared or weights do not line up with its response). With a
        `correction` (rollout_correction), over its corrected mask and with its weights."""
        lengths, mask = rows.response()
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        bad = np.zeros(len(lengths), dtype=bool)
        lp = _aligned(rows, "logprobs", lengths, bad)
        spp = _aligned(rows, "sum_pi_squared", lengths, bad)
        isw = _aligned(rows, IS_WEIGHTS, lengths, bad) if self.rollout_is_weights else None
        if correction is not None:
            _, logprobs, behaviour, padded_mask, dropped = rows_tensors(correction, rows)
            c = correct(correction, logprobs, behaviour, padded_mask)
            mask, isw = unpadded(c.mask, lengths), unpadded(c.weights, lengths)
            bad |= dropped  # the correction drops these rows itself
        m = np.where(np.repeat(bad, lengths), 0.0, mask)  # a bad row adds nothing (it is dropped)
        values, value_offsets = path_variance(m, offsets, lp, spp, isw, tir=self.tir)
        last = np.zeros(len(lengths), dtype=np.float64)
        nonempty = lengths > 0
        last[nonempty] = m[offsets[1:][nonempty] - 1] != 0
        return {PATH_VARIANCE: TokenColumn(value_offsets, values), BAD: bad.astype(np.float64), LAST: last}

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep_t = rows.columns[BAD] == 0
        keep = keep_t.cpu().numpy()
        gain = rows.reward * rows.columns[LAST]
        gain = torch.where(rows.action_tokens > 0, gain, torch.zeros_like(gain))  # a masked row has no return
        tokens = rows.token_columns[PATH_VARIANCE]
        lengths = np.diff(tokens.offsets)
        actions = rows.action_tokens.cpu().numpy()
        values = np.where(np.repeat(actions > 0, lengths), tokens.values, 0.0)  # a masked row weighs nothing
        offsets = rows.offsets.cpu().numpy()
        group = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        sub = TokenColumn(tokens.offsets, values).select(keep)
        g = gain.cpu().numpy()[keep]
        b = token_baselines(
            sub.values, sub.offsets, np.repeat(g, np.diff(sub.offsets)), group[keep], actions[keep],
            tir=self.tir, handle_zero_tail=self.handle_zero_tail, epsilon=self.epsilon,
        )
        baseline = np.zeros(len(values), dtype=np.float64)
        baseline[np.repeat(keep, lengths)] = b
        mean, std = group_stats(rows.reward, rows.offsets)
        return Scores(gain.to(torch.float64), keep_t, mean, std, row_tokens=TokenColumn(tokens.offsets, baseline))

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        return [f"{self.name}: logprobs, sum_pi_squared or the weights do not line up with the response (or hold NaN)"] * len(
            np.flatnonzero(dropped) if dropped.dtype == bool else dropped
        )

    def token_values(
        self, rows: WrittenRows, score: np.ndarray, row_value: np.ndarray, row_tokens: TokenColumn | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(flat advantages (G - B_t) m_t, per-row mean over action tokens); `score` is G and
        `row_tokens` the row's baselines, as score() left them."""
        lengths, mask = rows.response()
        if row_tokens is None and len(lengths) == 0:  # a unit none of whose rows is scored
            return np.zeros(0), np.zeros(0)
        if row_tokens is None:
            raise RuntimeError(f"internal error: {self.name}: no per-token baselines came back with the scores")
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        b = np.asarray(row_tokens.values, dtype=np.float64)[int(row_tokens.offsets[0]) : int(row_tokens.offsets[-1])]
        if self.tir:  # one baseline per action token, in order
            full = np.zeros(len(mask), dtype=np.float64)
            take = mask != 0
            have = np.diff(np.asarray(row_tokens.offsets, dtype=np.int64))
            need = flat_segment_sum(take.astype(np.int64), offsets)
            # a row the off-policy sequence mask empties where it is written keeps no token
            emptied = (need == 0) & (have > 0)
            if ((have != need) & ~emptied).any():
                raise RuntimeError(f"internal error: {self.name}: the baselines do not line up with the action tokens")
            full[take] = b[~np.repeat(emptied, have)]
            b = full
        elif len(b) != len(mask):
            raise RuntimeError(f"internal error: {self.name}: {len(b)} baselines for {len(mask)} response tokens")
        row = np.repeat(np.arange(len(lengths)), lengths)
        values = (np.asarray(score, dtype=np.float64)[row] - b) * mask
        return values, action_means(values, mask, offsets)


@register("tir_optimal_token_baseline", kind=ADVANTAGE, summary="optimal_token_baseline over each row's action tokens only (verl's multi-turn variant)")
class TIROptimalTokenBaseline(OptimalTokenBaseline):
    tir = True


@dataclass(frozen=True)
class PathVariance(Feature):
    """Need of optimal_token_baseline `stage` after `correction` (rollout_correction, or None):
    light columns x.otb_path_variance (list<float64>, a token feature that crosses the shuffle),
    x.otb_last and x.otb_bad (OptimalTokenBaseline.light_features)."""

    stage: OptimalTokenBaseline
    correction: Strategy | None = None

    def light(self, rows: FeatureRows) -> dict[str, np.ndarray | TokenColumn]:
        return self.stage.light_features(rows, self.correction)


# --- clipb -----------------------------------------------------------------------------------

S_SUM, S2_SUM, S_BAD = "clipb_s", "clipb_s2", "clipb_bad"



@dataclass(frozen=True)
class ClipBParams(StrategyParams):
    epsilon: float = param(1e-6, minimum=0.0, help="added to the std of the GRPO advantage")
    mu: float = param(2.5, minimum=0.0, help="a negative-advantage token leaves the mask when S_t - ES < -mu sqrt(varS)")


@register("clipb", kind=ADVANTAGE, summary="GRPO advantages; negative-advantage tokens whose p(H + log p) is mu batch stds below its mean leave the action mask (Trinity); needs logprobs and entropy")
class ClipB(ClipBParams):
    """Trinity-RFT 0.6.0 ClipBAdvantageFn (see the module doc). Each row's sums of S and S^2 over
    its action tokens are computed where it is read; the batch's ES and varS are batch
    statistics; score() gives the GRPO advantage as the score and (ES, varS) to each row
    (Scores.row_tokens); where the row is written, the tokens clip_B does not keep leave the
    action mask (ClipsTokens) and the advantages are score * mask."""

    batch_level = True

    @property
    def needs(self) -> tuple[str, ...]:
        return self.needs_after(None)

    def needs_after(self, correction: Strategy | None) -> tuple:
        return ("logprobs", "entropy", ClipBSums(self, correction))

    def _signal(self, rows: WrittenRows, lengths: np.ndarray, bad: np.ndarray) -> np.ndarray:
        return clipb_signal(_aligned(rows, "logprobs", lengths, bad), _aligned(rows, "entropy", lengths, bad)).astype(np.float64)

    def light_features(self, rows: WrittenRows, correction=None) -> dict[str, np.ndarray]:
        """x.clipb_s and x.clipb_s2 (sums of S and S^2 over the row's action tokens, after a
        correction's rejections) and x.clipb_bad (1.0: logprobs or entropy do not line up)."""
        lengths, mask = rows.response()
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        bad = np.zeros(len(lengths), dtype=bool)
        s = self._signal(rows, lengths, bad)
        if correction is not None:
            _, logprobs, behaviour, padded_mask, dropped = rows_tensors(correction, rows)
            mask = unpadded(correct(correction, logprobs, behaviour, padded_mask).mask, lengths)
            bad |= dropped
        m = np.where(np.repeat(bad, lengths), 0.0, mask)
        return {S_SUM: flat_segment_sum(s * m, offsets), S2_SUM: flat_segment_sum(s * s * m, offsets), S_BAD: bad.astype(np.float64)}

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        good = (rows.columns[S_BAD] == 0).cpu().numpy()
        n = np.where(good, rows.action_tokens.cpu().numpy(), 0).astype(np.float64)
        values, weights = moment_values(rows.columns[S_SUM].cpu().numpy(), rows.columns[S2_SUM].cpu().numpy(), n)
        return torch.cat([rows.batch, rows.batch]), torch.from_numpy(values), torch.from_numpy(weights)

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        """(ES, varS) over the batch's action tokens (population variance; 0 and 0 for none)."""
        import math

        n = math.fsum(weights)
        if n <= 0:
            return 0.0, 0.0
        es = math.fsum(weights * values) / max(n, 1.0)
        return es, max(math.fsum(weights * values * values) / max(n, 1.0) - es * es, 0.0)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep_t = rows.columns[S_BAD] == 0
        keep = keep_t.cpu().numpy()
        offsets = rows.offsets.cpu().numpy()
        group = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
        score = np.zeros(rows.num_rows, dtype=np.float64)
        score[keep] = clipb_scores(rows.reward.cpu().numpy()[keep], group[keep], self.epsilon)
        stats = batch_stats.cpu().numpy().astype(np.float64)
        back = TokenColumn(np.arange(0, 2 * rows.num_rows + 1, 2, dtype=np.int64), stats[:, :2].reshape(-1))
        mean, std = group_stats(rows.reward, rows.offsets)
        return Scores(torch.from_numpy(score).to(rows.reward.device), keep_t, mean, std, row_tokens=back)

    def drop_reasons(self, rows: GroupedRows, reached: np.ndarray, dropped: np.ndarray, group_std: np.ndarray) -> list[str]:
        count = int(dropped.sum()) if dropped.dtype == bool else len(dropped)
        return [f"{self.name}: logprobs or entropy do not line up with the response (or hold NaN)"] * count

    def token_mask(self, rows: WrittenRows, score: np.ndarray, row_tokens: TokenColumn | None) -> np.ndarray:
        """(T,) the written mask: the input's (or corrected) mask less the tokens clip_B drops."""
        lengths, mask = rows.response()
        lengths = np.asarray(lengths, dtype=np.int64)
        if row_tokens is None and len(lengths) == 0:  # a unit none of whose rows is scored
            return mask
        stats = np.asarray(row_tokens.values, dtype=np.float64)[int(row_tokens.offsets[0]) :].reshape(-1, 2)
        s = self._signal(rows, lengths, np.zeros(len(lengths), dtype=bool))
        row = np.repeat(np.arange(len(lengths)), lengths)
        std = np.sqrt(stats[:, 1])
        adv = np.asarray(score, dtype=np.float64)
        keep = (adv[row] >= 0) | (std[row] < 1e-12) | (s - stats[row, 0] >= -(self.mu * std[row]))
        return mask * keep

    def token_values(
        self, rows: WrittenRows, score: np.ndarray, row_value: np.ndarray, row_tokens: TokenColumn | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(score * the written mask (already clipped), score)."""
        lengths, mask = rows.response()
        row = np.repeat(np.arange(len(lengths)), np.asarray(lengths, dtype=np.int64))
        score = np.asarray(score, dtype=np.float64)
        return score[row] * mask, score


@dataclass(frozen=True)
class ClipBSums(Feature):
    """Need of clipb `stage` after `correction` (rollout_correction, or None): light columns
    x.clipb_s, x.clipb_s2 (sums over action tokens of p (H + log p) and its square) and
    x.clipb_bad (ClipB.light_features)."""

    stage: ClipB
    correction: Strategy | None = None

    def light(self, rows: FeatureRows) -> dict[str, np.ndarray]:
        return self.stage.light_features(rows, self.correction)
