"""GiGPO: Group-in-Group Policy Optimization for multi-step agents (Feng et al., arXiv
2505.10978; Trinity-RFT 0.6.0 `GiGPOAdvantageFn`, trinity/algorithm/advantage_fn/gigpo_advantage.py).

For each task group, each run's steps in `step` order:
    r_t     the step reward: the `step_reward_key` column where the run has it on any step (a
            null on one of its steps is 0), else (Trinity's fallback) the run's last-step
            `reward` on its last step, 0 elsewhere; `step_reward_key=null` always uses the
            fallback. Trinity decides per run whether the info key is present; a null in the
            column is a missing key (rows/keys.py keeps it NaN across the shuffle);
    R_t     = sum_{k >= t} gamma^(k - t) r_k, the discounted return of step t;
    A_E     episode advantage of the run: normalise(sum_t r_t) over the group's runs;
    A_S     step advantage: normalise(R_t) over the steps that share an anchor state (the
            `env_state_hash_key` column); 0 for an anchor seen once and for a row without a
            state (null);
    score   = A_E + omega * A_S, on every token of the step.
normalise(x) = (x - mean) / (d + epsilon), d = std (ddof=1) with fnorm="std", else 1; a set of
one value has mean 0 and d 1.

`anchor_scope` says where a step finds the other steps of its anchor state: `batch` (the
default, Trinity's GiGPOAdvantageFn) pools every row of the batch that shares a state hash,
across tasks; `task` keeps anchor groups inside the task group (the paper forms step groups
among one task's trajectories). A state hash that also names the task gives the same groups
either way. With `batch`, all rows of a batch go to one shuffle bucket (the WHOLE_BATCH need).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rescore.transforms.strategies.base import GroupedRows, Scores
from rescore.transforms.strategies.features import OptionalColumn
from rescore.transforms.strategies.registry import (
    ADVANTAGE,
    WHOLE_BATCH,
    Column,
    StrategyParams,
    param,
    register,
)
from rescore.transforms.strategies.segments import group_stats, per_row, run_offsets, segment_sum
from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def normalise(values: Tensor, offsets: Tensor, *, fnorm: str, epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    """(scores (n,), mean (G,), denominator (G,)) of each segment, Trinity's `_normalize`."""
    mean, std = group_stats(values, offsets)
    denom = std if fnorm == "std" else torch.ones_like(std)
    return (values - per_row(mean, offsets)) / (per_row(denom, offsets) + epsilon), mean, denom


def discounted_returns(step_reward: Tensor, runs: Tensor, gamma: float) -> Tensor:
    """(n,) R_t within each run (rows sorted by run then step; runs (R + 1,) boundaries)."""
    n = step_reward.numel()
    out = step_reward.clone()
    if n == 0:
        return out
    run_of = per_row(torch.arange(runs.numel() - 1, device=step_reward.device), runs)
    from_end = runs[1:][run_of] - 1 - torch.arange(n, device=step_reward.device)
    for k in range(1, int(from_end.max()) + 1):
        at = torch.nonzero(from_end == k).flatten()
        out[at] = step_reward[at] + gamma * out[at + 1]
    return out


