"""Reward shaping: the `shape` stage, which changes each row's reward before any filter or
statistic sees it (chain.py: shaping strategies run first, in the order given, each on the
rewards the previous one left). The written `reward` is the shaped one; the input's is kept as
`reward_original`.

    reward_shaping          r <- r op weight * x   (op add / sub / mul / div; Trinity's
                            RewardShapingMapper: a missing x, or a zero divisor, leaves r)
                            r <- clip(scale * r + bias, clip_min, clip_max)
    dapo_overlong_penalty   r <- r + p(L),  e = max_resp_len - overlong_buffer_len,
                            p(L) = 0 for L <= e, (e - L) / overlong_buffer_len * penalty_factor
                            up to max_resp_len, -penalty_factor beyond (DAPO, arXiv 2503.14476;
                            verl DAPORewardManager, Trinity MathDAPORewardFn)
    truncated_reward        truncated rows: r <- value (mode=set) or r + value (mode=add)
    kl_penalty              r <- r - kl_coef * sum_t m_t kl_t (verl's apply_kl_penalty with a fixed
                            coefficient, as its outcome estimators sum the token rewards); before
                            verl's reinforce_plus_plus the penalties stay per token (reinforce_pp.py)
    reward_sum              r <- sum_k w_k * x_k over named reward columns

A shaping strategy is a `Shapes` (base.py): `shape(rows) -> (n,) float64` new rewards from the
grouped light rows, so one that needs group statistics (a KL or length term relative to the
group) has them too. What it needs from a row's tokens (the response length) is computed where
the row is read, as a light column; tokens never cross the shuffle.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from rescore.transforms.strategies.base import ADVANTAGE, GroupedRows, Scores
from rescore.transforms.strategies.features import Feature, FeatureRows, OptionalColumn
from rescore.transforms.strategies.filters import truncated_flags
from rescore.transforms.strategies.registry import SHAPE, Column, ConfigError, StrategyParams, param, register
from rescore.transforms.strategies.segments import group_stats
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def column_op(reward: Tensor, x: Tensor, op: str, weight: float) -> Tensor:
    """(n,) Trinity's r op weight * x; where x is NaN (missing), or op is div and weight * x is
    0, r stays."""
    w = weight * x
    if op == "add":
        out = reward + w
    elif op == "sub":
        out = reward - w
    elif op == "mul":
        out = reward * w
    else:
        out = reward / torch.where(w == 0, torch.ones_like(w), w)
        out = torch.where(w == 0, reward, out)
    return torch.where(torch.isnan(x), reward, out)


def affine_clip(reward: Tensor, scale: float, bias: float, low: float | None, high: float | None) -> Tensor:
    """(n,) clip(scale * r + bias, low, high); a None bound does not clip."""
    out = reward * scale + bias if (scale != 1.0 or bias != 0.0) else reward
    if low is not None or high is not None:
        out = out.clamp(min=low, max=high)
    return out


def overlong_penalty(length: Tensor, max_resp_len: int, buffer_len: int, factor: float) -> Tensor:
    """(n,) float64 DAPO's soft overlong punishment of responses of `length` (n,) tokens:
    0 up to max_resp_len - buffer_len, then linear down to -factor at max_resp_len, and
    -factor beyond it."""
    expected = max_resp_len - buffer_len
    length = length.to(torch.float64)
    soft = (expected - length) / buffer_len * factor
    return torch.where(length <= expected, torch.zeros_like(length), torch.where(length > max_resp_len, torch.full_like(length, -factor), soft))


class _Shaping:
    """What every shaping strategy shares: no batch statistics, and score() for a chain that
    runs it as its only stage (every row kept, no advantage)."""

    batch_level = False

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return Scores(None, keep, *group_stats(rows.reward, rows.offsets))


@dataclass(frozen=True)
class RewardShapingParams(StrategyParams):
    stats_key: Column | None = param(
        None,
        help="Trinity's column operation: the number column it applies (a missing or null value leaves the reward "
             "as it is, as Trinity skips a missing info key); none: no column operation",
    )
    op_type: Literal["add", "sub", "mul", "div"] = param(
        "add",
        help="`add`: r + w·x, `sub`: r − w·x, `mul`: r · w·x, `div`: r / (w·x) (a division by 0 keeps r)",
    )
    weight: float = param(1.0, help="w of the column operation")
    scale: float = param(1.0, help="r ← scale·r + bias, after the column operation")
    bias: float = param(0.0, help="r ← scale·r + bias, after the column operation")
    clip_min: float | None = param(None, help="lower clip of the shaped reward (null: none)")
    clip_max: float | None = param(None, help="upper clip of the shaped reward (null: none)")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        low, high = values["clip_min"], values["clip_max"]
        if low is not None and high is not None and not low <= high:
            raise ConfigError(f"{strategy}: needs clip_min <= clip_max, got {low!r} > {high!r}")


@register("reward_shaping", kind=SHAPE, summary="r <- clip(scale * (r op weight * column) + bias, clip_min, clip_max); op add|sub|mul|div (Trinity RewardShapingMapper)")
class RewardShaping(_Shaping, RewardShapingParams):
    @property
    def needs(self) -> tuple[str, ...]:
        return () if self.stats_key is None else (OptionalColumn(self.stats_key),)

    def shape(self, rows: GroupedRows) -> Tensor:
        reward = rows.reward
        if self.stats_key is not None:
            reward = column_op(reward, rows.columns[self.stats_key].to(torch.float64), self.op_type, self.weight)
        return affine_clip(reward, self.scale, self.bias, self.clip_min, self.clip_max)


@dataclass(frozen=True)
class DAPOOverlongPenaltyParams(StrategyParams):
    max_resp_len: int = param(
        20480, minimum=1,
        help="the generation's maximum response length in tokens (DAPO: 16384 expected + 4096 buffer)",
    )
    overlong_buffer_len: int = param(
        4096, minimum=1,
        help="the buffer before max_resp_len in which the penalty grows linearly (Trinity's cache_length)",
    )
    penalty_factor: float = param(1.0, minimum=0.0, help="the penalty at max_resp_len and beyond")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if not values["max_resp_len"] >= values["overlong_buffer_len"]:
            raise ConfigError(
                f"{strategy}: needs max_resp_len >= overlong_buffer_len, got {values['max_resp_len']} < {values['overlong_buffer_len']}"
            )


@register("dapo_overlong_penalty", kind=SHAPE, summary="r <- r + min(0, (max_resp_len - overlong_buffer_len - length) / overlong_buffer_len) * penalty_factor, "
    "at least -penalty_factor (DAPO soft overlong punishment)")
class DAPOOverlongPenalty(_Shaping, DAPOOverlongPenaltyParams):
    needs = ()

    def shape(self, rows: GroupedRows) -> Tensor:
        return rows.reward + overlong_penalty(rows.response_length, self.max_resp_len, self.overlong_buffer_len, self.penalty_factor)


@dataclass(frozen=True)
class TruncatedRewardParams(StrategyParams):
    truncate_status_key: Column = param(
        "truncate_status",
        help="the column whose value `response_truncated` (or true) flags a truncated response",
    )
    value: float = param(0.0, help="the new reward (mode=set) or what is added to it (mode=add)")
    mode: Literal["set", "add"] = param("set", help="`set`: r ← value; `add`: r ← r + value")


@register("truncated_reward", kind=SHAPE, summary="truncated responses (truncate_status) get reward `value` (mode=set, ProRL/SkyRL/AReaL: 0) or r + value (mode=add)")
class TruncatedReward(_Shaping, TruncatedRewardParams):
    @property
    def needs(self) -> tuple[str, ...]:
        return (self.truncate_status_key,)

    def shape(self, rows: GroupedRows) -> Tensor:
        values = rows.columns[self.truncate_status_key]
        flags = truncated_flags(values, not values.is_floating_point())
        new = torch.full_like(rows.reward, self.value) if self.mode == "set" else rows.reward + self.value
        return torch.where(flags, new, rows.reward)


@dataclass(frozen=True)
class RewardSumParams(StrategyParams):
    reward_keys: tuple[Column, ...] = param(
        ("reward",),
        help="the number columns summed (`reward` may be one of them); a null rejects the row",
    )
    reward_weights: tuple[float, ...] | None = param(None, help="w_k, one per column (null: all 1)")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        keys, weights = values["reward_keys"], values["reward_weights"]
        if not keys:
            raise ConfigError(f"{strategy}: 'reward_keys' names no column")
        if weights is not None and len(weights) != len(keys):
            raise ConfigError(f"{strategy}: 'reward_weights' has {len(weights)} weights for {len(keys)} reward columns")


@register("reward_sum", kind=SHAPE, summary="r <- sum_k w_k * column_k over named reward columns (weights default 1)")
class RewardSum(_Shaping, RewardSumParams):
    @property
    def needs(self) -> tuple[Column, ...]:
        return self.reward_keys

    def shape(self, rows: GroupedRows) -> Tensor:
        weights = self.reward_weights or (1.0,) * len(self.reward_keys)
        out = torch.zeros_like(rows.reward)
        for key, w in zip(self.reward_keys, weights):
            out = out + w * rows.columns[key].to(torch.float64)
        return out


def kl_values(logprobs: np.ndarray, ref_logprobs: np.ndarray, kind: str) -> np.ndarray:
    """(T,) verl 0.9.1 `kl_penalty_forward` per token: k1 logprobs - ref; abs |logprobs - ref|;
    k2 (mse) (logprobs - ref)^2 / 2; k3 (low_var_kl) exp(d) - d - 1 with d = ref - logprobs
    clamped to [-20, 20], the result clamped to [-10, 10]."""
    lp, ref = np.asarray(logprobs, dtype=np.float64), np.asarray(ref_logprobs, dtype=np.float64)
    if kind in ("kl", "k1"):
        return lp - ref
    if kind == "abs":
        return np.abs(lp - ref)
    if kind in ("mse", "k2"):
        return 0.5 * np.square(lp - ref)
    d = np.clip(ref - lp, -20.0, 20.0)
    return np.clip(np.exp(d) - d - 1.0, -10.0, 10.0)


@dataclass(frozen=True)
class KLPenaltyParams(StrategyParams):
    kl_penalty: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = param(
        "kl",
        help="verl's estimator of kl_t from d = logprobs − ref_logprobs: `kl`/`k1`: d; `abs`: |d|; `mse`/`k2`: "
             "d²/2; `low_var_kl`/`k3`: exp(−d') + d' − 1, d' = clamp(d, −20, 20), clamped to [−10, 10]",
    )
    kl_coef: float = param(0.001, minimum=0.0, help="r ← r − kl_coef · Σ_t m_t kl_t (a fixed coefficient)")
    ref_logprobs: Column = param("ref_logprobs", help="the reference model's log-probs column (a name ending in `ref_logprobs`)")

    @classmethod
    def check(cls, values: dict[str, Any], strategy: str) -> None:
        if not values["ref_logprobs"].endswith("ref_logprobs"):
            raise ConfigError(f"{strategy}: ref_logprobs names the reference model's log-prob column, ending in 'ref_logprobs', got {values['ref_logprobs']!r}")


@register("kl_penalty", kind=SHAPE, summary="r <- r - kl_coef * sum over action tokens of kl(logprobs, ref_logprobs) (verl's use_kl_in_reward, fixed coefficient)")
class KLPenalty(_Shaping, KLPenaltyParams):
    """verl's KL in the reward (algorithm.use_kl_in_reward) with a fixed kl_coef: each row's
    token rewards less kl_coef * kl_t on its action tokens. verl's outcome estimators (grpo,
    rloo, ...) read the sum of the token rewards, so the row's reward becomes
    r - kl_coef * sum_t m_t kl_t; the sum is computed where the row is read (x.kl_sum)."""

    @property
    def needs(self) -> tuple[str, ...]:
        return self._needs(None)

    def needs_in(self, chain) -> tuple[str, ...]:
        """With verl's reinforce_plus_plus after it, the features its batch statistics need."""
        return self._needs(_token_partner(chain))

    def _needs(self, gamma: float | None) -> tuple:
        return ("logprobs", self.ref_logprobs, KLSums(self, gamma))

    def _masked_kl(self, rows) -> np.ndarray:
        """(T,) kl_t * m_t over the response tokens."""
        _, mask = rows.response()
        lp, ref = rows.tokens("logprobs"), rows.tokens(self.ref_logprobs)
        # The rows are valid: logprobs and ref_logprobs line up with the response (validation).
        kl = kl_values(lp.values[int(lp.offsets[0]) : int(lp.offsets[-1])], ref.values[int(ref.offsets[0]) : int(ref.offsets[-1])], self.kl_penalty)
        return kl * mask

    def token_penalties(self, rows) -> np.ndarray:
        """(T,) kl_coef * kl_t * m_t over the response tokens: what verl subtracts from each
        token's reward."""
        return self.kl_coef * self._masked_kl(rows)

    def light_features(self, rows, correction=None, discount: float | None = None) -> dict[str, np.ndarray]:
        """x.kl_sum: sum_t m_t kl_t; with `discount` (verl's reinforce_plus_plus gamma after it)
        also x.kl_pen (kl_coef * kl_sum) and x.kl_a, x.kl_c, x.kl_k2: the sums over action
        tokens of K_t, c_t K_t and K_t^2, K_t the discounted penalty to go (reinforce_pp.py)."""
        from rescore.transforms.strategies.flat import flat_segment_sum
        from rescore.transforms.strategies.reinforce_pp import VERL, penalty_returns, token_discounts

        lengths, mask = rows.response()
        lengths = np.asarray(lengths, dtype=np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        kl = self._masked_kl(rows)
        out = {"kl_sum": flat_segment_sum(kl, offsets)}
        if discount is not None:
            pen = self.kl_coef * kl
            last = np.zeros(len(lengths), dtype=bool)
            nonempty = lengths > 0
            last[nonempty] = mask[offsets[1:][nonempty] - 1] != 0
            c = token_discounts(float(discount), VERL, lengths, mask, last) * mask
            k = penalty_returns(pen, mask, lengths, float(discount))
            out.update(
                kl_pen=flat_segment_sum(pen, offsets), kl_a=flat_segment_sum(k * mask, offsets),
                kl_c=flat_segment_sum(c * k * mask, offsets), kl_k2=flat_segment_sum(k * k * mask, offsets),
            )
        return out

    def shape(self, rows: GroupedRows) -> Tensor:
        return rows.reward - self.kl_coef * rows.columns["kl_sum"]

    def check_chain(self, chain) -> None:
        if not chain.token_level:
            return
        adv = chain.stage(ADVANTAGE)
        if _token_partner(chain) is None:
            raise ConfigError(
                f"{self.name} before {adv.name}: of the token-level estimators only verl's reinforce_plus_plus takes "
                "the KL per token; use it, or an outcome estimator (grpo, rloo, reinforce_plus_plus_baseline, ...), "
                "which reads r - kl_coef * sum of kl"
            )
        if chain.correction is not None or chain.masking is not None:
            raise ConfigError(
                f"{self.name} before {adv.name}: not with a filter that rewrites or zeroes the action mask "
                f"({chain.stage('filter').name}) yet"
            )


@dataclass(frozen=True)
class KLSums(Feature):
    """Need of kl_penalty `stage`: light column x.kl_sum, each row's sum over action tokens of
    the KL estimate between logprobs and ref_logprobs; with `discount` (the gamma of verl's
    reinforce_plus_plus after it) also x.kl_pen, x.kl_a, x.kl_c and x.kl_k2
    (KLPenalty.light_features)."""

    stage: KLPenalty
    discount: float | None = None

    def light(self, rows: FeatureRows) -> dict[str, np.ndarray]:
        return self.stage.light_features(rows, None, self.discount)


def _token_partner(chain) -> float | None:
    """gamma of verl's reinforce_plus_plus when it is the chain's advantage stage, else None."""
    from rescore.transforms.strategies.reinforce_pp import VerlReinforcePlusPlus

    adv = chain.stage(ADVANTAGE)
    return float(adv.gamma) if isinstance(adv, VerlReinforcePlusPlus) else None
