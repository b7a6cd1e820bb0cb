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

import numpy as np
import pyarrow as pa
import torch

from rescore.transforms.strategies import GroupedRows, ChainScores, StrategyChain
from rescore.transforms.strategies.base import ADVANTAGE, KINDS
from rescore.transforms.strategies.filters import TRUNCATED, DynamicFiltering, FilterGroups, MaskResponseTruncated, _metric

AUDIT_FIELDS = [
    pa.field("group_size", pa.int64()),
    pa.field("group_reward_mean", pa.float64()),
    pa.field("group_reward_std", pa.float64()),
    pa.field("batch_reward_std", pa.float64()),
    pa.field("baseline", pa.float64()),
]
AUDIT_NAMES = [f.name for f in AUDIT_FIELDS]
FILTER_REASON = "filter_reason"

GROUP_MEAN_BASELINE = ("grpo", "correct_bias", "step_wise_grpo", "dr_grpo", "reinforce_plus_plus_baseline", "gpg")
"""Advantage strategies whose baseline is the group mean they report (0 for a group of one row)."""
BATCH_STD = ("grpo", "step_wise_grpo")
"""Strategies whose batch statistic (std_cal_level=batch) is the std they divide by."""


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy()


def _group_index(offsets: np.ndarray) -> np.ndarray:
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def _masked_stats(reward: np.ndarray, offsets: np.ndarray, mask: np.ndarray):
    """Per group over the rows in `mask`: (count, population var, std with ddof=1)."""
    g = _group_index(offsets)
    groups = len(offsets) - 1
    n = np.bincount(g, weights=mask, minlength=groups)
    total = np.bincount(g, weights=np.where(mask, reward, 0.0), minlength=groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / n
        dev = np.where(mask, reward - mean[g], 0.0)
        ss = np.bincount(g, weights=dev * dev, minlength=groups)
        return n.astype(np.int64), ss / n, np.sqrt(ss / (n - 1))


def _rows(n: int) -> str:
    return f"{n} row" if n == 1 else f"{n} rows"


def filter_reasons(plan: StrategyChain, rows: GroupedRows, scores: ChainScores) -> np.ndarray:
    """(n,) object array: the reason each dropped row was dropped, None where it is kept."""
    n = rows.num_rows
    out = np.full(n, None, dtype=object)
    if scores.dropped_by is None or n == 0:
        return out
    by = _np(scores.dropped_by).astype(np.int64)
    if not by.any():
        return out
    reward = _np(rows.reward).astype(np.float64)
    offsets = _np(rows.offsets).astype(np.int64)
    g = _group_index(offsets)
    for k, kind in enumerate(KINDS, start=1):
        dropped = np.flatnonzero(by == k)
        if not len(dropped):
            continue
        stage = plan.stage(kind)
        name = stage.name
        reached = (by == 0) | (by >= k)  # the rows this stage saw
        count, var, std = _masked_stats(reward, offsets, reached)
        params = dict(stage.params)
        if "variance_threshold" in params:
            thr = float(params["variance_threshold"])
            text = {
                int(i): (f"{name}: group of {_rows(count[i])} < 2 rows" if count[i] < 2 else f"{name}: var {var[i]:.6g} <= {thr:g}")
                for i in np.unique(g[dropped])
            }
            out[dropped] = [text[i] for i in g[dropped]]
        elif params.get("std_threshold") is not None:
            thr = float(params["std_threshold"])
            used = _np(scores.group_std).astype(np.float64)  # the std the stage compared (e.g. over last steps)
            single = _single_units(rows, offsets, reached, per_run=name == "step_wise_grpo")
            unit = "run" if name == "step_wise_grpo" else "row"
            text = {
                int(i): (f"{name}: group of one {unit} (std_threshold drops it)" if single[i] else f"{name}: std {used[i]:.6g} <= {thr:g}")
                for i in np.unique(g[dropped])
            }
            out[dropped] = [text[i] for i in g[dropped]]
        elif "reward_threshold" in params or "top_only" in params:  # raft
            thr = params.get("reward_threshold")
            top = np.full(len(offsets) - 1, -np.inf)
            np.maximum.at(top, g[reached], reward[reached])
            reasons = []
            for i in dropped:
                if thr is not None and reward[i] <= thr:
                    reasons.append(f"{name}: reward {reward[i]:.6g} <= {float(thr):g}")
                else:
                    reasons.append(f"{name}: reward {reward[i]:.6g} < the group's top {top[g[i]]:.6g}")
            out[dropped] = reasons
        elif isinstance(stage, FilterGroups):
            values = _np(_metric(rows, stage.metric)).astype(np.float64)
            _, _, mstd = _masked_stats(values, offsets, reached)
            text = {int(i): f"{name}: {stage.metric} std {mstd[i]:.6g} <= 0" for i in np.unique(g[dropped])}
            out[dropped] = [text[i] for i in g[dropped]]
        elif isinstance(stage, DynamicFiltering):
            values = _np(_metric(rows, stage.metric)).astype(np.float64)
            sums = np.bincount(g, weights=values, minlength=len(offsets) - 1)
            with np.errstate(invalid="ignore", divide="ignore"):
                gmean = sums / np.diff(offsets)
            text = {
                int(i): (f"{name}: {stage.metric} mean {gmean[i]:.6g} <= {stage.low:g}" if gmean[i] <= stage.low
                         else f"{name}: {stage.metric} mean {gmean[i]:.6g} >= {stage.high:g}")
                for i in np.unique(g[dropped])
            }
            out[dropped] = [text[i] for i in g[dropped]]
        elif isinstance(stage, MaskResponseTruncated):
            out[dropped] = f"{name}: {stage.column} is {TRUNCATED} (drop=true)"
        else:
            out[dropped] = f"{name}: dropped by the {kind} stage"
    return out


def _single_units(rows: GroupedRows, offsets: np.ndarray, reached: np.ndarray, per_run: bool) -> np.ndarray:
    """(G,) bool: the group has one row (or one run) among the rows the stage saw."""
    g = _group_index(offsets)
    if not per_run:
        return np.bincount(g, weights=reached, minlength=len(offsets) - 1) == 1
    run = _np(rows.run).astype(np.int64)
    new_run = np.ones(len(run), dtype=bool)
    new_run[1:] = (run[1:] != run[:-1]) | (g[1:] != g[:-1])
    # rows are sorted by (batch, task, run, step): a run starts where the run id changes
    return np.bincount(g, weights=new_run & reached, minlength=len(offsets) - 1) == 1


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
    batch_std = nan
    if adv is not None and adv.batch_level and adv.name in BATCH_STD and batch_stats is not None:
        batch_std = _np(batch_stats[:, 0]).astype(np.float64)
    baseline = nan
    if adv is not None:
        baseline = _baseline(adv, rows, offsets, mean, scores)
        if adv.name == "rec":
            std = _rec_std(adv, rows, offsets)
            baseline = np.where(_rec_dropped(adv, rows), np.nan, baseline)  # a balance-dropped row scores 0
    return {
        "group_size": sizes[g].astype(np.int64),
        "group_reward_mean": mean,
        "group_reward_std": std,
        "batch_reward_std": batch_std,
        "baseline": baseline,
    }


def _baseline(adv, rows: GroupedRows, offsets: np.ndarray, mean: np.ndarray, scores: ChainScores) -> np.ndarray:
    """(n,) what the advantage stage subtracted from each row's reward; NaN where unknown."""
    n = rows.num_rows
    g = _group_index(offsets)
    sizes = np.diff(offsets)[g]
    reward = _np(rows.reward).astype(np.float64)
    params = dict(adv.params)
    if adv.name in GROUP_MEAN_BASELINE:
        return mean.copy()
    if adv.name == "rec":  # mean(K) of the rows `drop` left (0 for a group of one row left)
        return mean.copy()
    if adv.name == "reinforce":
        return np.zeros(n)
    if adv.name == "remax":  # the greedy-decode reward column
        return _np(rows.columns[adv.reward_baselines]).astype(np.float64)
    if adv.name == "opo":
        return _opo_baseline(rows, offsets, reward)[g]
    if adv.name == "grpo_passk":  # only the group's first top row scores r_max - r_second
        return _passk_baseline(offsets, reward)
    if adv.name == "asymre":
        return np.where(sizes > 1, mean + float(params.get("baseline_shift", 0.0)), 0.0)
    if adv.name == "rloo":  # the mean of the group's other rows
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(sizes > 1, (mean * sizes - reward) / (sizes - 1), 0.0)
    if adv.name == "opmd":
        if params.get("opmd_baseline", "mean") == "mean":
            return np.where(sizes > 1, mean, 0.0)
        from rescore.transforms.strategies.baselines import logavgexp_baseline

        b = _np(logavgexp_baseline(rows.reward, rows.offsets, float(params.get("tau", 1.0)))).astype(np.float64)
        return b[g]
    return np.full(n, np.nan)


def _rec_dropped(adv, rows: GroupedRows) -> np.ndarray:
    """(n,) bool: the rows rec's drop="balance" dropped (they score 0)."""
    from rescore.transforms.strategies.estimators import rec_scores, row_keys

    if not adv.drop:
        return np.zeros(rows.num_rows, dtype=bool)
    _, dropped, _, _ = rec_scores(
        rows.reward, rows.offsets, epsilon=adv.epsilon, std_normalize=adv.std_normalize, drop=adv.drop, key=row_keys(rows, adv.seed)
    )
    return _np(dropped).astype(bool)


def _rec_std(adv, rows: GroupedRows, offsets: np.ndarray) -> np.ndarray:
    """(n,) rec's group std over the rows left (K) with ddof=1, as the docs define the column;
    1 where fewer than 2 rows are left (rec's own convention)."""
    reward = _np(rows.reward).astype(np.float64)
    count, _, std = _masked_stats(reward, offsets, ~_rec_dropped(adv, rows))
    return np.where(count < 2, 1.0, std)[_group_index(offsets)]


def _opo_baseline(rows: GroupedRows, offsets: np.ndarray, reward: np.ndarray) -> np.ndarray:
    """(G,) opo's length-weighted group mean (see estimators.opo_scores)."""
    g = _group_index(offsets)
    groups = len(offsets) - 1
    sizes = np.diff(offsets)
    length = _np(rows.action_tokens).astype(np.float64)
    total = np.bincount(g, weights=length, minlength=groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        weighted = np.bincount(g, weights=length * reward, minlength=groups) / np.where(total > 0, total, 1.0)
        plain = np.bincount(g, weights=reward, minlength=groups) / sizes
    b = np.where(total > 0, weighted, plain)
    top = np.full(groups, -np.inf)
    low = np.full(groups, np.inf)
    np.maximum.at(top, g, reward)
    np.minimum.at(low, g, reward)
    b = np.where(top == low, top, b)
    return np.where(sizes == 1, 0.0, b)


def _passk_baseline(offsets: np.ndarray, reward: np.ndarray) -> np.ndarray:
    """(n,) grpo_passk: r_second for the group's first top row; NaN for the rows that score 0."""
    out = np.full(len(reward), np.nan)
    for a, b in zip(offsets[:-1], offsets[1:]):
        if b - a < 2:
            continue
        first = a + int(np.argmax(reward[a:b]))
        out[first] = np.max(np.delete(reward[a:b], first - a))
    return out
