"""Property-based tests (hypothesis) over random groups: the invariants every run relies on."""

import math

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rescore.transforms.rows.metrics import group_metrics, row_metrics, summarize
from rescore.transforms.rows.outcomes import FILTERED, REJECTED, SCORED
from rescore.transforms.strategies import GroupedRows, create, chain_of
from rescore.transforms.strategies.baselines import whiten_stats
from rescore.transforms.rows.copies import plan_copies
from rescore.transforms.strategies.tokens import token_advantages

F64 = torch.float64
SETTINGS = settings(max_examples=60, deadline=None)

reward = st.floats(min_value=-50, max_value=50, allow_nan=False, allow_infinity=False)


@st.composite
def groups(draw, min_size=1):
    sizes = draw(st.lists(st.integers(min_value=min_size, max_value=9), min_size=1, max_size=12))
    n = sum(sizes)
    rewards = draw(st.lists(reward, min_size=n, max_size=n))
    tokens = draw(st.lists(st.integers(min_value=0, max_value=6), min_size=n, max_size=n))
    offsets = torch.tensor([0, *np.cumsum(sizes).tolist()])
    return GroupedRows(
        reward=torch.tensor(rewards, dtype=F64),
        offsets=offsets,
        batch=torch.zeros(n, dtype=torch.int64),
        run=torch.arange(n),
        step=torch.zeros(n, dtype=torch.int64),
        action_tokens=torch.tensor(tokens),
    )


def per_group(values, offsets):
    return [values[int(a):int(b)] for a, b in zip(offsets[:-1], offsets[1:])]


@SETTINGS
@given(groups(min_size=2))
def test_grpo_scores_have_zero_mean_per_group(rows):
    s = create("grpo").score(rows, None)
    for part in per_group(s.score, rows.offsets):
        assert abs(float(part.sum())) <= 1e-9 * len(part) * max(1.0, float(part.abs().max()))


@pytest.mark.slow
@SETTINGS
@given(groups(), st.floats(min_value=-100, max_value=100))
def test_grpo_is_shift_invariant(rows, shift):
    from dataclasses import replace

    multi = (rows.offsets[1:] - rows.offsets[:-1]) > 1
    a = create("grpo").score(rows, None).score
    b = create("grpo").score(replace(rows, reward=rows.reward + shift), None).score
    # Groups of one row have mean 0 by definition, so only larger groups are shift invariant.
    at = torch.repeat_interleave(multi, rows.offsets[1:] - rows.offsets[:-1])
    assert torch.allclose(a[at], b[at], rtol=1e-6, atol=1e-6)


@SETTINGS
@given(groups(min_size=2))
def test_rloo_and_dr_grpo_sum_to_zero_and_rloo_leaves_one_out(rows):
    rloo = create("rloo").score(rows, None).score
    dr = create("dr_grpo").score(rows, None).score
    for r, a, b in zip(per_group(rows.reward, rows.offsets), per_group(rloo, rows.offsets), per_group(dr, rows.offsets)):
        n = len(r)
        assert abs(float(b.sum())) < 1e-9 * (1 + float(r.abs().sum()))
        for i in range(n):
            others = (float(r.sum()) - float(r[i])) / (n - 1)
            assert math.isclose(float(a[i]), float(r[i]) - others, rel_tol=1e-9, abs_tol=1e-9)


@SETTINGS
@given(groups())
def test_whitened_scores_have_zero_token_weighted_mean(rows):
    strategy = create("reinforce_plus_plus_baseline")
    _, values, weights = strategy.batch_values(rows)
    mu, var = strategy.batch_stats(values.numpy(), weights.numpy())
    s = strategy.score(rows, torch.tensor([[mu, var]] * rows.num_rows, dtype=F64)).score
    w = rows.action_tokens.to(F64)
    if float(w.sum()) > 1 and var > 1e-6:
        assert abs(float((s * w).sum() / w.sum())) < 1e-6
        assert whiten_stats(values.numpy(), weights.numpy()) == (mu, var)


@SETTINGS
@given(
    st.lists(st.floats(min_value=-10, max_value=10, allow_nan=False), min_size=1, max_size=20),
    st.data(),
)
def test_masked_positions_are_exactly_zero(row_values, data):
    lengths = data.draw(st.lists(st.integers(0, 7), min_size=len(row_values), max_size=len(row_values)))
    total = sum(lengths)
    mask = data.draw(st.lists(st.sampled_from([0, 1]), min_size=total, max_size=total))
    out = token_advantages(torch.tensor(row_values, dtype=F64), torch.tensor(lengths), torch.tensor(mask, dtype=torch.int8))
    expected = np.repeat(np.float32(row_values), lengths) * np.array(mask, dtype=np.float32)
    assert out.dtype == torch.float32 and out.shape == (total,)
    assert np.array_equal(out.numpy(), expected)
    assert all(v == 0.0 for v, m in zip(out.tolist(), mask) if m == 0)


@SETTINGS
@given(
    groups(),
    st.sampled_from(
        ["reward_variance,grpo,duplicate_informative", "grpo", "duplicate_informative", "reward_variance,step_wise_grpo",
         "raft,duplicate_informative"]
    ),
    st.floats(min_value=0, max_value=2),
)
def test_every_row_is_kept_or_dropped_by_exactly_one_stage(rows, strategy, threshold):
    params = {"std_threshold": threshold} if "grpo" in strategy else {}
    s = chain_of(strategy, params).score(rows)
    dropped = sum(d for d in s.dropped.values()) if s.dropped else torch.zeros(rows.num_groups, dtype=torch.int64)
    kept = [int(k.sum()) for k in per_group(s.keep, rows.offsets)]
    sizes = (rows.offsets[1:] - rows.offsets[:-1]).tolist()
    assert [k + int(d) for k, d in zip(kept, dropped)] == sizes


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([SCORED, FILTERED, REJECTED])), min_size=0, max_size=60))
def test_metrics_account_for_every_row(outcomes):
    batch = pa.array([b for b, _ in outcomes], pa.int64())
    status = np.array([s for _, s in outcomes], dtype=np.int8)
    category = ["bad_reward" if s == REJECTED else None for s in status]
    tables = [row_metrics(batch, status, category)] if outcomes else []
    groups_ = group_metrics(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0), np.zeros(0), {})
    doc = summarize([groups_], tables)
    for part in [doc["totals"], *doc["batches"]]:
        assert part["rows_read"] == part["rows_written_original"] + part["rows_filtered"] + part["rows_rejected"]
    assert doc["totals"]["rows_read"] == len(outcomes)
    assert doc["totals"]["reject_reasons"].get("bad_reward", 0) == int((status == REJECTED).sum())


@SETTINGS
@given(
    st.lists(st.tuples(st.integers(1, 9), st.booleans()), min_size=1, max_size=40),
    st.integers(0, 2**32),
    st.integers(-5, 1000),
)
def test_copy_plan_lands_between_target_and_target_plus_one_group(groups_, seed, batch):
    sizes = np.array([s for s, _ in groups_])
    informative = np.array([i for _, i in groups_])
    keys = np.arange(len(sizes), dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    copies = plan_copies(keys, sizes, informative, target=int(sizes.sum()), seed=seed, batch=batch)
    assert (copies >= 0).all() and not copies[~informative].any()
    if informative.any():
        written = int((sizes * (1 + copies))[informative].sum())
        assert sizes.sum() <= written < sizes.sum() + sizes[informative].max()
    assert (plan_copies(keys, sizes, informative, target=int(sizes.sum()), seed=seed, batch=batch) == copies).all()
