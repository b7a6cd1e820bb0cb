"""GRPO and rank-bias correction against the spec's numbers and Trinity-RFT's test vectors."""

import math

import pytest
import torch

from rescore.transforms.strategies import ConfigError, GroupedRows, create, names
from rescore.transforms.strategies.grpo import grpo_scores, rank_corrected_rewards
from rescore.transforms.strategies.segments import (
    mean_and_std,
    rank_within_groups,
    segment_sum,
    std_of,
)

F64 = torch.float64


def rows(rewards, sizes, *, batch=None, mean_logprob=None):
    n = len(rewards)
    offsets = torch.tensor([0, *torch.tensor(sizes).cumsum(0).tolist()])
    return GroupedRows(
        reward=torch.tensor(rewards, dtype=F64),
        offsets=offsets,
        batch=torch.tensor(batch if batch is not None else [0] * n),
        run=torch.arange(n),
        step=torch.zeros(n, dtype=torch.int64),
        action_tokens=torch.ones(n, dtype=torch.int64),
        mean_logprob=None if mean_logprob is None else torch.tensor(mean_logprob, dtype=F64),
    )


def test_trinity_groups_of_five_mean_and_std():
    # Trinity-RFT test_grpo_advantage: 3 tasks, rewards 0..4 per task.
    s = create("grpo").score(rows([0, 1, 2, 3, 4] * 3, [5, 5, 5]), None)
    assert s.group_mean.tolist() == [2.0, 2.0, 2.0]
    expected_std = torch.std(torch.tensor([0, 1, 2, 3, 4], dtype=torch.float32)).item()
    assert s.group_std.tolist() == pytest.approx([expected_std] * 3, rel=1e-7)
    assert s.score[:5].tolist() == pytest.approx([(r - 2.0) / (math.sqrt(2.5) + 1e-6) for r in range(5)], rel=1e-12)
    assert s.keep.all()


def test_group_of_one_has_mean_zero_std_one():
    s = create("grpo").score(rows([3.0, 0.0, 1.0], [1, 1, 1]), None)
    assert s.group_mean.tolist() == [0.0, 0.0, 0.0]
    assert s.group_std.tolist() == [1.0, 1.0, 1.0]
    assert s.score.tolist() == pytest.approx([3.0 / (1 + 1e-6), 0.0, 1.0 / (1 + 1e-6)], rel=1e-12)


def test_rank_penalty_trinity_vector():
    # rewards 0,1,2,3 with mean logprobs 0, .1, .2, .3 and penalty 0.2 -> 0, .95, 1.80, 2.55
    corrected = rank_corrected_rewards(
        torch.tensor([0.0, 1, 2, 3], dtype=F64), torch.tensor([0.0, 0.1, 0.2, 0.3], dtype=F64), torch.tensor([0, 4]), 0.2
    )
    assert corrected.tolist() == pytest.approx([0.0, 0.95, 1.80, 2.55], abs=1e-12)
    s = create("grpo", {"rank_penalty": 0.2, "epsilon": 1e-7}).score(
        rows([0, 1, 2, 3] * 2, [4, 4], mean_logprob=[0, 0.1, 0.2, 0.3] * 2), None
    )
    target = torch.tensor([0.0, 0.95, 1.80, 2.55])
    assert s.group_mean[0].item() == pytest.approx(torch.mean(target).item(), abs=1e-6)
    assert s.group_std[0].item() == pytest.approx(torch.std(target).item(), abs=1e-6)
    # The corrected reward is the numerator (the authors' formula).
    c = [0.0, 0.95, 1.80, 2.55]
    std = math.sqrt(sum((x - 1.325) ** 2 for x in c) / 3)
    expected = [(r - 1.325) / (std + 1e-7) for r in c]
    assert s.score[:4].tolist() == pytest.approx(expected, rel=1e-9)


def test_correct_bias_defaults_to_penalty_quarter():
    strategy = create("correct_bias")
    assert strategy.params == {"epsilon": 1e-6, "rank_penalty": 0.25}
    assert strategy.needs == ("logprobs",)
    s = strategy.score(rows([1.0, 1.0], [2], mean_logprob=[-1.0, -2.0]), None)
    # row 0 is more likely (rank 1): 1 * (1 - 1/2 * 0.25) = 0.875; row 1 rank 0 keeps 1.0
    mean, std = (0.875 + 1.0) / 2, math.sqrt(2 * (0.0625 ** 2))
    assert s.score.tolist() == pytest.approx([(0.875 - mean) / (std + 1e-6), (1.0 - mean) / (std + 1e-6)], rel=1e-9)


