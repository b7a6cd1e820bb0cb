"""Segment reductions over rows sorted by group (torch, any device), and over flat token
arrays (numpy, `flat_segment_sum`).

Groups are contiguous segments given by offsets (G + 1,). `torch.segment_reduce` reduces each
segment in a fixed order on CPU and CUDA alike, unlike `index_add_`/`scatter_add_`, whose CUDA
kernels add in a nondeterministic order.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rescore.transforms.strategies.tensors import torch

if TYPE_CHECKING:
    from torch import Tensor


def segment_sum(values: Tensor, offsets: Tensor) -> Tensor:
    """(G,) sums of values[offsets[g]:offsets[g + 1]]; empty segments give 0.

    Integer and bool values are summed in float64 (exact below 2^53) and returned as int64.
    """
    if offsets.numel() <= 1:
        return values.new_zeros(0, dtype=torch.int64 if not values.is_floating_point() else None)
    if values.numel() == 0:
        return values.new_zeros(offsets.numel() - 1, dtype=torch.int64 if not values.is_floating_point() else None)
    if not values.is_floating_point():
        return torch.segment_reduce(values.to(torch.float64), "sum", offsets=offsets, unsafe=True).to(torch.int64)
    return torch.segment_reduce(values, "sum", offsets=offsets, unsafe=True)


def segment_max(values: Tensor, offsets: Tensor) -> Tensor:
    """(G,) maxima of non-empty segments."""
    if offsets.numel() <= 1:
        return values.new_zeros(0)
    return torch.segment_reduce(values, "max", offsets=offsets, unsafe=True)


def segment_min(values: Tensor, offsets: Tensor) -> Tensor:
    """(G,) minima of non-empty segments."""
    if offsets.numel() <= 1:
        return values.new_zeros(0)
    return torch.segment_reduce(values, "min", offsets=offsets, unsafe=True)


def zero_spread(values: Tensor, offsets: Tensor) -> Tensor:
    """(G,) bool: every value of the group is the same (max == min), decided exactly.

    This is the spec's "all equal -> spread exactly 0" rule: six rewards of 0.1 have mean 0.1 and
    std 0 whatever a float sum of them says. Empty groups are False. Every statistic below
    uses it, so strategies built on these helpers inherit the rule.
    """
    if offsets.numel() <= 1:
        return torch.zeros(0, dtype=torch.bool, device=values.device)
    if values.numel() == 0:
        return torch.zeros(offsets.numel() - 1, dtype=torch.bool, device=values.device)
    sizes = offsets[1:] - offsets[:-1]
    return (sizes > 0) & (segment_max(values, offsets) == segment_min(values, offsets))


def per_row(per_group: Tensor, offsets: Tensor) -> Tensor:
    """Broadcast a (G,) tensor to the (n,) rows of each group."""
    return torch.repeat_interleave(per_group, offsets[1:] - offsets[:-1])


_BIG = 2.0**500
"""A group whose largest |value| passes this is summed scaled by a power of two (exact), so its
sums and squares cannot overflow where its mean and std fit a float (rewards of +-1e300)."""


def _group_scale(values: Tensor, offsets: Tensor) -> Tensor:
    """(G,) a power of two per group: 1 where every |value| is below _BIG (the values are used as
    they are), else 2^-e with e the binary exponent of the group's largest |value|."""
    sizes = offsets[1:] - offsets[:-1]
    scale = torch.ones(sizes.numel(), dtype=values.dtype, device=values.device)
    if values.numel() == 0 or not values.is_floating_point():
        return scale
    top = segment_max(values.abs(), offsets)
    big = (sizes > 0) & torch.isfinite(top) & (top > _BIG)
    if big.any():
        _, exponent = torch.frexp(torch.where(big, top, torch.ones_like(top)))
        scale = torch.where(big, torch.ldexp(torch.ones_like(top), -exponent), scale)
    return scale


