"""Estimators that read the model stage's token statistics: verl's optimal token baseline (and its
TIR variant) and Trinity's clip_B. Pure numpy over flat token arrays (rows concatenated, with
`offsets`), float64.

optimal_token_baseline (verl 0.9.1 `compute_optimal_token_baseline_advantage`)

    G_t  = sum_{s >= t} reward_s m_s                     (return to go)
    w_t  = 1 - 2 pi_t + sum_pi_squared_t                 (pi_t = exp(logprobs_t); times rho_t^2
                                                          with is_weights)
    W_t  = sum_{j <= t} w_j m_j                          (cumulative path variance)
    B_t  = sum_i G_it W_it m_it / (sum_i W_it m_it + eps)   over the rows i of a group, per position t
    A_t  = (G_t - B_t) m_t

  Positions are the response positions (row i's token t is at position t). A group of one row
  has B = 0. handle_zero_tail: when one row alone has the most action tokens (L1 > L2, the
  second most), its baseline is 0 from position L2 on (verl compares action-token counts with
  raw positions; so does this).

tir_optimal_token_baseline (verl 0.9.1 `compute_multi_turn_optimal_token_baseline_advantage`)

  The same over action-token indices: each row's action tokens are packed (observation tokens of
  a multi-turn response skipped), B is computed per packed index, and rows without action tokens
  take no part in their group.

clipb (Trinity-RFT 0.6.0 `ClipBAdvantageFn`, arXiv 2602.03392)

    A     = (r - mean_g) / (std_g + eps)   on every action token (Bessel std; a group of one:
                                           mean 0, std 1)
    S_t   = pi_t (H_t + logprobs_t)        (pi_t = exp(logprobs_t), H_t the token entropy)
    ES, varS = mean and population variance of S over every action token of the batch (float32)
    keep_t = A_t >= 0  or  S_t - ES >= -mu sqrt(varS)      (all kept when sqrt(varS) < 1e-12)

  The advantage is unchanged; tokens not kept are removed from the action mask.

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

import json

import numpy as np
import torch
from torch import Tensor

from rescore.transforms.strategies.base import GroupedRows, Scores, Strategy, TokenColumn, WrittenRows
from rescore.transforms.strategies.catalog import ClipBParams, OptimalTokenBaselineParams
from rescore.transforms.strategies.registry import ConfigError
from rescore.transforms.strategies.features import CLIPB_FEATURE
from rescore.transforms.strategies.features import TOKEN_BASELINE_FEATURE as FEATURE  # the need's prefix (features.py)
from rescore.transforms.strategies.flat import action_means, flat_segment_sum
from rescore.transforms.strategies.offpolicy_correct import correct, rows_tensors
from rescore.transforms.strategies.offpolicy_tensors import unpadded
from rescore.transforms.strategies.segments import group_stats

OTB_EPSILON = 1e-8
CLIPB_EPSILON = 1e-6
CLIPB_MU = 2.5


def _rows(offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each flat token, position of each flat token within its row)."""
    lengths = np.diff(offsets)
    row = np.repeat(np.arange(len(lengths)), lengths)
    return row, np.arange(int(offsets[-1] - offsets[0])) - (offsets[:-1] - offsets[0])[row]


