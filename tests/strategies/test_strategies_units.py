"""The pure strategy functions (no Beam): published formulas, edge cases and the copy plan."""

import math

import numpy as np
import pytest
import torch

from rescore.transforms.strategies import ConfigError, GroupedRows, algorithms, create, chain_of
from rescore.transforms.strategies.baselines import (
    logavgexp_baseline,
    rloo_scores,
    whiten_stats,
)
from rescore.transforms.strategies.chord import mu_schedule, phi
from rescore.transforms.rows.copies import copy_task_ids, plan_copies
from rescore.transforms.strategies.step_wise import runs_of

F64 = torch.float64


def grouped(rewards, sizes, *, run=None, step=None, tokens=None, expert=None):
    n = len(rewards)
    offsets = torch.tensor([0, *np.cumsum(sizes).tolist()])
    return GroupedRows(
        reward=torch.tensor(rewards, dtype=F64),
        offsets=offsets,
        batch=torch.zeros(n, dtype=torch.int64),
        run=torch.tensor(run if run is not None else list(range(n))),
        step=torch.tensor(step if step is not None else [0] * n),
        action_tokens=torch.tensor(tokens if tokens is not None else [1] * n),
        expert=None if expert is None else torch.tensor(expert),
    )


def test_opmd_mean_and_singleton():
    s = create("opmd").score(grouped([1.0, 2.0, 6.0, 4.0], [3, 1]), None)
    assert s.score.tolist() == pytest.approx([-2.0, -1.0, 3.0, 4.0])  # the singleton keeps its reward


def test_opmd_logavgexp_matches_the_formula_and_is_stable():
    r = [0.3, 1.0, -2.0]
    s = create("opmd", {"opmd_baseline": "logavgexp", "tau": 0.5}).score(grouped(r, [3]), None)
    b = 0.5 * (math.log(sum(math.exp(x / 0.5) for x in r)) - math.log(3))
    assert s.score.tolist() == pytest.approx([x - b for x in r], rel=1e-12)
    # exp(1000 / 0.01) overflows float64; the shifted form does not.
    big = logavgexp_baseline(torch.tensor([1000.0, 999.0], dtype=F64), torch.tensor([0, 2]), 0.01)
    assert math.isfinite(big.item()) and big.item() == pytest.approx(1000 + 0.01 * (math.log(1 + math.exp(-100)) - math.log(2)))


def test_asymre_shift_and_singleton_baseline_zero():
    s = create("asymre").score(grouped([1.0, 3.0, 5.0], [2, 1]), None)
    assert s.score.tolist() == pytest.approx([1 - (2 - 0.1), 3 - (2 - 0.1), 5.0])


def test_rloo_is_reward_minus_mean_of_the_others():
    r = torch.tensor([1.0, 4.0, 2.0, 7.0, 3.0], dtype=F64)
    got = rloo_scores(r, torch.tensor([0, 4, 5])).tolist()
    assert got[:4] == pytest.approx([1 - 13 / 3, 4 - 10 / 3, 2 - 12 / 3, 7 - 7 / 3])
    assert got[4] == 3.0


def test_dr_grpo_has_no_std_division():
    s = create("dr_grpo").score(grouped([0.0, 10.0, 4.0], [2, 1]), None)
    assert s.score.tolist() == [-5.0, 5.0, 4.0]


def test_whiten_stats_is_token_weighted_with_bessel_correction():
    s, w = np.array([1.0, -1.0, 0.5]), np.array([2.0, 1.0, 0.0])
    mu, var = whiten_stats(s, w)
    assert mu == pytest.approx((2 - 1) / 3)
    assert var == pytest.approx((2 * (1 - 1 / 3) ** 2 + (-1 - 1 / 3) ** 2) / 2)
    assert whiten_stats(np.array([3.0]), np.array([1.0])) == (3.0, 0.0)
    assert whiten_stats(np.array([3.0]), np.array([0.0])) == (0.0, 0.0)


