"""REINFORCE++ without a group baseline (arXiv 2501.03262): per-token discounted returns,
whitened over the batch's action tokens.

The outcome reward r sits on the last response token; the return of token t is r * c_t and

    advantages[t] = (r * c_t - mu) / sqrt(var + 1e-8) * action_mask[t]

with mu and var (Bessel-corrected) over every action token of the batch (`masked_whiten`).
The two references differ only in c_t when the mask has zeros (multi-turn observations):

    reinforceplusplus   (Trinity-RFT 0.6.0 `REINFORCEPLUSPLUSAdvantageFn`)
                        c_t = gamma^(L - 1 - t): every position discounts, masked or not
    reinforce_plus_plus (verl 0.9.1 `compute_reinforce_plus_plus_outcome_advantage`)
                        c_t = gamma^(action tokens after t): observation spans are skipped; a
                        reward on a masked last token is lost (all returns 0)

With gamma = 1 and an all-ones mask both are (r - mu) / sqrt(var + 1e-8) on every token.

The batch statistics need, per row, A = sum_t m_t c_t, B = sum_t m_t c_t^2 and W = sum_t m_t;
they are carried to the batch as two weighted pseudo-values (r B / A with weight A^2 / B, and
0 with weight W - A^2 / B) whose weighted sum, sum of squares and total weight are exactly
r A, r^2 B and W, so `whiten_stats` computes them with exactly rounded sums. Scoring a row
stores 1 / sigma as its score and mu as its token scale; the token values are computed from
the row's own action mask when the row is written (`token_values`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.base import GroupedRows, Scores, WrittenRows
from rescore.transforms.strategies.baselines import WHITEN_EPSILON
from rescore.transforms.strategies.features import Feature, FeatureRows
from rescore.transforms.strategies.flat import action_means, flat_segment_sum
from rescore.transforms.strategies.registry import ADVANTAGE, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats
from rescore.transforms.strategies.tensors import torch
from rescore.transforms.strategies.token_baseline_math import moment_values

if TYPE_CHECKING:
    from torch import Tensor

TRINITY, VERL = "trinity", "verl"
DISCOUNT_COLUMNS = ("discount_a", "discount_b")
"""The light columns of a DiscountSums need: sum of c_t, sum of c_t^2 over a row's action tokens."""


def geometric_sum(ratio: float, count: Tensor) -> Tensor:
    """(n,) sum_{k < count} ratio^k, float64."""
    count = count.to(torch.float64)
    if ratio == 1.0:
        return count
    return (1.0 - torch.pow(torch.full_like(count, ratio), count)) / (1.0 - ratio)


def discount_sums(gamma: float, mode: str, length: Tensor, actions: Tensor, last_action: Tensor) -> tuple[Tensor, Tensor]:
    """(A, B) per row: sum over action tokens of c_t and of c_t^2 (see the module doc).

    Trinity with gamma != 1 needs every action token's distance to the end of the response, so
    rows whose mask has zeros cannot be summarised by (length, actions) and are refused.
    """
    actions = actions.to(torch.float64)
    if mode == TRINITY:
        if gamma == 1.0:
            return actions, actions
        if bool((actions != length.to(torch.float64)).any()):
            raise ValueError(
                "reinforceplusplus with gamma != 1 on rows whose action_mask has zeros needs each token's "
                "position in the batch statistics, which rescore does not carry; use gamma=1, or "
                "reinforce_plus_plus (verl's discounting skips observation tokens)"
            )
        return geometric_sum(gamma, length), geometric_sum(gamma * gamma, length)
    zero = torch.zeros_like(actions)
    a = torch.where(last_action, geometric_sum(gamma, actions), zero)
    b = torch.where(last_action, geometric_sum(gamma * gamma, actions), zero)
    return a, b


def pseudo_values(reward: Tensor, a: Tensor, b: Tensor, w: Tensor) -> tuple[Tensor, Tensor]:
    """(values (2n,), weights (2n,)) with sum(w v) = r A, sum(w v^2) = r^2 B, sum(w) = W."""
    has = a > 0
    safe_a = torch.where(has, a, torch.ones_like(a))
    safe_b = torch.where(has, b, torch.ones_like(b))
    v1 = torch.where(has, reward * (safe_b / safe_a), torch.zeros_like(reward))  # exactly r when B = A
    w1 = torch.where(has, safe_a * safe_a / safe_b, torch.zeros_like(a))
    w2 = torch.clamp(w.to(torch.float64) - w1, min=0.0)
    return torch.cat([v1, torch.zeros_like(v1)]), torch.cat([w1, w2])