def test_rank_ties_follow_run_order():
    # Equal keys rank in row order, which is (run, step) order.
    rank = rank_within_groups(torch.tensor([0.5, 0.5, 0.1, 0.5, 0.2], dtype=F64), torch.tensor([0, 3, 5]))
    assert rank.tolist() == [1, 2, 0, 1, 0]


def test_batch_level_std_trinity_vector():
    # Trinity-RFT test_batch_level_std_grpo: groups [1,2,3] and [11,12,13], epsilon 1e-7.
    strategy = create("grpo", {"std_cal_level": "batch", "epsilon": 1e-7})
    r = rows([1, 2, 3, 11, 12, 13], [3, 3])
    batch_ids, values, weights = strategy.batch_values(r)
    (stat,) = strategy.batch_stats(values.numpy(), weights.numpy())
    batch_std = torch.tensor(stat, dtype=F64)
    assert batch_std.item() == pytest.approx(torch.std(torch.tensor([1.0, 2, 3, 11, 12, 13])).item(), rel=1e-7)
    s = strategy.score(r, batch_std.expand(6, 1))
    assert s.score[1].item() == 0.0
    assert s.score[0].item() == pytest.approx((1 - 2) / (batch_std.item() + 1e-7), rel=1e-12)
    # The group std still drives the metrics (and any threshold).
    assert s.group_std.tolist() == pytest.approx([1.0, 1.0])


def test_batch_std_of_one_row_is_one():
    assert std_of(torch.tensor([5.0], dtype=F64)).item() == 1.0


def test_std_threshold_drops_flat_groups_and_singletons():
    strategy = create("grpo", {"std_threshold": 0.0})
    s = strategy.score(rows([0.5, 0.5, 0.5, 1.0, 0.0, 7.0], [3, 2, 1]), None)
    assert s.keep.tolist() == [False, False, False, True, True, False]
    # The boundary is inclusive: std == threshold is dropped.
    exact = create("grpo", {"std_threshold": math.sqrt(0.5)}).score(rows([1.0, 0.0], [2]), None)
    assert exact.keep.tolist() == [False, False]


def test_std_threshold_none_keeps_everything():
    s = create("grpo").score(rows([0.5, 0.5, 7.0], [2, 1]), None)
    assert s.keep.all()
    assert s.score[:2].tolist() == [0.0, 0.0]


def test_zero_std_group_scores_zero_not_noise():
    # float32 rewards that equal each other give exactly zero in float64 group math.
    r = float(torch.tensor(0.1, dtype=torch.float32))
    s = create("grpo").score(rows([r, r, r], [3]), None)
    assert s.score.tolist() == [0.0, 0.0, 0.0]


def test_mean_and_std_against_python():
    values = torch.tensor([3.0, -1.0, 2.5, 10.0, 10.0, 4.0], dtype=F64)
    mean, std = mean_and_std(values, torch.tensor([0, 4, 6]))
    a = [3.0, -1.0, 2.5, 10.0]
    m = sum(a) / 4
    assert mean.tolist() == pytest.approx([m, 7.0])
    assert std.tolist() == pytest.approx([math.sqrt(sum((x - m) ** 2 for x in a) / 3), math.sqrt(18.0)])
    assert segment_sum(values, torch.tensor([0, 0, 6])).tolist() == [0.0, sum(values.tolist())]


def test_grpo_scores_is_order_free_within_batch_std():
    batch_std = torch.tensor([2.0] * 4, dtype=F64)
    s = grpo_scores(torch.tensor([1.0, 3.0, 5.0, 5.0], dtype=F64), torch.tensor([0, 2, 3, 4]), epsilon=0.0, batch_std=batch_std)
    assert s.score.tolist() == [-0.5, 0.5, 2.5, 2.5]  # singletons: mean 0, denominator the batch std


def test_registry_lists_valid_names_and_parameters():
    assert {"grpo", "correct_bias"} <= set(names())
    with pytest.raises(ConfigError, match=rf"unknown strategy 'gpro' \(did you mean 'grpo'.*\?\); `rescore strategies` lists all {len(names())}$"):
        create("gpro")
    with pytest.raises(ConfigError, match="unknown parameter 'tau'.*valid parameters: epsilon, rank_penalty, std_cal_level, std_threshold"):
        create("grpo", {"tau": 1})
    with pytest.raises(ConfigError, match="std_cal_level.*group, batch"):
        create("grpo", {"std_cal_level": "global"})
    with pytest.raises(ConfigError, match="epsilon.*number"):
        create("grpo", {"epsilon": "small"})
    with pytest.raises(ConfigError, match="epsilon"):
        create("grpo", {"epsilon": -1})


def test_register_refuses_a_taken_name():
    from rescore.transforms.strategies.registry import register

    with pytest.raises(ValueError, match="already registered"):
        register("grpo", kind="advantage", implementation="grpo:GRPO", summary="")(object)