def test_reinforce_plus_plus_whitens_with_batch_stats():
    strategy = create("reinforce_plus_plus_baseline")
    rows = grouped([0.0, 1.0, 5.0], [2, 1], tokens=[3, 1, 2])
    batch, values, weights = strategy.batch_values(rows)
    assert values.tolist() == [-0.5, 0.5, 5.0] and weights.tolist() == [3.0, 1.0, 2.0]
    mu, var = strategy.batch_stats(values.numpy(), weights.numpy())
    s = strategy.score(rows, torch.tensor([[mu, var]] * 3, dtype=F64))
    assert s.score.tolist() == pytest.approx([(v - mu) / math.sqrt(var + 1e-8) for v in (-0.5, 0.5, 5.0)])


def test_step_wise_last_step_is_the_largest_step_not_the_last_row():
    # Rows are sorted by (run, step); run 0 has steps 2 and 7, run 1 steps 0, 1, 4.
    rows = grouped([9.0, 1.0, 5.0, 5.0, 3.0], [5], run=[0, 0, 1, 1, 1], step=[2, 7, 0, 1, 4])
    runs = runs_of(rows)
    assert runs.last_reward.tolist() == [1.0, 3.0]
    s = create("step_wise_grpo", {"enable_step_norm": True}).score(rows, None)
    mean, std = 2.0, math.sqrt(2.0)
    k0, k1 = (1 - mean) / (std + 1e-6), (3 - mean) / (std + 1e-6)
    assert s.score.tolist() == pytest.approx([k0, k0, k1, k1, k1])
    assert s.token_scale.tolist() == pytest.approx([1 / 2, 1 / 2, 1 / 3, 1 / 3, 1 / 3])


def test_step_wise_threshold_drops_single_run_groups_whole():
    rows = grouped([1.0, 2.0, 0.0, 1.0], [2, 2], run=[0, 0, 0, 1], step=[0, 1, 0, 0])
    s = create("step_wise_grpo", {"std_threshold": 0.0}).score(rows, None)
    assert s.keep.tolist() == [False, False, True, True]


def test_reward_variance_uses_population_variance():
    # var([0, 1]) = 0.25 (ddof=0); 0.3 drops it, 0.2 keeps it.
    rows = grouped([0.0, 1.0, 2.0], [2, 1])
    assert create("reward_variance", {"variance_threshold": 0.2}).score(rows, None).keep.tolist() == [True, True, False]
    assert create("reward_variance", {"variance_threshold": 0.3}).score(rows, None).keep.tolist() == [False, False, False]


def test_raft_keeps_top_positive_rows_with_weight():
    s = create("raft").score(grouped([1.0, 3.0, 3.0, 0.0, 0.0], [3, 2]), None)
    assert s.keep.tolist() == [False, True, True, False, False]
    assert s.score.tolist() == [1.0] * 5


def test_mix_chord_scores_only_non_expert_rows():
    rows = grouped([1.0, 0.0, 5.0, 2.0], [4], expert=[False, False, True, False])
    s = create("mix_chord").score(rows, None)
    usual = [1.0, 0.0, 2.0]
    mean, std = 1.0, 1.0
    assert s.score.tolist() == pytest.approx([(1 - mean) / (std + 1e-6), (0 - mean) / (std + 1e-6), 0.0, (2 - mean) / (std + 1e-6)])
    assert s.group_mean.tolist() == pytest.approx([np.mean(usual)])


def test_mu_schedule_matches_trinity():
    assert mu_schedule(0, 0, 0, 0.1, 0.1) == 0.1
    assert mu_schedule(5, 10, 20, 0.8, 0.2) == pytest.approx(0.4)
    assert mu_schedule(10, 10, 20, 0.8, 0.2) == pytest.approx(0.8)
    assert mu_schedule(20, 10, 20, 0.8, 0.2) == pytest.approx(0.5)
    assert mu_schedule(30, 10, 20, 0.8, 0.2) == 0.2
    assert phi(np.log([0.5, 1.0, 0.1])).tolist() == pytest.approx([0.25, 0.0, 0.09])