def token_discounts(gamma: float, mode: str, lengths: np.ndarray, mask: np.ndarray, last_action: np.ndarray) -> np.ndarray:
    """(T,) c_t for flat tokens of rows with `lengths` (n,) and flat 0/1 `mask` (T,)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    row = np.repeat(np.arange(len(lengths)), lengths)
    position = np.arange(len(mask)) - offsets[:-1][row]
    if mode == TRINITY:
        exponent = (lengths[row] - 1 - position).astype(np.float64)
        return np.power(gamma, exponent)
    # Action tokens after t: the row's action tokens minus those up to and including t.
    inclusive = np.cumsum(mask) - np.concatenate([[0], np.cumsum(mask)])[offsets[:-1]][row]
    after = flat_segment_sum(mask, offsets)[row] - inclusive
    c = np.power(gamma, after.astype(np.float64)) * mask
    return np.where(last_action[row], c, 0.0)


def penalty_returns(penalty: np.ndarray, mask: np.ndarray, lengths: np.ndarray, gamma: float) -> np.ndarray:
    """(T,) K_t: verl's reinforce_plus_plus returns of per-token rewards `penalty` (T,) alone:
    on an action token t, penalty_t + gamma * K of the next action token; 0 on the others
    (observation tokens pass the running return through and drop their own reward)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if not len(lengths) or not offsets[-1]:
        return np.zeros(int(offsets[-1]), dtype=np.float64)
    row = np.repeat(np.arange(len(lengths)), lengths)
    col = np.arange(int(offsets[-1])) - offsets[:-1][row]
    p = np.zeros((len(lengths), int(lengths.max())))
    m = np.zeros_like(p)
    p[row, col], m[row, col] = penalty, mask
    out = np.zeros_like(p)
    running = np.zeros(len(lengths))
    for t in range(p.shape[1] - 1, -1, -1):  # verl's recurrence, one position at a time
        new = p[:, t] + gamma * running
        out[:, t] = new * m[:, t]
        running = new * m[:, t] + running * (1 - m[:, t])
    return out[row, col]


