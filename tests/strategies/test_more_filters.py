"""Trinity's reward_filter and reward_std_filter, SkyRL's zero_variance_filter: against their own
code (tests/refs.py) and hand-computed cases."""

from __future__ import annotations

import random

import numpy as np
import pytest

import refs
from test_estimators_refs import experiences, ours, per_batch, random_batches, ref  # noqa: F401  (ref: fixture)


def kept(got):
    return {i for i, a in enumerate(got) if a is not None}


def trinity_kept(ref, rows, operator) -> set[int]:
    """Indices of the rows a Trinity experience operator keeps, one explore step at a time."""
    want = set()
    for idx, part in per_batch(rows):
        exps = experiences(ref, part)
        out, _ = operator.process(exps)
        want |= {idx[exps.index(e)] for e in out}
    return want


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("threshold", [0.0, 0.5, -1.0])
def test_reward_filter_matches_trinity(ref, seed, threshold):
    rows = random_batches(seed)
    want = trinity_kept(ref, rows, ref.trinity.RewardFilter(threshold=threshold))
    assert kept(ours("reward_filter,grpo", {"threshold": threshold}, rows)) == want
    if threshold >= 0:
        assert 0 < len(want) < len(rows)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("threshold", [0.0, 0.4])
def test_reward_std_filter_matches_trinity(ref, seed, threshold):
    rows = random_batches(seed)
    want = trinity_kept(ref, rows, ref.trinity.RewardSTDFilter(threshold=threshold))
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


def test_ngram_repeat_ratio_by_hand():
    from rescore.transforms.strategies.repetition import ngram_repeat_ratio

    # 1 2 1 2 1 2: bigrams 12 21 12 21 12, 2 distinct of 5 -> 3/5; 1 2 3: none repeat; [5]: no bigram.
    got = ngram_repeat_ratio(np.array([1, 2, 1, 2, 1, 2, 1, 2, 3, 5]), np.array([0, 6, 9, 10]), 2)
    np.testing.assert_allclose(got, [0.6, 0.0, 0.0])
    # A python count of the same definition on random rows.
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 30, 50)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    tokens = rng.integers(0, 4, offsets[-1])
    for n in (1, 3):
        want = []
        for i in range(50):
            t = tokens[offsets[i]:offsets[i + 1]].tolist()
            grams = [tuple(t[j:j + n]) for j in range(len(t) - n + 1)]
            want.append((len(grams) - len(set(grams))) / len(grams) if grams else 0.0)
        np.testing.assert_allclose(ngram_repeat_ratio(tokens, offsets, n), want)


def test_ngram_repetition_filter_reads_the_response_tokens_only():
    import pyarrow as pa
    import torch

    from rescore.schemas.validation import check_rows
    from rescore.transforms.rows.groups import sort_rows, to_grouped_rows
    from rescore.transforms.rows.keys import light_rows
    from rescore.transforms.strategies import chain_of

    # Prompt 7 7 7 7 (repeats, not counted). Responses: 1 2 1 2 1 2 (3/5 bigrams repeat),
    # 1 2 3 4 (none), 9 9 9 (2 bigrams, 1 distinct -> 1/2).
    table = pa.table({
        "batch": [0, 0, 0], "task": [0, 0, 0], "run": [0, 1, 2], "reward": [1.0, 0.0, 1.0],
        "tokens": [[7, 7, 7, 7, 1, 2, 1, 2, 1, 2], [7, 7, 7, 7, 1, 2, 3, 4], [7, 7, 7, 7, 9, 9, 9]],
        "prompt_length": [4, 4, 4],
    })
    plan = chain_of("ngram_repetition_filter,grpo", {"rep_len": 2, "max_ratio": 0.5})
    check = check_rows(table, needs=plan.needs)
    light, _ = sort_rows(light_rows(0, table, check, task_type=pa.int64(), needs=plan.needs))
    np.testing.assert_allclose(light["x.ngram_repeat_2"].to_numpy(), [0.6, 0.0, 0.5])
    s = plan.score(to_grouped_rows(light, torch.device("cpu")))
    assert s.keep.tolist() == [False, True, True]  # 0.5 is not above max_ratio