def test_plan_copies_reaches_the_target_by_whole_groups():
    rng = np.random.default_rng(0)
    for trial in range(200):
        g = int(rng.integers(1, 30))
        sizes = rng.integers(1, 9, g)
        informative = rng.random(g) < 0.4
        target = int(sizes.sum())
        keys = np.sort(rng.integers(0, 2**63, g).astype(np.uint64))
        copies = plan_copies(keys, sizes, informative, target=target, seed=3, batch=trial)
        assert (copies[~informative] == 0).all()
        if not informative.any():
            assert not copies.any()
            continue
        written = int((sizes * (1 + copies))[informative].sum())
        assert target <= written < target + sizes[informative].max() or copies.sum() == 0
        # Rounds: copy counts differ by at most one.
        assert copies[informative].max() - copies[informative].min() <= 1
        again = plan_copies(keys, sizes, informative, target=target, seed=3, batch=trial)
        assert (again == copies).all()


def test_plan_copies_depends_on_seed_and_batch_only():
    keys = np.arange(100, dtype=np.uint64) * np.uint64(7919)
    sizes, informative = np.full(100, 4), np.arange(100) % 3 == 0
    a = plan_copies(keys, sizes, informative, target=400, seed=0, batch=1)
    assert not (a == plan_copies(keys, sizes, informative, target=400, seed=1, batch=1)).all()
    assert not (a == plan_copies(keys, sizes, informative, target=400, seed=0, batch=2)).all()
    # Enough informative rows already: no copies.
    assert not plan_copies(keys, sizes, np.ones(100, bool), target=400, seed=0, batch=1).any()


def test_copy_task_ids():
    import pyarrow as pa

    assert copy_task_ids(pa.array([3, 5]), np.array([1, 2]), 10).to_pylist() == [13, 25]
    assert copy_task_ids(pa.array(["a", "b"]), np.array([1, 2]), 0).to_pylist() == ["a#copy1", "b#copy2"]


def test_plan_order_and_parameter_routing():
    plan = chain_of("reward_variance,grpo,duplicate_informative", {"epsilon": 0.1, "duplicate_informative.seed": 4})
    assert [s.name for s in plan.stages] == ["reward_variance", "grpo", "duplicate_informative"]
    assert plan.stage("advantage").epsilon == 0.1 and plan.stage("duplicate").seed == 4
    assert plan.params["reward_variance"] == {"variance_threshold": 0.0}
    assert chain_of("grpo", {"grpo": {"epsilon": 0.5}}).stage("advantage").epsilon == 0.5
    with pytest.raises(ConfigError, match="order filter, advantage, duplicate"):
        chain_of("duplicate_informative,grpo")
    with pytest.raises(ConfigError, match="seed.*integer"):
        chain_of("duplicate_informative", {"seed": 1.5})


@pytest.mark.parametrize(
    "algorithm, strategies",
    [
        ("grpo", ("grpo",)),
        ("opmd", ("opmd",)),
        ("asymre", ("asymre",)),
        ("multi_step_grpo", ("step_wise_grpo",)),
        ("rloo", ("rloo",)),
        ("reinforceplusplus", ("reinforceplusplus",)),
        ("reinforce_plus_plus", ("reinforce_plus_plus",)),
        ("raft", ("raft",)),
        ("sft", ("constant",)),
        ("mix_chord", ("mix_chord",)),
        ("on_policy_distill", ("on_policy_distill",)),
    ],
)
def test_algorithm_presets(algorithm, strategies):
    assert algorithms.preset(algorithm).strategies == strategies
    chain_of(list(strategies), algorithms.preset(algorithm).params)  # the defaults are valid


@pytest.mark.parametrize("algorithm, why", [("ppo", "critic"), ("dpo", "pairs")])
def test_algorithms_that_need_the_trainer_fail_with_a_reason(algorithm, why):
    with pytest.raises(ConfigError, match=why):
        algorithms.preset(algorithm)
