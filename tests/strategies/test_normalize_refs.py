"""The normalisation family (`normalize`), `maxrl` and `flash_reinforce` against the frameworks'
own code (AReaL's Normalization, TRL GRPOTrainer's advantage lines, OpenRLHF's experience
maker, SkyRL's compute_maxrl_advantage; tests/refs.py `load_extra`), the special cases that
equal an existing estimator, and hand-computed numbers. The references skip with the reason
where their wheel cannot be had."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import refs
from rescore.needs import NullableColumn
from rescore.transforms.strategies import ConfigError, chain_of
from test_estimators_refs import assert_close, ours


def extra(name):
    try:
        return refs.load_extra(name)
    except refs.RefsUnavailable as e:
        pytest.skip(str(e))


def fixed_groups(seed: int, *, size: int, batches: int = 2, tokens: bool = False) -> list[dict]:
    """Batches of groups of `size` rows (the references' fixed group layout), in (batch,
    task, run) order; ties, all-equal groups, negative rewards."""
    rng = random.Random(seed)
    rows = []
    for b in range(batches):
        for t in range(rng.randint(1, 6)):
            kind = rng.random()
            for run in range(size):
                reward = 0.5 if kind < 0.2 else float(rng.choice([0, 1])) if kind < 0.5 else rng.uniform(-2, 3)
                length = rng.randint(1, 6) if tokens else 1
                mask = [int(rng.random() > 0.3) for _ in range(length)] if tokens else [1]
                rows.append({
                    "batch": b, "task": t, "run": run, "step": 0, "reward": reward, "logprobs": [-0.5] * length,
                    "teacher_logprobs": [-0.5] * length, "action_mask": mask, "acc": 1.0, "fmt": 0.0,
                    "reward_baselines": 0.0, "env_state_hash": "s", "step_reward": 0.0,
                })
    return rows


def batches(rows):
    for b in sorted({r["batch"] for r in rows}):
        idx = [i for i, r in enumerate(rows) if r["batch"] == b]
        yield idx, [rows[i] for i in idx]


def scalar(got):
    return np.array([g[0] for g in got])


# --- AReaL ---------------------------------------------------------------------------------------

AREAL_CONFIGS = [
    {},  # AReaL's defaults: batch mean, batch std, unbiased, eps 1e-5
    {"mean_level": "group", "std_level": "group"},
    {"mean_level": "group", "std_level": "batch"},
    {"mean_level": "batch", "std_level": "group", "std_unbiased": False},
    {"mean_level": "group", "mean_leave1out": True, "std_level": "none"},
    {"mean_level": "group", "mean_leave1out": True, "std_level": "group"},
    {"mean_level": "group", "mean_leave1out": True, "std_level": "batch"},
    {"mean_level": "batch", "mean_leave1out": True, "std_level": "batch"},
    {"mean_level": "batch", "mean_leave1out": True, "std_level": "group", "std_unbiased": False},
    {"mean_level": "none", "std_level": "batch", "eps": 1e-3},
    {"mean_level": "none", "std_level": "none"},
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("config", AREAL_CONFIGS)
def test_normalize_matches_areal(seed, size, config):
    areal = extra("areal")
    rows = fixed_groups(seed, size=size)
    got = scalar(ours("normalize", config, rows))
    for idx, part in batches(rows):
        norm = areal.Normalization(areal.NormConfig(group_size=size, **{k: (None if v == "none" else v) for k, v in config.items()}))
        want = norm(torch.tensor([r["reward"] for r in part], dtype=torch.float64)).double().numpy()
        np.testing.assert_allclose(got[idx], want, rtol=1e-5, atol=1e-5, err_msg=str(config))


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("config", [{}, {"mean_level": "group", "std_level": "batch"}, {"mean_level": "batch", "std_level": "group", "std_unbiased": False}])
def test_normalize_token_weighting_matches_areal_with_a_loss_mask(seed, config):
    """weighting=token: AReaL's token-level statistics over the loss mask, the reward on every
    token of its response."""
    areal = extra("areal")
    rows = fixed_groups(seed, size=3, tokens=True)
    got = ours("normalize", {**config, "weighting": "token"}, rows)
    for idx, part in batches(rows):
        width = max(len(r["action_mask"]) for r in part)
        x = torch.zeros(len(part), width, dtype=torch.float64)
        mask = torch.zeros(len(part), width, dtype=torch.float64)
        for i, r in enumerate(part):
            x[i, : len(r["action_mask"])] = r["reward"]
            mask[i, : len(r["action_mask"])] = torch.tensor(r["action_mask"], dtype=torch.float64)
        if not mask.any():
            continue
        norm = areal.Normalization(areal.NormConfig(group_size=3, **config))
        want = norm(x, loss_mask=mask).double().numpy()
        for i, r in zip(idx, part):
            n = len(r["action_mask"])
            keep = np.asarray(r["action_mask"], bool)
            np.testing.assert_allclose(got[i][keep], want[i - idx[0]][:n][keep], rtol=1e-5, atol=1e-5, err_msg=str(config))


# --- TRL -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("scale_rewards", ["group", "batch", "none"])
def test_normalize_matches_trl_scale_rewards(seed, scale_rewards):
    trl = extra("trl")
    rows = fixed_groups(seed, size=4)
    params = {"mean_level": "group", "eps": 1e-4, "std_level": "none" if scale_rewards == "none" else scale_rewards}
    if scale_rewards == "batch":
        params["std_of"] = "reward"
    got = scalar(ours("normalize", params, rows))
    for idx, part in batches(rows):
        per_func = torch.tensor([[r["reward"]] for r in part], dtype=torch.float64)
        want = trl.advantages(per_func, [1.0], 4, scale_rewards, "sum_then_normalize").numpy()
        np.testing.assert_allclose(got[idx], want, rtol=1e-5, atol=1e-6)


# --- OpenRLHF ------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize(
    "estimator, strategy, params",
    [
        ("group_norm", "normalize", {"mean_level": "group", "std_level": "group", "eps": 1e-9}),
        ("reinforce_baseline", "normalize", {"mean_level": "group", "std_level": "none"}),
        ("dr_grpo", "dr_grpo", {}),
        ("rloo", "normalize", {"mean_level": "group", "mean_leave1out": True, "std_level": "none"}),
        ("rloo", "rloo", {}),
        ("flash_reinforce", "flash_reinforce", {}),
    ],
)
def test_openrlhf_estimators(seed, estimator, strategy, params):
    openrlhf = extra("openrlhf")
    rows = fixed_groups(seed, size=4)
    got = scalar(ours(strategy, params, rows))
    for idx, part in batches(rows):
        want = openrlhf.shaped(torch.tensor([r["reward"] for r in part], dtype=torch.float64), estimator, 4).numpy()
        if estimator == "group_norm":  # all-equal groups: OpenRLHF divides float dust by 1e-9; ours is exactly 0
            np.testing.assert_allclose(got[idx], np.where(np.abs(want) < 1e-5, 0.0, want), rtol=1e-6, atol=1e-9)
        else:
            np.testing.assert_allclose(got[idx], want, rtol=1e-6, atol=1e-9)


def test_flash_reinforce_is_the_batch_mean_baseline():
    rows = fixed_groups(0, size=1, batches=1)
    rows = [dict(r, reward=v) for r, v in zip(rows, [1.0, 0.0, 0.0, 3.0, 0.5, 1.5][: len(rows)])]
    rewards = np.array([r["reward"] for r in rows])
    np.testing.assert_allclose(scalar(ours("flash_reinforce", {}, rows)), rewards - rewards.mean(), atol=1e-12)
    equal = [dict(r, reward=0.1) for r in fixed_groups(1, size=3, batches=1)]
    assert not scalar(ours("flash_reinforce", {}, equal)).any()  # zero spread: exactly 0


# --- SkyRL ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_maxrl_matches_skyrl(seed):
    skyrl = extra("skyrl")
    rng = random.Random(seed)
    rows = []
    for t in range(8):
        for run in range(rng.choice([1, 2, 3, 5])):
            rows += fixed_groups(seed * 100 + t * 10 + run, size=1, batches=1)[:1]
            rows[-1].update(task=t, run=run, reward=rng.choice([0.0, 1.0, rng.uniform(0.1, 3)]))
    got = scalar(ours("maxrl", {}, rows))
    rewards = torch.tensor([[r["reward"]] for r in rows], dtype=torch.float64)
    index = np.array([r["task"] for r in rows])
    want, _ = skyrl.compute_maxrl_advantage(rewards, torch.ones_like(rewards), index)
    np.testing.assert_allclose(got, want[:, 0].numpy(), rtol=1e-6, atol=1e-9)


def test_maxrl_hand_numbers():
    base = fixed_groups(0, size=1, batches=1)[0]
    rows = [dict(base, task=t, run=i, reward=v) for i, (t, v) in enumerate([(0, 1.0), (0, 0.0), (0, 0.0), (1, 2.0)])]
    # Group 0: mean 1/3: (1 - 1/3) / (1/3 + 1e-6), (0 - 1/3) / (1/3 + 1e-6); group 1 alone: 2.
    m = 1 / 3
    np.testing.assert_allclose(scalar(ours("maxrl", {}, rows)), [(1 - m) / (m + 1e-6), -m / (m + 1e-6), -m / (m + 1e-6), 2.0], rtol=1e-12)


# --- special cases of existing estimators --------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_existing_estimators_are_special_cases(seed):
    rows = fixed_groups(seed, size=5, batches=3)
    same = [
        ("grpo", {}, {"mean_level": "group", "std_level": "group", "eps": 1e-6}),
        ("dr_grpo", {}, {"mean_level": "group", "std_level": "none"}),
        ("rloo", {}, {"mean_level": "group", "mean_leave1out": True, "std_level": "none"}),
    ]
    for name, params, norm in same:
        np.testing.assert_allclose(scalar(ours("normalize", norm, rows)), scalar(ours(name, params, rows)), rtol=1e-12, atol=1e-12, err_msg=name)


def test_normalize_hand_numbers():
    rows = fixed_groups(0, size=2, batches=1)[:4]
    rows = [dict(r, task=i // 2, run=i % 2, reward=v) for i, (r, v) in enumerate(zip(rows, [1.0, 0.0, 3.0, 1.0]))]
    # Batch mean 1.25; centred 3 - 1.25 ... ; unbiased batch std of [1, 0, 3, 1] = sqrt(4.75 / 3).
    s = np.sqrt(4.75 / 3)
    np.testing.assert_allclose(scalar(ours("normalize", {"eps": 0.0}, rows)), (np.array([1, 0, 3, 1]) - 1.25) / s, rtol=1e-12)
    # Group mean, batch std of the residuals (+-0.5, +-1) about 0, ddof 0: sqrt(2.5 / 4).
    got = scalar(ours("normalize", {"mean_level": "group", "std_unbiased": False, "eps": 0.0}, rows))
    np.testing.assert_allclose(got, np.array([0.5, -0.5, 1.0, -1.0]) / np.sqrt(2.5 / 4), rtol=1e-12)


def test_normalize_refuses_a_token_weighted_leave_one_out_mean():
    with pytest.raises(ConfigError, match="mean_leave1out"):
        chain_of("normalize", {"mean_leave1out": True, "weighting": "token"})


# --- multi-reward: TRL's normalize_then_sum with abstaining rewards -------------------------------


def multi_reward_rows(seed: int, size: int) -> list[dict]:
    rng = random.Random(seed)
    rows = fixed_groups(seed, size=size, batches=3)
    for r in rows:
        r["acc"] = None if rng.random() < 0.2 else float(rng.choice([0, 1]))
        r["fmt"] = None if rng.random() < 0.3 else rng.choice([0.0, 0.5, rng.uniform(-1, 1)])
    if rows:
        rows[0]["acc"] = rows[0]["fmt"] = None  # an unscorable row
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4, 5])
@pytest.mark.parametrize("size", [1, 2, 4])
@pytest.mark.parametrize("weights", [None, [1.0, 0.5]])
def test_normalize_then_sum_matches_trl(seed, size, weights):
    trl = extra("trl")
    rows = multi_reward_rows(seed, size)
    params = {"reward_keys": ["acc", "fmt"], "reward_weights": weights}
    got = scalar(ours("normalize_then_sum", params, rows))
    for idx, part in batches(rows):
        per_func = torch.tensor([[np.nan if r[k] is None else r[k] for k in ("acc", "fmt")] for r in part], dtype=torch.float64)
        want = trl.advantages(per_func, weights or [1.0, 1.0], size, "group", "normalize_then_sum").numpy()
        np.testing.assert_allclose(got[idx], want, rtol=1e-5, atol=1e-6)


def test_normalize_then_sum_hand_numbers():
    base = fixed_groups(0, size=1, batches=1)[0]
    # One group of 3: acc 1, 0, null; fmt 1, 1, 0. acc over its 2 values: mean .5, std sqrt(.5):
    # z = +-.5 / (sqrt(.5) + 1e-4); fmt: mean 2/3, std sqrt(1/3): z = (1/3, 1/3, -2/3) / (sqrt(1/3) + 1e-4).
    vals = [(1.0, 1.0), (0.0, 1.0), (None, 0.0)]
    rows = [dict(base, run=i, acc=a, fmt=f) for i, (a, f) in enumerate(vals)]
    za = 0.5 / (np.sqrt(0.5) + 1e-4)
    zf = np.array([1 / 3, 1 / 3, -2 / 3]) / (np.sqrt(1 / 3) + 1e-4)
    s = np.array([za, -za, 0.0]) + zf
    want = (s - s.mean()) / (s.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(scalar(ours("normalize_then_sum", {"reward_keys": ["acc", "fmt"]}, rows)), want, rtol=1e-12)


def test_normalize_then_sum_needs_its_columns():
    with pytest.raises(ConfigError, match="twice"):
        chain_of("normalize_then_sum", {"reward_keys": ["a", "a"]})
    assert chain_of("normalize_then_sum").needs == ()  # the reward column alone
    with pytest.raises(ConfigError, match="2 weights for 1"):
        chain_of("normalize_then_sum", {"reward_keys": ["a"], "reward_weights": [1, 2]})
    assert chain_of("normalize_then_sum", {"reward_keys": ["a", "b"]}).needs == (NullableColumn("a"), NullableColumn("b"))


@pytest.mark.parametrize("seed", [0, 1])
def test_normalize_then_sum_of_the_reward_alone_matches_trl(seed):
    trl = extra("trl")
    rows = fixed_groups(seed, size=4, batches=2)
    got = scalar(ours("normalize_then_sum", {}, rows))
    for idx, part in batches(rows):
        per_func = torch.tensor([[r["reward"]] for r in part], dtype=torch.float64)
        want = trl.advantages(per_func, [1.0], 4, "group", "normalize_then_sum").numpy()
        np.testing.assert_allclose(got[idx], want, rtol=1e-5, atol=1e-6)