def reinforce_pp_tokens(
    reward: np.ndarray, inv_sigma: np.ndarray, mu: np.ndarray, lengths: np.ndarray, mask: np.ndarray, gamma: float, mode: str,
    penalty: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(flat token advantages (T,), per-row mean over action tokens (n,)), float64. `penalty`
    (T,): per-token reward penalties (kl_penalty; verl mode), whose returns are subtracted."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    row = np.repeat(np.arange(len(lengths)), lengths)
    ends = offsets[1:]
    last_action = np.zeros(len(lengths), dtype=bool)
    nonempty = ends > offsets[:-1]
    last_action[nonempty] = mask[ends[nonempty] - 1] != 0
    c = token_discounts(gamma, mode, lengths, mask, last_action)
    returns = reward[row] * c
    if penalty is not None:
        returns = returns - penalty_returns(penalty, mask, lengths, gamma)
    values = (returns - mu[row]) * inv_sigma[row] * mask
    return values, action_means(values, mask, offsets)


@dataclass(frozen=True)
class DiscountSums(Feature):
    """Need (REINFORCE++ with Trinity's discounting, gamma != 1): light columns DISCOUNT_COLUMNS,
    each row's sums over its action tokens of c_t and c_t^2 (token_discounts)."""

    gamma: float
    mode: str

    def light(self, rows: FeatureRows) -> dict[str, np.ndarray]:
        lengths = np.asarray(rows.response_lengths(), dtype=np.int64)
        mask = rows.action_values()
        values = np.asarray(mask, dtype=np.float64) if mask is not None else np.ones(int(lengths.sum()))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        last = np.zeros(len(lengths), dtype=bool)
        nonempty = lengths > 0
        last[nonempty] = values[offsets[1:][nonempty] - 1] != 0
        c = token_discounts(self.gamma, self.mode, lengths, values, last) * values
        return dict(zip(DISCOUNT_COLUMNS, (flat_segment_sum(c, offsets), flat_segment_sum(c * c, offsets))))


@dataclass(frozen=True)
class ReinforcePlusPlusParams(StrategyParams):
    gamma: float = param(
        1.0, minimum=0.0, between=(0.0, 1.0),
        help="discount of the token returns, 0 ≤ gamma ≤ 1 (verl reads `algorithm.gamma`)",
    )


class ReinforcePlusPlus(ReinforcePlusPlusParams):
    """REINFORCE++ with discounting `mode` (TRINITY or VERL, see the module doc)."""

    mode = TRINITY
    batch_level = True

    @property
    def needs(self) -> tuple:
        # Trinity discounts masked positions too, so with gamma != 1 the sums depend on where
        # the action tokens are: computed per row when the row is read.
        return (DiscountSums(float(self.gamma), self.mode),) if self.mode == TRINITY and self.gamma != 1.0 else ()

    def _sums(self, rows: GroupedRows) -> tuple[Tensor, Tensor]:
        if DISCOUNT_COLUMNS[0] in rows.columns:
            return tuple(rows.columns[c] for c in DISCOUNT_COLUMNS)
        length = rows.response_length if rows.response_length is not None else rows.action_tokens
        last = rows.last_action if rows.last_action is not None else rows.action_tokens > 0
        return discount_sums(self.gamma, self.mode, length, rows.action_tokens, last)

    def batch_values(self, rows: GroupedRows) -> tuple[Tensor, Tensor, Tensor]:
        a, b = self._sums(rows)
        if "kl_a" in rows.columns:  # kl_penalty before it: returns r c_t - K_t (shaping.py)
            c = rows.columns
            r = rows.reward + c["kl_pen"]  # the outcome reward, before the KL the shaping took off
            s1 = r * a - c["kl_a"]
            s2 = r * r * b - 2.0 * r * c["kl_c"] + c["kl_k2"]
            values, weights = moment_values(s1.cpu().numpy(), s2.cpu().numpy(), rows.action_tokens.cpu().numpy())
            values, weights = torch.from_numpy(values), torch.from_numpy(weights)
        else:
            values, weights = pseudo_values(rows.reward, a, b, rows.action_tokens)
        return torch.cat([rows.batch, rows.batch]), values, weights

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        from rescore.transforms.strategies.estimators import exact_whiten_stats

        return exact_whiten_stats(values, weights)

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        self._sums(rows)  # refuses what the statistics could not describe
        mu, var = batch_stats[:, 0], batch_stats[:, 1]
        inv_sigma = 1.0 / torch.sqrt(var + WHITEN_EPSILON)
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        # score = 1 / sigma and token_scale = mu; token_values turns them into token advantages.
        return Scores(inv_sigma.clone(), keep, *group_stats(rows.reward, rows.offsets), token_scale=mu.clone())

    def token_values(
        self, rows: WrittenRows, score: np.ndarray, row_value: np.ndarray, token_penalties: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(flat advantages, per-row score) for the written rows; `score` is 1 / sigma and
        `row_value` mu / sigma of each row's batch, as score() left them; `token_penalties`
        (T,): kl_penalty's per-token penalties (the written reward has their sum taken off)."""
        lengths, mask = rows.response()
        reward = np.asarray(rows.scalar("reward"), dtype=np.float64)
        if token_penalties is not None:
            offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
            np.cumsum(lengths, out=offsets[1:])
            reward = reward + flat_segment_sum(np.asarray(token_penalties, dtype=np.float64), offsets)
        inv_sigma = np.asarray(score, dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            mu = np.where(inv_sigma != 0, np.asarray(row_value, dtype=np.float64) / inv_sigma, 0.0)
        return reinforce_pp_tokens(reward, inv_sigma, mu, lengths, mask, self.gamma, self.mode, token_penalties)


@register("reinforceplusplus", kind=ADVANTAGE, summary="REINFORCE++ (Trinity): discounted token returns (gamma), whitened over the batch's action tokens")
class TrinityReinforcePlusPlus(ReinforcePlusPlus):
    mode = TRINITY


@register("reinforce_plus_plus", kind=ADVANTAGE, summary="REINFORCE++ (verl): discounted returns over action tokens (gamma), whitened over the batch")
class VerlReinforcePlusPlus(ReinforcePlusPlus):
    mode = VERL
