"""segments.py's group statistics in numpy, bit for bit: the host path of a run whose chain has
a numpy implementation (GRPO on the CPU) and never imports torch.

torch's `segment_reduce(..., "sum")` on the CPU adds each segment's values one after another,
starting from 0.0 (aten/src/ATen/native/SegmentReduce.cpp). numpy's `add.reduceat` and `sum`
add runs of 8 values and more pairwise: other bits. `segment_sum` here adds in torch's order,
vectorised across groups: one pass per position within a group. Every other step (the scale
for huge values, exact zero spread, the two-pass squares, the divisions) is the same IEEE
operation on the same float64 values as segments.py, the square root included: torch's float64
`sqrt` on the CPU is MKL's `vdSqrt`, which is not correctly rounded (about 1.3 % of random inputs
one ulp from IEEE's), so segments.py takes its std's square root from numpy too
(`segments.ieee_sqrt`). `SQRT` is the one square root every statistic here takes;
tests/strategies/test_segments_np.py checks the two paths bit for bit.
"""

from __future__ import annotations

import numpy as np

_BIG = 2.0**500  # segments._BIG

SQRT = np.sqrt
"""The square root of the std (see the module doc)."""


def sizes_of(offsets: np.ndarray) -> np.ndarray:
    """(G,) int64 rows per group."""
    return np.diff(np.asarray(offsets, dtype=np.int64))


def per_row(per_group: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Broadcast a (G,) array to the (n,) rows of each group (torch.repeat_interleave)."""
    return np.repeat(per_group, sizes_of(offsets))


def segment_sum(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(G,) float64 sums of values[offsets[g]:offsets[g + 1]], each added in order from +0.0
    (torch.segment_reduce's order on the CPU); empty groups give 0.0."""
    values = np.asarray(values, dtype=np.float64)
    sizes = sizes_of(offsets)
    acc = np.zeros(len(sizes), dtype=np.float64)
    if not len(sizes) or not values.size:
        return acc
    starts = np.asarray(offsets[:-1], dtype=np.int64)
    top = int(sizes.max())
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN as torch's sums give them
        _ordered_sums(values, sizes, starts, top, acc)
    return acc


def _ordered_sums(values: np.ndarray, sizes: np.ndarray, starts: np.ndarray, top: int, acc: np.ndarray) -> None:
    if int(sizes.min()) == top and int(starts[0]) == 0:  # equal groups (the usual GRPO batch): one strided column a step
        table = values[: len(sizes) * top].reshape(len(sizes), top)
        for k in range(top):
            acc += table[:, k]
        return
    order = np.argsort(-sizes, kind="stable")  # longest first: the groups still going are a prefix
    ordered_sizes, ordered_starts = sizes[order], starts[order]
    part = np.zeros(len(sizes), dtype=np.float64)
    for k in range(top):
        live = int(np.searchsorted(-ordered_sizes, -k, side="left"))  # groups with size > k
        part[:live] += values[ordered_starts[:live] + k]
    acc[order] = part


def segment_count(flags: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(G,) int64 number of set flags per group (exact)."""
    sizes = sizes_of(offsets)
    out = np.zeros(len(sizes), dtype=np.int64)
    nonempty = sizes > 0
    if flags.size and nonempty.any():
        out[nonempty] = np.add.reduceat(np.asarray(flags, dtype=np.int64), np.asarray(offsets[:-1])[nonempty])
    return out


def _segment_extreme(ufunc, values: np.ndarray, offsets: np.ndarray, empty: float) -> np.ndarray:
    sizes = sizes_of(offsets)
    out = np.full(len(sizes), empty, dtype=values.dtype)
    nonempty = sizes > 0
    if values.size and nonempty.any():
        out[nonempty] = ufunc.reduceat(values, np.asarray(offsets[:-1])[nonempty])
    return out


def segment_max(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(G,) maxima (NaN where the group has one, as torch; -inf for an empty group)."""
    return _segment_extreme(np.maximum, values, offsets, -np.inf)


def segment_min(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(G,) minima (NaN where the group has one, as torch; +inf for an empty group)."""
    return _segment_extreme(np.minimum, values, offsets, np.inf)


def zero_spread(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(G,) bool: every value of the (non-empty) group is the same (segments.zero_spread)."""
    sizes = sizes_of(offsets)
    if not values.size:
        return np.zeros(len(sizes), dtype=bool)
    return (sizes > 0) & (segment_max(values, offsets) == segment_min(values, offsets))


def _group_scale(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(G,) 1.0, or 2^-e for a group whose largest |value| passes 2^500 (segments._group_scale)."""
    sizes = sizes_of(offsets)
    scale = np.ones(len(sizes), dtype=np.float64)
    if not values.size:
        return scale
    top = segment_max(np.abs(values), offsets)
    with np.errstate(invalid="ignore"):
        big = (sizes > 0) & np.isfinite(top) & (top > _BIG)
    if big.any():
        _, exponent = np.frexp(np.where(big, top, 1.0))
        scale = np.where(big, np.ldexp(1.0, -exponent), scale)
    return scale


def _scaled_mean_and_sq_dev(values: np.ndarray, offsets: np.ndarray):
    """(mean, scaled sum of squared deviations, float64 sizes, scale): segments.py's two passes."""
    values = np.asarray(values, dtype=np.float64)
    sizes = sizes_of(offsets).astype(np.float64)
    scale = _group_scale(values, offsets)
    scaled = values * per_row(scale, offsets) if bool((scale != 1).any()) else values
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        mean = segment_sum(scaled, offsets) / sizes
        flat = zero_spread(values, offsets)
        if values.size:
            mean = np.where(flat, scaled[np.minimum(np.asarray(offsets[:-1]), values.size - 1)], mean)
        dev = scaled - per_row(mean, offsets)
        sq = segment_sum(dev * dev, offsets)
        return mean / scale, np.where(flat, 0.0, sq), sizes, scale


def mean_and_std(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(G,) mean and unbiased std (ddof=1), exactly as segments.mean_and_std (NaN std for one row)."""
    mean, sq, sizes, scale = _scaled_mean_and_sq_dev(values, offsets)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return mean, SQRT(sq / (sizes - 1)) / scale


def group_stats(values: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(G,) mean and std, a group of one row: mean 0, std 1 (segments.group_stats)."""
    single = sizes_of(offsets) == 1
    mean, std = mean_and_std(values, offsets)
    return np.where(single, 0.0, mean), np.where(single, 1.0, std)


def std_of(values: np.ndarray) -> float:
    """Unbiased std of a 1-D array; 1.0 for fewer than two values (segments.std_of)."""
    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        return 1.0
    return float(mean_and_std(values, np.array([0, values.size], dtype=np.int64))[1][0])
