"""grpo.py's `grpo_scores` in numpy, bit for bit (segments_np.py): GRPO's host implementation,
which a run on the CPU uses without importing torch (strategies/host.py)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from rescore.transforms.strategies.segments_np import group_stats, per_row, sizes_of


class HostScores(NamedTuple):
    """An advantage stage's Scores as numpy arrays: (n,) float64 score, (n,) bool keep, (G,)
    float64 group mean and std."""

    score: np.ndarray
    keep: np.ndarray
    group_mean: np.ndarray
    group_std: np.ndarray


def grpo_scores(
    reward: np.ndarray,
    offsets: np.ndarray,
    *,
    epsilon: float,
    batch_std: np.ndarray | None = None,
    std_threshold: float | None = None,
) -> HostScores:
    """grpo.grpo_scores over numpy arrays: reward (n,) float64 sorted by group, offsets (G + 1,)
    int64, batch_std (n,) float64 or None. The same values bit for bit."""
    reward = np.asarray(reward, dtype=np.float64)
    single = sizes_of(offsets) == 1
    mean, std = group_stats(reward, offsets)
    denominator = batch_std if batch_std is not None else per_row(std, offsets)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        score = (reward - per_row(mean, offsets)) / (denominator + epsilon)
    score = np.where(denominator == 0, 0.0, score)
    if std_threshold is None:
        keep_group = np.ones(len(single), dtype=bool)
    else:
        with np.errstate(invalid="ignore"):
            keep_group = ~single & (std > std_threshold)
    return HostScores(score, per_row(keep_group, offsets), mean, std)
