"""The audit trail of a run (--keep-filtered, --audit-columns): why a row was dropped, and the
numbers its score came from. Pure numpy/torch over one bucket's GroupedRows, no Beam.

    filter_reasons   (n,) object: None for kept rows, else "STAGE: statistic <= threshold",
                     e.g. "reward_variance: var 0 <= 0", "grpo: std 0 <= 0.1",
                     "reward_variance: group of 1 row < 2 rows"
    audit_values     per row: group_size, group_reward_mean, group_reward_std (as the
                     advantage stage used them), batch_reward_std (the batch std a batch-level
                     GRPO divided by; null otherwise) and baseline (what the advantage stage
                     subtracted from the reward; null for strategies without one)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rescore.schemas.experience import AUDIT_FIELDS, AUDIT_NAMES, FILTER_REASON  # noqa: F401  (declared with the output contract)
from rescore.transforms.strategies import GroupedRows, ChainScores, StrategyChain
from rescore.transforms.strategies.base import ADVANTAGE, KINDS, ExplainsDrops, ExplainsScores
from rescore.transforms.strategies.segments import group_index as _group_index

if TYPE_CHECKING:
    import torch



def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def filter_reasons(plan: StrategyChain, rows: GroupedRows, scores: ChainScores) -> np.ndarray:
    """(n,) object array: the reason each dropped row was dropped, None where it is kept."""
    n = rows.num_rows
    out = np.full(n, None, dtype=object)
    if scores.dropped_by is None or n == 0:
        return out
    by = _np(scores.dropped_by).astype(np.int64)
    if not by.any():
        return out
    group_std = _np(scores.group_std).astype(np.float64)
    for k, kind in enumerate(KINDS, start=1):
        dropped = np.flatnonzero(by == k)
        if not len(dropped):
            continue
        stage = plan.stage(kind)
        reached = (by == 0) | (by >= k)  # the rows this stage saw
        if isinstance(stage, ExplainsDrops):
            out[dropped] = stage.drop_reasons(rows, reached, dropped, group_std)
        else:
            out[dropped] = f"{stage.name}: dropped by the {kind} stage"
    return out


def audit_values(
    plan: StrategyChain, rows: GroupedRows, scores: ChainScores, batch_stats: torch.Tensor | None
) -> dict[str, np.ndarray]:
    """Per row: the AUDIT_FIELDS values (NaN where a value does not apply; written as null)."""
    n = rows.num_rows
    offsets = _np(rows.offsets).astype(np.int64)
    g = _group_index(offsets)
    sizes = np.diff(offsets)
    mean = _np(scores.group_mean).astype(np.float64)[g]
    std = _np(scores.group_std).astype(np.float64)[g]
    nan = np.full(n, np.nan)
    adv = plan.stage(ADVANTAGE)
    batch_std = baseline = nan
    if isinstance(adv, ExplainsScores):
        used = adv.audit_batch_std(batch_stats) if adv.batch_level and batch_stats is not None else None
        batch_std = nan if used is None else used
        baseline = adv.audit_baseline(rows, mean)
        std = adv.audit_group_std(rows, std)
    return {
        "group_size": sizes[g].astype(np.int64),
        "group_reward_mean": mean,
        "group_reward_std": std,
        "batch_reward_std": batch_std,
        "baseline": baseline,
    }


