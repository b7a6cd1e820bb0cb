"""Reward shaping strategies (the `shape` stage): hand numbers, the chain's order and rules, and
Trinity-RFT 0.6.0's own RewardShapingMapper and MathDAPORewardFn.compute_overlong_penalty."""

from __future__ import annotations

import os

import pytest
import torch

import refs
from rescore.errors import ConfigError
from rescore.needs import OptionalColumn
from rescore.transforms.strategies import chain_of
from rescore.transforms.strategies.base import GroupedRows
from rescore.transforms.strategies.filters import string_key
from rescore.transforms.strategies.shaping import overlong_penalty


def rows(reward, *, length=None, columns=None, offsets=None):
    n = len(reward)
    t = lambda v, d=torch.int64: torch.tensor(v, dtype=d)  # noqa: E731
    return GroupedRows(
        reward=t(reward, torch.float64), offsets=t(offsets or [0, n]), batch=t([0] * n), run=t(list(range(n))),
        step=t([0] * n), action_tokens=t(length or [1] * n), response_length=t(length or [1] * n),
        columns={k: t(v, torch.float64) if isinstance(v[0], float) else t(v) for k, v in (columns or {}).items()},
    )


def shaped(strategy, params, r):
    return chain_of(strategy, params).shaped(r).reward.tolist()


def test_scale_bias_clip_by_hand():
    r = rows([-2.0, 0.0, 0.5, 3.0])
    assert shaped("reward_shaping", {"scale": 2.0, "bias": 1.0}, r) == [-3.0, 1.0, 2.0, 7.0]
    assert shaped("reward_shaping", {"scale": 2.0, "bias": 1.0, "clip_min": -1.0, "clip_max": 2.5}, r) == [-1.0, 1.0, 2.0, 2.5]
    assert shaped("reward_shaping", {"clip_max": 0.0}, r) == [-2.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "op, want",
    [("add", [2.0, 1.0, 0.0, 3.0]), ("sub", [0.0, 1.0, 0.0, 3.0]), ("mul", [1.0, 1.0, 0.0, 3.0]), ("div", [1.0, 1.0, 0.0, 3.0])],
)
def test_column_op_by_hand(op, want):
    # rows: x = 2 (weight 0.5 -> 1), x = 0 (div by 0 leaves r), x missing (NaN leaves r), x = 4 (w x = 2)
    r = rows([1.0, 1.0, 0.0, 3.0], columns={"q": [2.0, 0.0, float("nan"), 4.0]})
    got = shaped("reward_shaping", {"stats_key": "q", "op_type": op, "weight": 0.5}, r)
    exact = {"add": [2.0, 1.0, 0.0, 5.0], "sub": [0.0, 1.0, 0.0, 1.0], "mul": [1.0, 0.0, 0.0, 6.0], "div": [1.0, 1.0, 0.0, 1.5]}
    assert got == exact[op]


def test_overlong_penalty_by_hand():
    # max 10, buffer 4, factor 2: expected length 6; 7 tokens -> -0.5, 10 -> -2, 12 -> -2
    lengths = torch.tensor([0, 6, 7, 8, 10, 12])
    assert overlong_penalty(lengths, 10, 4, 2.0).tolist() == [0.0, 0.0, -0.5, -1.0, -2.0, -2.0]
    r = rows([1.0] * 6, length=lengths.tolist())
    got = shaped("dapo_overlong_penalty", {"max_resp_len": 10, "overlong_buffer_len": 4, "penalty_factor": 2.0}, r)
    assert got == [1.0, 1.0, 0.5, 0.0, -1.0, -1.0]


def test_truncated_reward_by_hand():
    status = [string_key("response_truncated"), string_key("none"), 0]
    r = rows([1.0, 1.0, -1.0], columns={"truncate_status": [int(s) for s in status]})
    assert shaped("truncated_reward", {}, r) == [0.0, 1.0, -1.0]
    assert shaped("truncated_reward", {"value": -0.5, "mode": "add"}, r) == [0.5, 1.0, -1.0]
    bools = rows([1.0, 1.0], columns={"truncated": [1.0, 0.0]})
    assert shaped("truncated_reward", {"truncate_status_key": "truncated", "value": -1.0}, bools) == [-1.0, 1.0]


def test_reward_sum_by_hand():
    r = rows([9.0, 9.0], columns={"a": [1.0, 0.0], "b": [0.5, 2.0]})
    assert shaped("reward_sum", {"reward_keys": ["a", "b"], "reward_weights": [2.0, -1.0]}, r) == [1.5, -2.0]
    assert shaped("reward_sum", {"reward_keys": "a,b"}, r) == [1.5, 2.0]


def test_shaping_stages_chain_in_order_and_every_stage_sees_the_shaped_rewards():
    r = rows([0.0, 1.0, 1.0, 1.0], length=[1, 1, 8, 12], offsets=[0, 2, 4])
    params = {"max_resp_len": 10, "overlong_buffer_len": 4, "penalty_factor": 1.0, "scale": 2.0}
    a = chain_of("dapo_overlong_penalty,reward_shaping,reward_variance,grpo", params)
    b = chain_of("reward_shaping,dapo_overlong_penalty,reward_variance,grpo", params)
    assert a.shaped(r).reward.tolist() == [0.0, 2.0, 1.0, 0.0]  # 2 * (1 - 0.5), 2 * (1 - 1)
    assert b.shaped(r).reward.tolist() == [0.0, 2.0, 1.5, 1.0]  # 2 * 1 - 0.5, 2 * 1 - 1
    s = a.score(r)
    assert s.reward.tolist() == [0.0, 2.0, 1.0, 0.0]
    # GRPO on the shaped rewards: groups [0, 2] and [1, 0], each +-(half the gap) / std (ddof 1)
    h = 2**-0.5
    assert s.score.tolist() == pytest.approx([-h, h, h, -h], abs=1e-5)
    # reward_variance drops a group whose shaped rewards have no spread
    flat = chain_of("reward_shaping,reward_variance,grpo", {"clip_max": 0.0}).score(r)
    assert flat.keep.tolist() == [False, False, False, False] and flat.reward.tolist() == [0.0] * 4
    # without shaping the chain reports no shaped reward
    assert chain_of("grpo").score(r).reward is None


