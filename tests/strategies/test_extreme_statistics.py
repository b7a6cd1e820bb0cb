"""Group statistics of values near the float range (shared/hostile.md: +-1e300, sums and squares
overflow): the mean and std are the true ones where they fit a float, and ordinary groups get
exactly the unscaled sums."""

import math

import torch

from rescore.transforms.strategies import create
from rescore.transforms.strategies.base import GroupedRows
from rescore.transforms.strategies.segments import group_stats, mean_and_std, population_var


def _t(values):
    return torch.tensor(values, dtype=torch.float64)


def test_mean_and_std_of_values_whose_squares_overflow():
    mean, std = mean_and_std(_t([1e300, -1e300, 0.0, 1e308, 1e308, -1e308]), torch.tensor([0, 3, 6]))
    assert mean.tolist() == [0.0, 1e308 / 3] and std[0].item() == 1e300  # squares 1e600, sum 2e308
    assert math.isclose(std[1].item(), math.sqrt(4 / 3) * 1e308, rel_tol=1e-15)
    assert population_var(_t([1e300, -1e300]), torch.tensor([0, 2])).item() == math.inf  # 1e600: the true value


def test_ordinary_groups_are_summed_as_before():
    values = _t([0.1, 0.7, 0.2, 3.0, 3.0, 1e150, -2e150])
    offsets = torch.tensor([0, 3, 5, 7])
    mean, std = mean_and_std(values, offsets)
    sizes = torch.tensor([3.0, 2.0, 2.0], dtype=torch.float64)
    plain = torch.segment_reduce(values, "sum", offsets=offsets) / sizes
    assert mean[0].item() == plain[0].item() and mean[2].item() == plain[2].item() and std[1].item() == 0.0
    dev = values[:3] - plain[0]
    assert std[0].item() == math.sqrt((dev * dev).sum().item() / 2)


def test_grpo_of_rewards_near_the_float_range_is_the_grpo_of_their_scale():
    def rows(rewards):
        n = len(rewards)
        return GroupedRows(reward=_t(rewards), offsets=torch.tensor([0, n]), batch=torch.zeros(n, dtype=torch.int64),
                           run=torch.arange(n), step=torch.zeros(n, dtype=torch.int64), action_tokens=torch.ones(n, dtype=torch.int64))

    big = create("grpo").score(rows([1e300, -1e300, 0.0]), None).score
    small = create("grpo").score(rows([1.0, -1.0, 0.0]), None).score
    assert torch.allclose(big, small, rtol=1e-5) and big.tolist() != [0.0, 0.0, 0.0]  # was 0, 0, 0 (std inf)
    assert group_stats(_t([1e300]), torch.tensor([0, 1]))[1].item() == 1.0  # one row: std 1, as always
