"""Issue 13 item 2: exact zero spread. A group (or batch) whose rewards are all equal has mean =
that reward, std = var = 0 exactly and scores exactly 0 (epsilon = 0 included), is dropped by
every `std <= threshold` / `var <= threshold` filter (threshold 0 included) and is never copied.

The rewards are chosen so that naive float sums are NOT exact (0.1, 0.2, 0.7; groups of 3 and
6): the first test proves that, so the others cannot pass by luck.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rescore.transforms.strategies import GroupedRows, chain_of
from rescore.transforms.strategies.baselines import whiten_stats
from rescore.transforms.strategies.segments import group_stats, mean_and_std, population_var, std_of, zero_spread

F64 = torch.float64
FLAT = [(0.1, 6), (0.7, 3), (0.2, 3), (0.1, 3), (0.7, 6), (0.2, 6)]
"""(reward, group size) of all-equal groups."""


def test_naive_float_math_is_not_exact_for_these_groups():
    naive = [sum([r] * n) / n for r, n in FLAT]
    assert any(m != r for m, (r, _) in zip(naive, FLAT))
    # and the one the issue quotes: six rewards of 0.1 give a naive std of ~1.4e-17
    t = torch.tensor([0.1] * 6, dtype=F64)
    assert (t - t.sum() / 6).abs().max().item() > 0


def _flat_rows():
    rewards, sizes = [], []
    for r, n in FLAT:
        rewards += [r] * n
        sizes.append(n)
    return rewards, sizes


def grouped(rewards, sizes, *, batch=None, run=None, step=None, tokens=None, expert=None, logprob=None):
    n = len(rewards)
    return GroupedRows(
        reward=torch.tensor(rewards, dtype=F64),
        offsets=torch.tensor([0, *np.cumsum(sizes).tolist()]),
        batch=torch.tensor(batch if batch is not None else [0] * n),
        run=torch.tensor(run if run is not None else list(range(n))),
        step=torch.tensor(step if step is not None else [0] * n),
        action_tokens=torch.tensor(tokens if tokens is not None else [3] * n),
        mean_logprob=None if logprob is None else torch.tensor(logprob, dtype=F64),
        expert=None if expert is None else torch.tensor(expert),
    )


def test_segment_statistics_are_exact():
    rewards, sizes = _flat_rows()
    values, offsets = torch.tensor(rewards, dtype=F64), torch.tensor([0, *np.cumsum(sizes).tolist()])
    mean, std = mean_and_std(values, offsets)
    assert mean.tolist() == [r for r, _ in FLAT]
    assert std.tolist() == [0.0] * len(FLAT)
    assert population_var(values, offsets).tolist() == [0.0] * len(FLAT)
    assert zero_spread(values, offsets).all()
    gm, gs = group_stats(values, offsets)
    assert gm.tolist() == [r for r, _ in FLAT] and gs.tolist() == [0.0] * len(FLAT)
    assert std_of(torch.tensor([0.7] * 6, dtype=F64)).item() == 0.0
    # not flat: untouched two-pass statistics
    mean, std = mean_and_std(torch.tensor([0.1, 0.2, 0.7], dtype=F64), torch.tensor([0, 3]))
    assert mean.item() == pytest.approx(1 / 3) and std.item() == pytest.approx(np.std([0.1, 0.2, 0.7], ddof=1), rel=1e-15)
    # one ulp apart is not flat
    assert not zero_spread(torch.tensor([0.1, 0.1, np.nextafter(0.1, 1.0)], dtype=F64), torch.tensor([0, 3])).item()
    # a singleton keeps the spec's mean 0, std 1; empty input is fine
    assert [t.tolist() for t in group_stats(torch.tensor([0.3], dtype=F64), torch.tensor([0, 1]))] == [[0.0], [1.0]]
    assert zero_spread(torch.zeros(0, dtype=F64), torch.tensor([0])).numel() == 0


def test_whitening_of_equal_values_is_exact():
    for v, n in FLAT:
        values, weights = np.full(n, v), np.full(n, 3.0)
        assert whiten_stats(values, weights) == (v, 0.0)
    # rows without weight do not count: the weighted values are all 0.7
    assert whiten_stats(np.array([0.1, 0.7, 0.7, 0.7]), np.array([0.0, 2.0, 5.0, 1.0])) == (0.7, 0.0)


GROUP_STRATEGIES = [
    ("grpo", {}, 0.0),
    ("grpo", {"epsilon": 0.0}, 0.0),
    ("grpo", {"std_cal_level": "batch", "epsilon": 0.0}, 0.0),
    ("dr_grpo", {}, 0.0),
    ("rloo", {}, 0.0),
    ("opmd", {}, 0.0),
    ("opmd", {"opmd_baseline": "logavgexp"}, 0.0),
    ("opmd", {"opmd_baseline": "logavgexp", "tau": 0.05}, 0.0),
    ("opmd", {"opmd_baseline": "logavgexp", "tau": 3.7}, 0.0),
    ("asymre", {}, 0.1),
    ("asymre", {"baseline_shift": 0.3}, -0.3),
    ("step_wise_grpo", {}, 0.0),
    ("step_wise_grpo", {"epsilon": 0.0, "std_cal_level": "batch"}, 0.0),
    ("reinforce_plus_plus_baseline", {}, 0.0),
    ("correct_bias", {"epsilon": 0.0}, None),  # only rewards of 0 stay equal after the rank correction
    ("mix_chord", {"epsilon": 0.0}, 0.0),
]


def _score(plan, rows):
    """plan.score with batch statistics computed as the pipeline does (sorted per batch)."""
    stats = None
    if plan.batch_level:
        b, v, w = (x.numpy() for x in plan.batch_values(rows))
        table = {}
        for batch in np.unique(rows.batch.numpy()):
            at = b == batch
            order = np.lexsort((w[at], v[at]))
            table[int(batch)] = plan.batch_stats(v[at][order], w[at][order])
        stats = torch.tensor([table[int(x)] for x in rows.batch.tolist()], dtype=F64)
    return plan.score(rows, stats)


@pytest.mark.parametrize("name, params, expected", GROUP_STRATEGIES)
def test_all_equal_groups_score_exactly(name, params, expected):
    rewards, sizes = _flat_rows()
    n = len(rewards)
    kwargs = {}
    if name == "correct_bias":
        rewards = [0.0] * n
        kwargs["logprob"] = [-(i % 5) / 7 for i in range(n + 3)]
        expected = 0.0
    if name == "mix_chord":
        kwargs["expert"] = [i % 4 == 0 and i < n for i in range(n + 3)]
    # batch 0: the flat groups, plus an informative group in batch 1 (batch std not 0 there)
    rows = grouped(rewards + [0.1, 0.2, 0.7], sizes + [3], batch=[0] * n + [1] * 3, **kwargs)
    s = _score(chain_of(name, params), rows)
    assert torch.isfinite(s.score).all()
    got = s.score[:n].tolist()
    assert got == [expected] * n, got
    assert s.group_std[: len(FLAT)].tolist() == [0.0] * len(FLAT)
    if name != "mix_chord":
        assert s.group_mean[: len(FLAT)].tolist() == [0.0 if name == "correct_bias" else r for r, _ in FLAT]
    assert s.score[n:].abs().min().item() > 0.01  # the informative group is scored normally


def test_step_wise_uses_the_exact_rule_on_last_step_rewards():
    # each run: a first step with a varying reward, a last step of 0.7 (groups of 3 and 6 runs)
    rewards, run, step, sizes = [], [], [], []
    for runs in (3, 6):
        for k in range(runs):
            rewards += [0.1 * k, 0.7]
            run += [k, k]
            step += [0, 4]
        sizes.append(2 * runs)
    rows = grouped(rewards, sizes, run=run, step=step)
    for params in ({"epsilon": 0.0}, {"epsilon": 0.0, "std_cal_level": "batch"}, {"enable_step_norm": True}):
        s = _score(chain_of("step_wise_grpo", params), rows)
        assert s.score.tolist() == [0.0] * len(rewards)
    s = _score(chain_of("step_wise_grpo", {"std_threshold": 0.0}), rows)
    assert not s.keep.any()


def test_batch_of_equal_rewards_scores_zero_even_for_groups_of_one():
    """std_cal_level=batch over a batch whose rewards are all 0.1 (groups of one, three and
    six): batch std exactly 0, every score exactly 0, never r / epsilon or inf/NaN."""
    rewards, sizes = [0.1] * 10, [1, 3, 6]
    for params in ({"std_cal_level": "batch"}, {"std_cal_level": "batch", "epsilon": 0.0}):
        s = _score(chain_of("grpo", params), grouped(rewards, sizes))
        assert s.score.tolist() == [0.0] * 10
    # REINFORCE++: the shaped scores of groups of one are their rewards, all 0.7: flat batch.
    s = _score(chain_of("reinforce_plus_plus_baseline"), grouped([0.7] * 3, [1, 1, 1]))
    assert s.score.tolist() == [0.0] * 3


@pytest.mark.parametrize(
    "name, params",
    [
        ("grpo", {"std_threshold": 0.0}),
        ("grpo", {"std_threshold": 0.0, "std_cal_level": "batch"}),
        ("step_wise_grpo", {"std_threshold": 0.0}),
        ("reward_variance", {}),
        ("reward_variance", {"variance_threshold": 0.0}),
        ("duplicate_informative", {}),
        ("reward_variance,grpo,duplicate_informative", {"std_cal_level": "batch"}),
        ("grpo,duplicate_informative", {"std_threshold": 0.0}),
    ],
)
def test_threshold_zero_filters_drop_all_equal_groups(name, params):
    rewards, sizes = _flat_rows()
    n = len(rewards)
    rows = grouped(rewards + [0.1, 0.2, 0.7], sizes + [3])
    s = _score(chain_of(name, params), rows)
    assert s.keep.tolist() == [False] * n + [True] * 3
    if s.informative is not None:  # duplication may copy only the informative group
        assert s.informative.tolist() == [False] * len(FLAT) + [True]


# --- properties -------------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(
    groups=st.lists(
        st.tuples(st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False), st.integers(2, 12)), min_size=1, max_size=6
    ),
    epsilon=st.sampled_from([0.0, 1e-6]),
)
def test_any_all_equal_group_has_exact_statistics_and_scores_zero(groups, epsilon):
    rewards = [v for v, n in groups for _ in range(n)]
    sizes = [n for _, n in groups]
    values, offsets = torch.tensor(rewards, dtype=F64), torch.tensor([0, *np.cumsum(sizes).tolist()])
    mean, std = mean_and_std(values, offsets)
    assert mean.tolist() == [v for v, _ in groups] and std.tolist() == [0.0] * len(groups)
    assert population_var(values, offsets).tolist() == [0.0] * len(groups)
    rows = grouped(rewards, sizes)
    for name in ("grpo", "rloo", "dr_grpo", "opmd"):
        assert _score(chain_of(name, {"epsilon": epsilon} if name == "grpo" else {}), rows).score.tolist() == [0.0] * len(rewards)
    assert not _score(chain_of("grpo", {"std_threshold": 0.0}), rows).keep.any()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False), min_size=2, max_size=20))
def test_groups_that_are_not_flat_keep_two_pass_statistics(values):
    if max(values) == min(values):
        return
    mean, std = mean_and_std(torch.tensor(values, dtype=F64), torch.tensor([0, len(values)]))
    assert mean.item() == pytest.approx(float(np.mean(values)), rel=1e-12, abs=1e-9)
    assert std.item() == pytest.approx(float(np.std(values, ddof=1)), rel=1e-9, abs=1e-12)