def returns_to_go(token_rewards: np.ndarray, mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(T,) G_t = sum over s >= t of the row's reward_s * m_s."""
    x = np.asarray(token_rewards, dtype=np.float64) * mask
    total = np.concatenate([[0.0], np.cumsum(x)])
    row, _ = _rows(offsets)
    base = offsets - offsets[0]
    # suffix sum within the row: total[end] - total[t]
    return total[base[1:]][row] - total[: len(x)]


def outcome_token_rewards(reward: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(T,) the row reward on each row's last response token (0 elsewhere)."""
    out = np.zeros(int(offsets[-1] - offsets[0]), dtype=np.float64)
    ends = (offsets - offsets[0])[1:]
    nonempty = np.diff(offsets) > 0
    out[ends[nonempty] - 1] = np.asarray(reward, dtype=np.float64)[nonempty]
    return out


def _packed_index(m: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(T,) the index of each action token among its row's action tokens; -1 elsewhere."""
    row, _ = _rows(offsets)
    base = offsets - offsets[0]
    ranks = np.cumsum(m) - np.concatenate([[0.0], np.cumsum(m)])[base[:-1]][row] - 1
    return np.where(m != 0, ranks, -1).astype(np.int64)


def path_variance(
    mask: np.ndarray, offsets: np.ndarray, logprobs: np.ndarray, sum_pi_squared: np.ndarray,
    is_weights: np.ndarray | None = None, *, tir: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(values, value offsets (n + 1,)): each row's W_t m_t, the cumulative path variance on its
    action tokens (0 on the others), one value per response position; with `tir` one value per
    action token (the packed layout). Row-local: computed where the row is read."""
    offsets = np.asarray(offsets, dtype=np.int64)
    m = np.asarray(mask, dtype=np.float64)
    w = 1.0 - 2.0 * np.exp(np.asarray(logprobs, dtype=np.float64)) + np.asarray(sum_pi_squared, dtype=np.float64)
    if is_weights is not None:
        w = w * np.asarray(is_weights, dtype=np.float64) ** 2
    csum = np.concatenate([[0.0], np.cumsum(w * m)])
    row, _ = _rows(offsets)
    base = offsets - offsets[0]
    cumulative = (csum[1:] - csum[base[:-1]][row]) * m  # W_t m_t within the row
    if not tir:
        return cumulative, base
    take = m != 0
    counts = np.bincount(row[take], minlength=len(offsets) - 1) if len(row) else np.zeros(len(offsets) - 1, np.int64)
    packed = np.zeros(len(offsets), dtype=np.int64)
    np.cumsum(counts, out=packed[1:])
    return cumulative[take], packed


def token_baselines(
    values: np.ndarray, value_offsets: np.ndarray, gains: np.ndarray, group: np.ndarray, actions: np.ndarray, *,
    tir: bool = False, handle_zero_tail: bool = True, epsilon: float = OTB_EPSILON,
) -> np.ndarray:
    """(V,) B_t in the layout of `values` (path_variance's): per group and index t,
    sum_i G_it V_it / (sum_i V_it + eps); `gains` (V,) the returns G at each value, `group` (n,)
    the group ids, `actions` (n,) each row's action tokens. A group of one row has B = 0;
    with `tir` rows without action tokens take no part; the zero tail as in the module doc."""
    value_offsets = np.asarray(value_offsets, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    gains = np.asarray(gains, dtype=np.float64)
    actions = np.asarray(actions, dtype=np.int64)
    row, index = _rows(value_offsets)
    out = np.zeros(len(v), dtype=np.float64)
    _, gid = np.unique(np.asarray(group), return_inverse=True)
    order = np.argsort(gid, kind="stable")
    bounds = np.flatnonzero(np.diff(gid[order])) + 1
    for members in np.split(order, bounds) if len(gid) else []:
        if tir:
            members = members[actions[members] > 0]
        if len(members) <= 1:
            continue
        tokens = np.concatenate([np.arange(value_offsets[i], value_offsets[i + 1]) for i in members]) - value_offsets[0]
        width = int(index[tokens].max()) + 1 if len(tokens) else 0
        num = np.zeros(width)
        den = np.zeros(width)
        np.add.at(num, index[tokens], gains[tokens] * v[tokens])
        np.add.at(den, index[tokens], v[tokens])
        out[tokens] = (num / (den + epsilon))[index[tokens]]
        if handle_zero_tail:
            counts = actions[members]
            order_ = np.sort(counts)
            longest, second = int(order_[-1]), int(order_[-2])
            if longest > second and int((counts == longest).sum()) == 1:
                r = members[int(np.flatnonzero(counts == longest)[0])]
                tail = tokens[(row[tokens] == r) & (index[tokens] >= second)]
                out[tail] = 0.0
    return out


def optimal_token_baseline(
    token_rewards: np.ndarray,
    mask: np.ndarray,
    offsets: np.ndarray,
    group: np.ndarray,
    logprobs: np.ndarray,
    sum_pi_squared: np.ndarray,
    is_weights: np.ndarray | None = None,
    *,
    handle_zero_tail: bool = True,
    epsilon: float = OTB_EPSILON,
    tir: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(advantages (T,), returns (T,)) for flat tokens of rows `offsets` whose group ids are
    `group` (n,); see the module doc. `tir` packs action tokens (the TIR variant). The pipeline
    computes the same in two halves: path_variance where a row is read, token_baselines where
    its group is scored."""
    offsets = np.asarray(offsets, dtype=np.int64)
    m = np.asarray(mask, dtype=np.float64)
    returns = returns_to_go(token_rewards, m, offsets)
    values, value_offsets = path_variance(m, offsets, logprobs, sum_pi_squared, is_weights, tir=tir)
    row, _ = _rows(offsets)
    actions = np.bincount(row, weights=m, minlength=len(offsets) - 1).astype(np.int64) if len(row) else np.zeros(len(offsets) - 1, np.int64)
    take = m != 0
    gains = returns[take] if tir else returns
    b = token_baselines(values, value_offsets, gains, group, actions, tir=tir, handle_zero_tail=handle_zero_tail, epsilon=epsilon)
    if tir:
        baseline = np.zeros_like(returns)
        baseline[take] = b
        b = baseline
    return (returns - b) * m, returns


def clipb_signal(logprobs: np.ndarray, entropy: np.ndarray) -> np.ndarray:
    """(T,) S_t = pi_t (H_t + logprobs_t), float32 as Trinity computes it."""
    lp = np.asarray(logprobs, dtype=np.float32)
    return (np.exp(lp) * (np.asarray(entropy, dtype=np.float32) + lp)).astype(np.float32)


def clipb_stats(signal: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """(ES, varS): mean and population variance of S over the action tokens (one batch)."""
    m = np.asarray(mask, dtype=np.float64)
    s = np.asarray(signal, dtype=np.float64)
    n = max(float(m.sum()), 1.0)
    es = float((s * m).sum() / n)
    return es, float((((s - es) ** 2) * m).sum() / n)


def clipb_keep(advantages: np.ndarray, signal: np.ndarray, es: float, var_s: float, mu: float = CLIPB_MU) -> np.ndarray:
    """(T,) bool: the tokens clip_B keeps (every one with A >= 0; one with A < 0 only where
    S - ES >= -mu std(S))."""
    std = np.sqrt(var_s)
    if std < 1e-12:
        return np.ones(len(advantages), dtype=bool)
    z = np.asarray(signal, dtype=np.float64) - es
    return (np.asarray(advantages) >= 0) | (z >= -(mu * std))


def clipb_scores(reward: np.ndarray, group: np.ndarray, epsilon: float = CLIPB_EPSILON) -> np.ndarray:
    """(n,) (r - mean_g) / (std_g + eps) (Bessel std; a group of one: r / (1 + eps))."""
    reward = np.asarray(reward, dtype=np.float64)
    _, gid = np.unique(np.asarray(group), return_inverse=True)
    out = np.empty_like(reward)
    for g in range(int(gid.max()) + 1 if len(gid) else 0):
        members = gid == g
        r = reward[members]
        mean, std = (0.0, 1.0) if len(r) == 1 else (r.mean(), r.std(ddof=1))
        out[members] = (r - mean) / (std + epsilon)
    return out


# --- the registered estimators (catalog.py: optimal_token_baseline, tir_optimal_token_baseline) --

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

    def needs_after(self, correction: Strategy | None) -> tuple[str, ...]:
        """`needs` in a chain whose filter stage is `correction` (rollout_correction, or None):
        the path variance then reads the corrected mask and the correction's is_weights, as
        verl's trainer runs its rollout correction before the advantage."""
        feature = {"stage": [self.name, self.params], "correction": None if correction is None else [correction.name, correction.params]}
        extra = (IS_WEIGHTS,) if self.rollout_is_weights else ()
        return ("logprobs", "sum_pi_squared", *extra, FEATURE + json.dumps(feature, sort_keys=True, separators=(",", ":")))

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


class TIROptimalTokenBaseline(OptimalTokenBaseline):
    tir = True


def light_features(need: str, rows: WrittenRows) -> dict[str, np.ndarray | TokenColumn]:
    """The light columns of need `@token_baseline:{"stage": [NAME, PARAMS], "correction": ...}`
    or `@clipb:{...}` (see FEATURE, CLIPB_FEATURE and needs_after) for `rows`."""
    from rescore.transforms.strategies.registry import create

    feature = json.loads(need.partition(":")[2])
    correction = None if feature["correction"] is None else create(*feature["correction"])
    extra = {"discount": feature["discount"]} if feature.get("discount") is not None else {}
    return create(*feature["stage"]).light_features(rows, correction, **extra)


# --- clipb (catalog.py) ----------------------------------------------------------------------

S_SUM, S2_SUM, S_BAD = "clipb_s", "clipb_s2", "clipb_bad"


def moment_values(s1: np.ndarray, s2: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values (2k,), weights (2k,)) whose weighted sum, sum of squares and total weight are
    exactly s1, s2 and n of each of k rows: m + d and m - d with weight n / 2 each, m = s1 / n,
    d = sqrt(s2 / n - m^2) (rows with n = 0 weigh nothing)."""
    n = np.asarray(n, dtype=np.float64)
    safe = np.maximum(n, 1.0)
    m = np.where(n > 0, s1 / safe, 0.0)
    d = np.where(n > 0, np.sqrt(np.maximum(s2 / safe - m * m, 0.0)), 0.0)
    return np.concatenate([m + d, m - d]), np.concatenate([n / 2, n / 2])


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

    def needs_after(self, correction: Strategy | None) -> tuple[str, ...]:
        feature = {"stage": [self.name, self.params], "correction": None if correction is None else [correction.name, correction.params]}
        return ("logprobs", "entropy", CLIPB_FEATURE + json.dumps(feature, sort_keys=True, separators=(",", ":")))

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
