"""The formulas of the estimators that read the model stage's token statistics: verl's optimal
token baseline (and its TIR variant) and Trinity's clip_B (the registered stages that run them in
the job: token_baseline.py). Pure numpy over flat token arrays (rows concatenated, with
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
"""

from __future__ import annotations

import numpy as np

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


def moment_values(s1: np.ndarray, s2: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(values (2k,), weights (2k,)) whose weighted sum, sum of squares and total weight are
    exactly s1, s2 and n of each of k rows: m + d and m - d with weight n / 2 each, m = s1 / n,
    d = sqrt(s2 / n - m^2) (rows with n = 0 weigh nothing)."""
    n = np.asarray(n, dtype=np.float64)
    safe = np.maximum(n, 1.0)
    m = np.where(n > 0, s1 / safe, 0.0)
    d = np.where(n > 0, np.sqrt(np.maximum(s2 / safe - m * m, 0.0)), 0.0)
    return np.concatenate([m + d, m - d]), np.concatenate([n / 2, n / 2])
