"""Run metrics as data: partial counts per batch from every step, merged into metrics.json.

Counting in the data (not only in Beam counters) makes metrics.json exact on every runner, and
the group means are summed with math.fsum so the file does not depend on merge order.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Optional

import apache_beam as beam
import numpy as np

ROW_COUNTERS = (
    "rows_read",
    "rows_written",
    "rows_written_original",
    "rows_duplicated",
    "rows_filtered",
    "rows_rejected",
)
GROUP_COUNTERS = ("groups", "groups_filtered")
MEAN_KEY = "group_advantages/reward_mean/mean"
STD_KEY = "group_advantages/reward_std/mean"

Partial = dict[Optional[int], dict[str, Any]]
"""batch id (None for rows whose batch is unknown) -> counters, group stats, reject reasons."""


def new_batch() -> dict[str, Any]:
    return {
        **{k: 0 for k in ROW_COUNTERS + GROUP_COUNTERS},
        "group_reward_mean": [],
        "group_reward_std": [],
        "reject_reasons": Counter(),
    }


def _add(into: dict[str, Any], part: dict[str, Any]) -> None:
    for k in ROW_COUNTERS + GROUP_COUNTERS:
        into[k] += part[k]
    into["group_reward_mean"] += part["group_reward_mean"]
    into["group_reward_std"] += part["group_reward_std"]
    into["reject_reasons"].update(part["reject_reasons"])


def merge_into(acc: Partial, partial: Partial) -> Partial:
    for batch, part in partial.items():
        _add(acc.setdefault(batch, new_batch()), part)
    return acc


class MergeMetrics(beam.CombineFn):
    def create_accumulator(self) -> Partial:
        return {}

    def add_input(self, acc: Partial, partial: Partial) -> Partial:
        return merge_into(acc, partial)

    def merge_accumulators(self, accs) -> Partial:
        out: Partial = {}
        for acc in accs:
            merge_into(out, acc)
        return out

    def extract_output(self, acc: Partial) -> Partial:
        return acc


def _summary(part: dict[str, Any]) -> dict[str, Any]:
    means = np.concatenate(part["group_reward_mean"]) if part["group_reward_mean"] else np.zeros(0)
    stds = np.concatenate(part["group_reward_std"]) if part["group_reward_std"] else np.zeros(0)
    out = {k: int(part[k]) for k in ROW_COUNTERS + GROUP_COUNTERS}
    out[MEAN_KEY] = math.fsum(means.tolist()) / len(means) if len(means) else None
    out[STD_KEY] = math.fsum(stds.tolist()) / len(stds) if len(stds) else None
    out["reject_reasons"] = dict(sorted(part["reject_reasons"].items()))
    return out


def summarize(acc: Partial) -> dict[str, Any]:
    """{"totals": {...}, "batches": [{"batch": id, ...}, ...]} for metrics.json."""
    everything = new_batch()
    for part in acc.values():
        _add(everything, part)
    batches = sorted(acc, key=lambda b: (b is None, b if b is not None else 0))
    return {
        "totals": _summary(everything),
        "batches": [{"batch": b, **_summary(acc[b])} for b in batches],
    }
