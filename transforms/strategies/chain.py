"""Composition: reward shaping, a filter, an advantage strategy and duplication, applied in that
order.

    reward_variance,grpo,duplicate_informative
        1. reward_variance drops uninformative groups;
        2. grpo scores the rows that are left (its batch std, if any, is over those rows; its
           std_threshold may drop more groups);
        3. duplicate_informative drops groups its own variance filter rejects and marks the
           rest for copying; copies carry the advantages of the group they copy.

Each stage is optional, but a run has at least one and at most one filter, advantage and
duplicate stage. Shaping stages (`dapo_overlong_penalty,reward_shaping,grpo`) come first and
chain: each changes the rewards the one before it left, and every later stage and statistic
sees only the shaped rewards.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from rescore.transforms.strategies.base import (
    ADVANTAGE,
    DUPLICATE,
    FILTER,
    KINDS,
    SHAPE,
    AddsColumns,
    CorrectsTokens,
    DropsGroups,
    GroupedRows,
    MasksRows,
    Shapes,
    Strategy,
    TokenColumn,
    TokenLevel,
)
from rescore.transforms.strategies.reinforce_pp import DISCOUNT_COLUMNS
from rescore.transforms.strategies.registry import ConfigError, create, names, spec
from rescore.transforms.strategies.segments import group_stats, segment_sum
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class ChainScores:
    """What a StrategyChain decided for n rows in G groups."""

    score: Tensor | None
    """(n,) float64, or None when no stage computes advantages."""
    keep: Tensor
    """(n,) bool: the row is written."""
    token_scale: Tensor | None
    """(n,) float64 per-row token factor, or None for 1."""
    group_mean: Tensor
    """(G,) float64 reward mean the advantage stage used (the raw group mean otherwise)."""
    group_std: Tensor
    """(G,) float64 reward std the advantage stage used (the raw group std otherwise)."""
    dropped: dict[str, Tensor]
    """stage kind -> (G,) int64 rows of each group that stage dropped."""
    informative: Tensor | None
    """(G,) bool groups the duplicate stage may copy, or None without one."""
    dropped_by: Tensor | None = None
    """(n,) int8: 0 where the row is kept, else 1 + the index in KINDS of the stage that dropped it."""
    reward: Tensor | None = None
    """(n,) float64 the shaped rewards every stage used, or None without a shaping stage."""
    row_tokens: TokenColumn | None = None
    """The advantage stage's Scores.row_tokens over all n rows (empty for rows it did not
    score), or None."""
    is_norm: Tensor | None = None
    """(n,) float64 the divisor of each row's importance weights (rollout_is_batch_normalize:
    its batch's mean weight), or None."""