def _scaled_mean_and_sq_dev(values: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(G,) exact-zero-spread-aware mean, sum of squared deviations of the values times the
    group's scale (_group_scale), group sizes and the scale.

    A group whose values are all equal (zero_spread) gets mean = that value and a sum of squared
    deviations of exactly 0; the others are two-pass sums in a fixed order. Scaling is by a
    power of two, so a group of ordinary values (scale 1) gives exactly the unscaled sums.
    """
    sizes = (offsets[1:] - offsets[:-1]).to(values.dtype)
    scale = _group_scale(values, offsets)
    scaled = values * per_row(scale, offsets) if bool((scale != 1).any()) else values
    mean = segment_sum(scaled, offsets) / sizes
    flat = zero_spread(values, offsets)
    if values.numel():
        mean = torch.where(flat, scaled[offsets[:-1].clamp(max=values.numel() - 1)], mean)
    dev = scaled - per_row(mean, offsets)
    sq = segment_sum(dev * dev, offsets)
    return mean / scale, torch.where(flat, torch.zeros_like(sq), sq), sizes, scale


def _mean_and_sq_dev(values: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(G,) exact-zero-spread-aware mean, sum of squared deviations (inf where it passes the
    float range), and group sizes."""
    mean, sq, sizes, scale = _scaled_mean_and_sq_dev(values, offsets)
    return mean, sq / (scale * scale), sizes


def mean_and_std(values: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """(G,) mean and unbiased std (ddof=1) of each group, two-pass for accuracy.

    A group whose values are all equal has mean = that value and std exactly 0 (zero_spread).
    Groups of one row get std NaN (ddof=1 is undefined); callers decide what a singleton means.
    The std of values up to the float range is finite where it fits (taken scaled).
    """
    mean, sq, sizes, scale = _scaled_mean_and_sq_dev(values, offsets)
    var = sq / (sizes - 1)
    return mean, ieee_sqrt(var) / scale


def ieee_sqrt(values: Tensor) -> Tensor:
    """The correctly rounded (IEEE 754) square root, on any device.

    torch's float64 `sqrt` on the CPU is MKL's `vdSqrt` (torch's VML kernels), which is not
    correctly rounded: about 1.3 % of random values come out one ulp off, and builds without
    MKL (aarch64 wheels) round as IEEE does. So the std of a group would depend on the machine
    the worker runs on. numpy's `sqrt` and CUDA's are IEEE's; on the CPU this takes numpy's, so
    the torch path, the numpy path (segments_np.py) and a GPU agree bit for bit.
    """
    if values.device.type != "cpu":
        return torch.sqrt(values)
    with np.errstate(invalid="ignore"):
        return torch.from_numpy(np.asarray(np.sqrt(values.detach().contiguous().numpy())))


def population_var(values: Tensor, offsets: Tensor) -> Tensor:
    """(G,) population variance (ddof=0) of each group, two-pass; exactly 0 for a group whose
    values are all equal (zero_spread)."""
    _, sq, sizes = _mean_and_sq_dev(values, offsets)
    return sq / sizes


def group_stats(values: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """(G,) mean and std with the spec's convention for a group of one row: mean 0, std 1."""
    single = (offsets[1:] - offsets[:-1]) == 1
    mean, std = mean_and_std(values, offsets)
    return torch.where(single, torch.zeros_like(mean), mean), torch.where(single, torch.ones_like(std), std)


def run_offsets(run: Tensor, offsets: Tensor) -> Tensor:
    """(R + 1,) boundaries of the runs (same run id inside one group) of rows sorted by
    (group, run, step)."""
    n = run.numel()
    starts = torch.zeros(n, dtype=torch.bool, device=run.device)
    if n:
        starts[0] = True
        starts[1:] = run[1:] != run[:-1]
        starts[offsets[:-1][offsets[:-1] < n]] = True
    bounds = torch.nonzero(starts).flatten()
    return torch.cat([bounds, torch.tensor([n], dtype=torch.int64, device=run.device)])


def rank_within_groups(key: Tensor, offsets: Tensor) -> Tensor:
    """(n,) int64 rank of each row's key inside its group, ascending, 0-based.

    Ties keep the rows' current order (rows arrive sorted by (run, step)), so ranks never
    depend on the order the rows were read in.
    """
    n = key.numel()
    group = per_row(torch.arange(offsets.numel() - 1, device=key.device), offsets)
    by_key = torch.sort(key, stable=True).indices
    order = by_key[torch.sort(group[by_key], stable=True).indices]
    rank = torch.empty(n, dtype=torch.int64, device=key.device)
    rank[order] = torch.arange(n, device=key.device) - offsets[:-1][group[order]]
    return rank


def std_of(values: Tensor) -> Tensor:
    """Unbiased std of a 1-D tensor; 1.0 for fewer than two values (nothing to normalise by).

    Sums in a fixed order (unlike torch.std, whose CPU result depends on the thread count).
    """
    if values.numel() < 2:
        return torch.ones((), dtype=values.dtype, device=values.device)
    offsets = torch.tensor([0, values.numel()], device=values.device)
    return mean_and_std(values, offsets)[1][0]


def group_index(offsets: np.ndarray) -> np.ndarray:
    """(n,) int64 the group of each row, from numpy offsets (G + 1,)."""
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


def single_units(run: np.ndarray, offsets: np.ndarray, reached: np.ndarray, per_run: bool) -> np.ndarray:
    """(G,) bool: the group has one row (or, with per_run, one run) among the `reached` rows
    (numpy; rows sorted by (batch, task, run, step), so a run starts where the run id changes)."""
    g = group_index(offsets)
    if not per_run:
        return np.bincount(g, weights=reached, minlength=len(offsets) - 1) == 1
    new_run = np.ones(len(run), dtype=bool)
    new_run[1:] = (run[1:] != run[:-1]) | (g[1:] != g[:-1])
    return np.bincount(g, weights=new_run & reached, minlength=len(offsets) - 1) == 1


def masked_group_stats(values: np.ndarray, offsets: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group over the rows in `mask` (numpy): (count, population var, std with ddof=1);
    NaN where a group has too few rows for the statistic."""
    g = group_index(offsets)
    groups = len(offsets) - 1
    n = np.bincount(g, weights=mask, minlength=groups)
    total = np.bincount(g, weights=np.where(mask, values, 0.0), minlength=groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = total / n
        dev = np.where(mask, values - mean[g], 0.0)
        ss = np.bincount(g, weights=dev * dev, minlength=groups)
        return n.astype(np.int64), ss / n, np.sqrt(ss / (n - 1))