def test_chain_rules():
    with pytest.raises(ConfigError, match="in the order filter, advantage, duplicate"):
        chain_of("grpo,reward_shaping")
    with pytest.raises(ConfigError, match="in the order filter, advantage, duplicate"):
        chain_of("reward_variance,truncated_reward,grpo")
    with pytest.raises(ConfigError, match="appears twice"):
        chain_of("reward_shaping,reward_shaping,grpo")
    with pytest.raises(ConfigError, match="max_resp_len >= overlong_buffer_len"):
        chain_of("dapo_overlong_penalty", {"max_resp_len": 100})
    with pytest.raises(ConfigError, match="clip_min <= clip_max"):
        chain_of("reward_shaping", {"clip_min": 1.0, "clip_max": 0.0})
    with pytest.raises(ConfigError, match="names no column"):
        chain_of("reward_sum", {"reward_keys": []})
    assert chain_of("reward_sum").shaped(rows([1.5, -2.0], columns={"reward": [1.5, -2.0]})).reward.tolist() == [1.5, -2.0]
    assert chain_of("reward_shaping", {"stats_key": "q"}).needs == (OptionalColumn("q"),)


# --- against Trinity-RFT 0.6.0's own code --------------------------------------------------------


@pytest.fixture(scope="module")
def trinity_shaping():
    try:
        src = refs._unpacked()
    except refs.RefsUnavailable as e:
        pytest.skip(str(e))
    import enum
    from typing import Dict, List, Optional, Tuple

    constants = refs._exec_file(os.path.join(src, "trinity/common/constants.py"), "trinity.common.constants")
    with refs._stubs({
        "trinity": refs._module("trinity"), "trinity.common": refs._module("trinity.common"),
        "trinity.common.constants": constants,
        "trinity.common.experience": refs._module("trinity.common.experience", Experience=refs.Experience),
        "trinity.buffer": refs._module("trinity.buffer"),
        "trinity.buffer.operators": refs._module("trinity.buffer.operators", ExperienceOperator=object),
    }):
        mapper = refs._exec_file(os.path.join(src, "trinity/buffer/operators/mappers/reward_shaping_mapper.py"), "_ref_trinity_shaping")
    dapo = refs._extract(
        os.path.join(src, "trinity/common/rewards/dapo_reward.py"), {"MathDAPORewardFn"},
        {"RewardFn": object, "compute_score": None, "torch": torch, "Optional": Optional, "__name__": "_ref_trinity_dapo"},
    )
    del enum, Dict, List, Tuple
    return mapper.RewardShapingMapper, dapo["MathDAPORewardFn"]


@pytest.mark.parametrize("op", ["ADD", "SUB", "MUL", "DIV"])
@pytest.mark.parametrize("weight", [1.0, 0.5, -2.0])
def test_column_op_matches_trinity(trinity_shaping, op, weight):
    mapper_cls, _ = trinity_shaping
    rewards = [1.0, -0.5, 0.0, 2.0, 3.0, 0.25]
    stats = [2.0, 0.0, None, -1.5, 0.5, 4.0]  # None: the key is missing from the row's info
    exps = [refs.Experience(i, r, None, info={} if s is None else {"quality": s, "other": 1}) for i, (r, s) in enumerate(zip(rewards, stats))]
    got_exps, _ = mapper_cls([{"stats_key": "quality", "op_type": op, "weight": weight}]).process(exps)
    r = rows(rewards, columns={"quality": [float("nan") if s is None else s for s in stats]})
    ours = shaped("reward_shaping", {"stats_key": "quality", "op_type": op.lower(), "weight": weight}, r)
    assert ours == pytest.approx([e.reward for e in got_exps], abs=1e-15)


@pytest.mark.parametrize("max_len, cache, factor", [(20, 8, 1.0), (16, 4, 0.5), (9, 1, 2.0)])
def test_overlong_penalty_matches_trinity_and_verl(trinity_shaping, max_len, cache, factor):
    _, dapo_cls = trinity_shaping
    fn = dapo_cls(enable_overlong_penalty=True, penalty_factor=factor, max_response_length=max_len, cache_length=cache)
    lengths = list(range(0, max_len + 6))
    want = [fn.compute_overlong_penalty(torch.zeros(n)) for n in lengths]
    got = overlong_penalty(torch.tensor(lengths), max_len, cache, factor).tolist()
    assert got == pytest.approx(want, abs=1e-12)
    # verl DAPORewardManager (responses never exceed max_resp_len there): min(-exceed / len * factor, 0)
    verl = [min(-(n - (max_len - cache)) / cache * factor, 0) for n in lengths if n <= max_len]
    assert got[: len(verl)] == pytest.approx(verl, abs=1e-12)
    assert min(want) == -factor and want.count(0.0) == max_len - cache + 1