@dataclass(frozen=True)
class StrategyChain:
    stages: tuple[Strategy, ...]

    def stage(self, kind: str) -> Strategy | None:
        return next((s for s in self.stages if s.kind == kind), None)

    @property
    def name(self) -> str:
        return ",".join(s.name for s in self.stages)

    @property
    def params(self) -> dict[str, dict[str, Any]]:
        return {s.name: dict(s.params) for s in self.stages}

    @property
    def needs(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(n for s in self.stages for n in self._stage_needs(s)))

    def _stage_needs(self, stage: Strategy) -> tuple[str, ...]:
        """A stage's needs; one whose inputs depend on the run's correction stage says so with
        `needs_after(correction)` (optimal_token_baseline reads the corrected mask)."""
        inside = getattr(stage, "needs_in", None)
        if inside is not None:  # (kl_penalty: what the advantage stage after it needs)
            return inside(self)
        after = getattr(stage, "needs_after", None)
        return after(self.correction) if after is not None else stage.needs

    def token_penalties(self, table_rows) -> np.ndarray | None:
        """(T,) the per-token reward penalties the shaping stages put on the written rows' tokens
        (kl_penalty before a token-level estimator), or None."""
        out = None
        for s in self.shaping:
            pen = getattr(s, "token_penalties", None)
            if pen is not None and self.token_level:
                out = pen(table_rows) if out is None else out + pen(table_rows)
        return out

    @property
    def shaping(self) -> tuple[Shapes, ...]:
        """The shaping stages, in the order they run."""
        return tuple(s for s in self.stages if s.kind == SHAPE)

    def shaped(self, rows: GroupedRows) -> GroupedRows:
        """`rows` with the shaping stages' rewards (the same rows without any)."""
        for s in self.shaping:
            rows = replace(rows, reward=s.shape(rows).to(torch.float64))
        return rows

    @property
    def batch_level(self) -> bool:
        """The run needs per-batch statistics: the advantage stage's, or the correction's batch
        mean weight (rollout_is_batch_normalize)."""
        return self._adv_batch_level or self._normalizes

    @property
    def _adv_batch_level(self) -> bool:
        adv = self.stage(ADVANTAGE)
        return bool(adv is not None and adv.batch_level)

    @property
    def _normalizes(self) -> bool:
        c = self.correction
        return bool(c is not None and getattr(c, "rollout_is_batch_normalize", False))

    @property
    def duplicates(self) -> bool:
        return self.stage(DUPLICATE) is not None

    @property
    def token_level(self) -> bool:
        """The advantage stage computes per-token advantages itself (TokenLevel)."""
        return isinstance(self.stage(ADVANTAGE), TokenLevel)

    @property
    def masking(self) -> MasksRows | None:
        """The filter stage when it masks rows in place (MasksRows with masks set), else None."""
        f = self.stage(FILTER)
        return f if isinstance(f, MasksRows) and f.masks else None

    @property
    def correction(self) -> CorrectsTokens | None:
        """The filter stage when it corrects tokens (rollout_correction), else None."""
        f = self.stage(FILTER)
        return f if isinstance(f, CorrectsTokens) else None

    @property
    def column_stages(self) -> list[AddsColumns]:
        """The stages that write extra output columns, in output order (advantage, filter)."""
        return [s for s in (self.stage(ADVANTAGE), self.stage(FILTER)) if isinstance(s, AddsColumns)]

    @property
    def stage_metrics(self) -> list[tuple[str, str, dict[str, Any], str | None]]:
        """(kind, name, params, dropped-groups counter or None) of each stage, for metrics.json."""
        return [
            (s.kind, s.name, dict(s.params), s.dropped_groups_metric if isinstance(s, DropsGroups) else None)
            for s in self.stages
        ]

    def _filtered(self, rows: GroupedRows) -> Tensor:
        f = self.stage(FILTER)
        if f is None:
            return torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
        return f.score(rows, None).keep

    def _masked(self, rows: GroupedRows) -> tuple[GroupedRows, Tensor | None]:
        """Rows as the advantage stage sees them when the filter masks some (truncated
        responses): their action mask is all zeros, as Trinity zeroes it before the advantage
        step, so they weigh nothing in token-weighted statistics; and the (n,) masked flags."""
        f = self.stage(FILTER)
        if isinstance(f, CorrectsTokens) and "offpolicy_kept" in rows.columns:
            # the action tokens a correction leaves (token-weighted statistics count only those)
            kept = rows.columns["offpolicy_kept"].clamp(min=0).to(rows.action_tokens.dtype)
            rows = replace(rows, action_tokens=torch.where(kept < rows.action_tokens, kept, rows.action_tokens))
        masked = f.masked(rows) if isinstance(f, MasksRows) else None
        if masked is None or not bool(masked.any()):
            return rows, None
        columns = dict(rows.columns)
        for key in DISCOUNT_COLUMNS:
            if key in columns:
                columns[key] = torch.where(masked, torch.zeros_like(columns[key]), columns[key])
        last = None if rows.last_action is None else rows.last_action & ~masked
        return replace(rows, action_tokens=torch.where(masked, torch.zeros_like(rows.action_tokens), rows.action_tokens), last_action=last, columns=columns), masked

    def batch_values(self, rows: GroupedRows, *, shaped: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(batch ids, values, weights) of the batch statistics: the advantage stage's (weights
        >= 0), then, with rollout_is_batch_normalize, each row's weight terms as (numerator,
        -1 - denominator): a negative weight marks the correction's entries, exactly (the
        denominators are token or row counts)."""
        rows = self._masked(rows if shaped else self.shaped(rows))[0]
        parts = []
        if self._adv_batch_level:
            parts.append(self.stage(ADVANTAGE).batch_values(rows.select(self._filtered(rows))))
        if self._normalizes:  # over every row, before the rejection (as verl's input mask)
            batch, num, den = self.correction.norm_values(rows)
            parts.append((batch, num.to(torch.float64), -1.0 - den.to(torch.float64)))
        if len(parts) == 1:
            return parts[0]
        return tuple(torch.cat([p[i].to(parts[0][i].dtype) for p in parts]) for i in range(3))

    def batch_stats(self, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
        """The advantage stage's statistics, then the correction's weight divisor (if any)."""
        if not self._normalizes:
            return self.stage(ADVANTAGE).batch_stats(values, weights)
        import math

        mine = weights < 0
        stats = self.stage(ADVANTAGE).batch_stats(values[~mine], weights[~mine]) if self._adv_batch_level else ()
        return (*stats, self.correction.norm_factor(math.fsum(values[mine]), math.fsum(-1.0 - weights[mine])))

    def score(self, rows: GroupedRows, batch_stats: Tensor | None = None, *, shaped: bool = False) -> ChainScores:
        """Apply the stages in order; `batch_stats` (n, k) as Strategy.score takes it.
        `shaped`: `rows` are already `self.shaped(...)` (the caller explains drops from them)."""
        device = rows.reward.device
        if not shaped:
            rows = self.shaped(rows)
        rows, masked = self._masked(rows)
        keep = self._filtered(rows)
        dropped = {}
        dropped_by = torch.zeros(rows.num_rows, dtype=torch.int8, device=device)
        dropped_by[~keep] = 1
        if self.stage(FILTER) is not None:
            dropped[FILTER] = segment_sum((~keep).to(torch.int64), rows.offsets)
        mean, std = group_stats(rows.reward, rows.offsets)
        score = token_scale = informative = row_tokens = None

        adv = self.stage(ADVANTAGE)
        is_norm = None
        if self._normalizes and batch_stats is not None:
            is_norm, batch_stats = batch_stats[:, -1].clone(), batch_stats[:, :-1]
        if not self._adv_batch_level:
            batch_stats = None
        if adv is not None:
            sub, kept = rows.select(keep), torch.nonzero(keep).flatten()
            stats = batch_stats[keep] if batch_stats is not None else None
            s = adv.score(sub, stats) if sub.num_rows else None
            score = torch.zeros(rows.num_rows, dtype=torch.float64, device=device)
            before = keep.clone()
            if s is not None:
                score[kept] = s.score
                keep[kept] = s.keep
                if s.token_scale is not None:
                    token_scale = torch.ones_like(score)
                    token_scale[kept] = s.token_scale
                if s.row_tokens is not None:  # sub's rows are `kept`, in order: only the lengths change
                    lengths = np.zeros(rows.num_rows, dtype=np.int64)
                    lengths[kept.cpu().numpy()] = np.diff(s.row_tokens.offsets)
                    offsets = np.zeros(rows.num_rows + 1, dtype=np.int64)
                    np.cumsum(lengths, out=offsets[1:])
                    row_tokens = TokenColumn(offsets, s.row_tokens.values[int(s.row_tokens.offsets[0]) :])
                present = segment_sum(before.to(torch.int64), rows.offsets) > 0
                mean[present], std[present] = s.group_mean, s.group_std
            dropped[ADVANTAGE] = segment_sum((before & ~keep).to(torch.int64), rows.offsets)
            dropped_by[before & ~keep] = 2
            if masked is not None:
                token_scale = torch.ones_like(score) if token_scale is None else token_scale
                token_scale[masked] = 0.0

        dup = self.stage(DUPLICATE)
        if dup is not None:
            sub, kept = rows.select(keep), torch.nonzero(keep).flatten()
            before = keep.clone()
            if sub.num_rows:
                keep[kept] = dup.score(sub, None).keep
            dropped[DUPLICATE] = segment_sum((before & ~keep).to(torch.int64), rows.offsets)
            dropped_by[before & ~keep] = 3
            informative = segment_sum(keep.to(torch.int64), rows.offsets) > 0
            copyable = getattr(dup, "copyable", None)  # a batch the stage keeps whole is not copied
            if copyable is not None and sub.num_rows:
                reached = segment_sum(before.to(torch.int64), rows.offsets) > 0
                informative[reached] &= copyable(sub)

        reward = rows.reward if self.shaping else None
        return ChainScores(score, keep, token_scale, mean, std, dropped, informative, dropped_by, reward, row_tokens, is_norm)


def split_param(key: str) -> tuple[str | None, str]:
    """'grpo.epsilon' -> ('grpo', 'epsilon'); 'epsilon' -> (None, 'epsilon')."""
    stage, sep, name = key.rpartition(".")
    return (stage, name) if sep else (None, key)


def build_chain(strategies: list[str], params: Mapping[str, Any], *, load_math: bool = True) -> StrategyChain:
    """A chain from stage names in order and parameters, each `name` or `stage.name`.

    An unqualified parameter goes to the one stage that has it; one that two stages have
    must be qualified. Raises ConfigError on anything off. `load_math`: registry.create's.
    """
    if not strategies:
        raise ConfigError(f"no strategy (`rescore strategies` lists all {len(names())})")
    specs = [spec(n) for n in strategies]
    if len(set(strategies)) != len(strategies):
        raise ConfigError(f"a strategy appears twice in {','.join(strategies)}")
    kinds = [s.kind for s in specs]
    for kind in KINDS:
        if kinds.count(kind) > 1:
            same = [s.name for s in specs if s.kind == kind]
            raise ConfigError(f"at most one {kind} strategy per run, got {', '.join(same)}")
    order = (SHAPE, *KINDS)
    if kinds != sorted(kinds, key=order.index):
        raise ConfigError(
            f"strategies run in the order filter, advantage, duplicate (reward shaping first); got {','.join(strategies)}"
            f" ({', '.join(kinds)})"
        )
    per_stage: dict[str, dict[str, Any]] = {s.name: {} for s in specs}
    flat: dict[str, Any] = {}
    for key, value in params.items():
        # YAML may nest them: {grpo: {epsilon: 1e-6}} is grpo.epsilon.
        if isinstance(value, Mapping) and key in per_stage:
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    for key, value in flat.items():
        stage, name = split_param(key)
        if stage is not None:
            if stage not in per_stage:
                raise ConfigError(f"parameter {key!r} names strategy {stage!r}, which this run does not use ({','.join(strategies)})")
            per_stage[stage][name] = value
            continue
        owners = [s.name for s in specs if name in s.defaults]
        if len(owners) > 1:
            raise ConfigError(f"parameter {key!r} belongs to {' and '.join(owners)}; write it as {owners[0]}.{key}")
        if not owners:
            valid = sorted({f"{s.name}.{p}" if len(specs) > 1 else p for s in specs for p in s.defaults})
            close = difflib.get_close_matches(name, sorted({p for s in specs for p in s.defaults}), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(
                f"unknown parameter {key!r} for strategy {','.join(strategies)!r}{hint}; valid parameters: {', '.join(valid) or '(none)'}"
            )
        per_stage[owners[0]][name] = value
    chain = StrategyChain(tuple(create(s.name, per_stage[s.name], load_math=load_math) for s in specs))
    for stage in chain.stages:  # rules across stages (e.g. two sources of importance weights)
        check = getattr(stage, "check_chain", None)
        if check is not None:
            check(chain)
    return chain


def chain_of(strategy: str | list[str], params: Mapping[str, Any] | None = None) -> StrategyChain:
    """Convenience: 'grpo' or 'reward_variance,grpo' or a list of names."""
    names_ = strategy.split(",") if isinstance(strategy, str) else list(strategy)
    return build_chain([n.strip() for n in names_ if n.strip()], params or {})