def gigpo_scores(
    rows: GroupedRows, anchor: Tensor, step_reward: Tensor | None, *, omega: float, gamma: float, fnorm: str, epsilon: float,
    anchor_scope: str = "batch",
) -> Scores:
    """anchor (n,): int64 state hashes (0: no state) or float64 values (NaN: no state);
    step_reward (n,) float64 with NaN where a row has none, or None for the fallback."""
    runs = run_offsets(rows.run, rows.offsets)
    last_of_run = torch.zeros(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
    last_of_run[runs[1:] - 1] = True
    fallback = torch.where(last_of_run, rows.reward, torch.zeros_like(rows.reward))
    if step_reward is None:
        step_reward = fallback
    else:
        # Trinity: a run with the key on any step uses the column (0 where missing); a run
        # without it falls back to its last-step reward.
        present = ~torch.isnan(step_reward)
        run_has = per_row(segment_sum(present, runs) > 0, runs)
        step_reward = torch.where(run_has, torch.nan_to_num(step_reward, nan=0.0), fallback)
    returns = discounted_returns(step_reward, runs, gamma)

    # Episode level: one value per run, normalised over the group's runs.
    episode = segment_sum(step_reward, runs)
    group_runs = torch.searchsorted(runs[:-1], rows.offsets)
    a_e, mean, denom = normalise(episode, group_runs, fnorm=fnorm, epsilon=epsilon)

    # Step level: rows of one task group (or one batch) with the same anchor state.
    if anchor_scope == "task":
        group = per_row(torch.arange(rows.num_groups, device=anchor.device), rows.offsets)
    else:
        group = rows.batch
    stateless = torch.isnan(anchor) if anchor.is_floating_point() else anchor == 0
    anchor = torch.where(stateless, torch.zeros_like(anchor), anchor)
    order = torch.sort(anchor, stable=True).indices
    order = order[torch.sort(group[order], stable=True).indices]
    g_sorted, a_sorted = group[order], anchor[order]
    starts = torch.ones(rows.num_rows, dtype=torch.bool, device=anchor.device)
    if rows.num_rows > 1:
        starts[1:] = (g_sorted[1:] != g_sorted[:-1]) | (a_sorted[1:] != a_sorted[:-1])
    bounds = torch.cat([torch.nonzero(starts).flatten(), torch.tensor([rows.num_rows], device=anchor.device)])
    a_s_sorted, _, _ = normalise(returns[order], bounds, fnorm=fnorm, epsilon=epsilon)
    # A row without a state id (a null) joins no anchor group, as in Trinity.
    shared = per_row((bounds[1:] - bounds[:-1]) > 1, bounds) & ~stateless[order]
    a_s = torch.zeros_like(returns)
    a_s[order] = torch.where(shared, a_s_sorted, torch.zeros_like(a_s_sorted))

    score = per_row(a_e, runs) + omega * a_s
    keep = torch.ones(rows.num_rows, dtype=torch.bool, device=rows.reward.device)
    return Scores(score, keep, mean, denom)


@dataclass(frozen=True)
class GiGPOParams(StrategyParams):
    omega: float = param(1.0, help="weight of the step advantage")
    gamma: float = param(1.0, minimum=0.0, help="discount of `R_t`")
    fnorm: Literal["std", "none"] = param("none", help="`std` or `none`")
    epsilon: float = param(1e-6, minimum=0.0, help="added to the denominator")
    step_reward_key: Column | None = param(
        "step_reward",
        help="column of per-step rewards, used per run where the run has a value (null: always the fallback)",
    )
    env_state_hash_key: Column = param(
        "env_state_hash", none_message="must name the anchor-state column",
        help="column of anchor-state ids",
    )
    anchor_scope: Literal["batch", "task"] = param(
        "batch",
        help="`batch`: steps of the whole batch (one explore step) that share a state hash form one anchor group, "
             "across tasks, as Trinity does; `task`: anchor groups stay inside the task group (the paper's step "
             "groups)",
    )


@register("gigpo", kind=ADVANTAGE, summary="multi-step: episode advantage + omega * step advantage within anchor-state groups (Trinity `gigpo`)")
class GiGPO(GiGPOParams):
    batch_level = False

    @property
    def needs(self) -> tuple[str, ...]:
        # The step-reward column is used where the input has it, as Trinity uses the info key.
        return (
            self.env_state_hash_key,
            *((OptionalColumn(self.step_reward_key),) if self.step_reward_key else ()),
            *((WHOLE_BATCH,) if self.anchor_scope == "batch" else ()),
        )

    def score(self, rows: GroupedRows, batch_stats: Tensor | None) -> Scores:
        anchor = rows.columns[self.env_state_hash_key]
        step_reward = rows.columns.get(self.step_reward_key) if self.step_reward_key else None
        step_reward = None if step_reward is None else step_reward.to(torch.float64)
        return gigpo_scores(
            rows, anchor, step_reward, omega=self.omega, gamma=self.gamma, fnorm=self.fnorm, epsilon=self.epsilon,
            anchor_scope=self.anchor_scope,
        )
