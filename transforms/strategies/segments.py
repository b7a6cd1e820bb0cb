"""Segment reductions over rows sorted by group (torch, any device).

Groups are contiguous segments given by offsets (G + 1,). `torch.segment_reduce` reduces each
segment in a fixed order on CPU and CUDA alike, unlike `index_add_`/`scatter_add_`, whose CUDA
kernels add in a nondeterministic order.
"""

from __future__ import annotations

import torch
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


def per_row(per_group: Tensor, offsets: Tensor) -> Tensor:
    """Broadcast a (G,) tensor to the (n,) rows of each group."""
    return torch.repeat_interleave(per_group, offsets[1:] - offsets[:-1])


def mean_and_std(values: Tensor, offsets: Tensor) -> tuple[Tensor, Tensor]:
    """(G,) mean and unbiased std (ddof=1) of each group, two-pass for accuracy.

    Groups of one row get std NaN (ddof=1 is undefined); callers decide what a singleton means.
    """
    sizes = (offsets[1:] - offsets[:-1]).to(values.dtype)
    mean = segment_sum(values, offsets) / sizes
    dev = values - per_row(mean, offsets)
    var = segment_sum(dev * dev, offsets) / (sizes - 1)
    return mean, torch.sqrt(var)


def population_var(values: Tensor, offsets: Tensor) -> Tensor:
    """(G,) population variance (ddof=0) of each group, two-pass."""
    sizes = (offsets[1:] - offsets[:-1]).to(values.dtype)
    mean = segment_sum(values, offsets) / sizes
    dev = values - per_row(mean, offsets)
    return segment_sum(dev * dev, offsets) / sizes


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
