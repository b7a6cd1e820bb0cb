"""Trinity's reward_filter and reward_std_filter, SkyRL's zero_variance_filter: against their own
code (tests/refs.py) and hand-computed cases."""

from __future__ import annotations

import random

import numpy as np
import pytest

import refs
from test_estimators_refs import SCHEMA, experiences, ours, per_batch, random_batches  # noqa: F401


@pytest.fixture(scope="module")
def ref():
    try:
        return refs.load()
    except refs.RefsUnavailable as e:
        pytest.skip(str(e))


def kept(got):
    return {i for i, a in enumerate(got) if a is not None}


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("threshold", [0.0, 0.5, -1.0])
def test_reward_filter_matches_trinity(ref, seed, threshold):
    rows = random_batches(seed)
    want = set()
    for idx, part in per_batch(rows):
        exps = experiences(ref, part)
        out, _ = ref.trinity.RewardFilter(threshold=threshold).process(exps)
        want |= {idx[exps.index(e)] for e in out}
    assert kept(ours("reward_filter,grpo", {"threshold": threshold}, rows)) == want
    if threshold >= 0:
        assert 0 < len(want) < len(rows)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("threshold", [0.0, 0.4])
def test_reward_std_filter_matches_trinity(ref, seed, threshold):
    rows = random_batches(seed)
    want = set()
    for idx, part in per_batch(rows):
        exps = experiences(ref, part)
        out, _ = ref.trinity.RewardSTDFilter(threshold=threshold).process(exps)
        want |= {idx[exps.index(e)] for e in out}
    assert kept(ours("reward_std_filter,grpo", {"threshold": threshold}, rows)) == want


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("tol", [0.0, 1e-6, 0.6])
def test_zero_variance_filter_matches_skyrl(seed, tol):
    try:
        skyrl = refs.load_extra("skyrl")
    except refs.RefsUnavailable as e:
        pytest.skip(str(e))
    rng = random.Random(seed)
    rows = random_batches(seed)
    for r in rows:  # some rows without action tokens (not live), rewards a hair apart
        if rng.random() < 0.2:
            r["action_mask"] = [0] * len(r["action_mask"])
        r["reward"] += rng.choice([0.0, 0.0, 1e-7])
    uids = [f"{r['batch']}/{r['task']}" for r in rows]
    want = set(skyrl.zero_variance_filter([r["reward"] for r in rows], uids, [r["action_mask"] for r in rows], tol=tol))
    assert kept(ours("zero_variance_filter,grpo", {"zero_variance_filter_tol": tol}, rows)) == want


def test_zero_variance_filter_by_hand():
    from test_estimators_units import grouped

    from rescore.transforms.strategies import create

    # Group 0: live rewards 1, 1 (a dead row with 0): dropped. Group 1: one live row: kept.
    # Group 2: 0.5, 0.5 + 1e-7: within the default tol 1e-6: dropped; with tol 0: kept.
    rows = grouped([1.0, 1.0, 0.0, 1.0, 0.0, 0.5, 0.5 + 1e-7], [3, 2, 2], tokens=[2, 3, 0, 4, 0, 1, 1])
    assert create("zero_variance_filter", {}).score(rows, None).keep.tolist() == [False] * 3 + [True] * 2 + [False] * 2
    keep = create("zero_variance_filter", {"zero_variance_filter_tol": 0.0}).score(rows, None).keep.tolist()
    assert keep == [False] * 3 + [True] * 4
