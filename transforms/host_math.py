"""The score step on numpy: a run whose chain is one advantage stage with a numpy implementation
(`host_math`: GRPO without a rank penalty, group or batch std: strategies/grpo_np.py) and whose math is on the CPU
never imports torch (~370 MB resident and ~1 s of import before a row is read).

On by default; RESCORE_HOST_MATH=0 keeps such runs on torch. The numpy math equals the torch
math bit for bit (strategies/segments_np.py; the std's square root is IEEE's on both paths,
strategies/segments.py `ieee_sqrt`).

`eligible` is decided once where the pipeline is built (the chain and the options); `on_host`
where a step starts (the device is the worker's own: `auto` takes a GPU where it has one).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from rescore.errors import ConfigError
from rescore.transforms import device as devices
from rescore.transforms.rows.groups import group_offsets
from rescore.transforms.strategies.base import ADVANTAGE
from rescore.transforms.strategies.segments_np import segment_count

SWITCH = "RESCORE_HOST_MATH"


def switched_on() -> bool:
    """RESCORE_HOST_MATH: 1 or unset on, 0 off; ConfigError for anything else."""
    value = os.environ.get(SWITCH, "").strip()
    if value not in ("", "0", "1"):
        raise ConfigError(f"{SWITCH} must be 0 or 1, got {value!r}")
    return value != "0"


def host_stage(plan):
    """The chain's one stage where it is a single advantage stage with a numpy implementation
    for its options, else None."""
    if len(plan.stages) != 1:
        return None
    stage = plan.stages[0]
    return stage if stage.kind == ADVANTAGE and getattr(stage, "host_math", False) else None


def eligible(plan, settings) -> bool:
    """The run may score on numpy: switched on, a chain of one such stage, and no audit trail
    (--audit-columns, --keep-filtered explain rows from the torch math's values)."""
    return (
        switched_on()
        and host_stage(plan) is not None
        and not settings.audit_columns
        and not settings.keep_filtered
        and settings.device != "cuda"
    )


def on_host(eligible_run: bool, settings) -> bool:
    """Where a step starts: an eligible run whose device here is the CPU (transforms/device.py
    host_only: decided without importing torch)."""
    return eligible_run and devices.host_only(settings.device)


class HostChainScores(NamedTuple):
    """What StrategyChain.score gives for a one-stage chain, as numpy arrays."""

    score: np.ndarray  # (n,) float64
    keep: np.ndarray  # (n,) bool
    group_mean: np.ndarray  # (G,) float64
    group_std: np.ndarray  # (G,) float64
    dropped: dict[str, np.ndarray]  # {ADVANTAGE: (G,) int64 rows the stage dropped}
    offsets: np.ndarray  # (G + 1,) int64
    group_batch: np.ndarray  # (G,) int64


def _reward(light: pa.Table) -> np.ndarray:
    return np.asarray(light["reward"].to_numpy(zero_copy_only=False), dtype=np.float64)


def batch_values(plan, light: pa.Table):
    """(batch, (values, weights)) for each batch of a bucket's light rows, as
    StrategyChain.batch_values gives them for a one-stage chain: every row's reward, weight 1."""
    batch = np.asarray(light["batch"].to_numpy(zero_copy_only=False), dtype=np.int64)
    reward = _reward(light)
    weights = np.ones(len(reward), dtype=np.float64)
    for b in np.unique(batch):
        at = batch == b
        yield int(b), (reward[at], weights[at])


def batch_stats(plan, values: np.ndarray, weights: np.ndarray) -> tuple[float, ...]:
    """StrategyChain.batch_stats for a one-stage chain, on numpy."""
    return host_stage(plan).batch_stats_host(values, weights)


def score_bucket(plan, light: pa.Table, batch_stats: np.ndarray | None = None) -> HostChainScores:
    """A bucket's sorted light rows scored as StrategyChain.score scores them (no filter: every
    row reaches the stage; every group is non-empty, so each takes the stage's mean and std).
    batch_stats: (n, k) each row's batch statistics (rows/groups.py batch_stats_per_row), or None."""
    offsets = group_offsets(light)
    reward = _reward(light)
    s = host_stage(plan).score_host(reward, offsets, None if batch_stats is None else batch_stats[:, 0])
    keep = np.asarray(s.keep, dtype=bool)
    batch = np.asarray(light["batch"].to_numpy(zero_copy_only=False), dtype=np.int64)
    return HostChainScores(
        np.asarray(s.score, dtype=np.float64), keep, s.group_mean, s.group_std,
        {ADVANTAGE: segment_count(~keep, offsets)}, offsets, batch[offsets[:-1]],
    )
