"""Reductions over flat numpy arrays of token values (numpy only: the row layer uses them on the
read path, where torch is not needed)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SUM_WINDOW = 1 << 20
"""Narrow integers are widened to int64 this many values at a time (one reused buffer)."""


def flat_segment_sum(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(n,) sums of values[offsets[i]:offsets[i + 1]] of a flat token array, in order within a
    row (numpy only; the row layer sums list columns with it too).

    Each row's sum depends only on that row's values (not on its position), so equal rows get
    bit-equal sums. Empty segments sum to 0. Floats are summed in their own dtype and returned
    as float64; integers and booleans are summed exactly as int64.
    """
    n = len(offsets) - 1
    floating = values.dtype.kind == "f"
    out = np.zeros(n, dtype=np.float64 if floating else np.int64)
    nonempty = offsets[1:] > offsets[:-1]
    if len(values) == 0 or not nonempty.any():
        return out
    if floating or values.dtype == np.int64:
        out[nonempty] = np.add.reduceat(values, offsets[:-1][nonempty])
        return out
    _windowed_int_sum(values, offsets, nonempty, out)
    return out


def _windowed_int_sum(values: np.ndarray, offsets: np.ndarray, nonempty: np.ndarray, out: np.ndarray) -> None:
    """Integer segment sums of narrow values: whole rows of about SUM_WINDOW values at a time,
    widened into one int64 buffer. Widening all values at once (reduceat's dtype=int64) made a
    copy of eight bytes per token: 400 MB for the int8 action mask of 200k rows of 256 tokens,
    all fresh pages, to produce one int64 per row. Integer sums are exact, so the windows give
    the same result."""
    n = len(offsets) - 1
    scratch = np.empty(min(SUM_WINDOW, int(offsets[-1] - offsets[0])), dtype=np.int64)
    first = 0
    while first < n:
        low = int(offsets[first])
        stop = int(np.searchsorted(offsets, low + SUM_WINDOW, side="right")) - 1
        stop = min(n, max(stop, first + 1))  # at least one row, however long
        rows = nonempty[first:stop]
        if rows.any():
            size = int(offsets[stop]) - low
            buffer = scratch[:size] if size <= len(scratch) else np.empty(size, dtype=np.int64)
            buffer[...] = values[low : low + size]
            out[first:stop][rows] = np.add.reduceat(buffer, (offsets[first:stop] - low)[rows])
        first = stop


def action_means(values: np.ndarray, mask: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(n,) float64 each row's sum of `values` over its tokens divided by its action tokens
    (sum of the 0/1 `mask`); 0 for a row without any: a token-level estimator's per-row score."""
    tokens = flat_segment_sum(mask, offsets)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tokens > 0, flat_segment_sum(values, offsets) / np.maximum(tokens, 1), 0.0)


@dataclass(frozen=True)
class TokenColumn:
    """A list column of n rows, flat: row i's values are values[offsets[i]:offsets[i + 1]]
    (a null list is empty)."""

    offsets: np.ndarray
    """(n + 1,) int64."""
    values: np.ndarray
    """(T,) the values, in the column's own dtype."""

    def select(self, keep: np.ndarray) -> TokenColumn:
        """The rows where `keep` (n,) bool is set."""
        if keep.all():
            return self
        lengths = np.diff(self.offsets)
        offsets = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
        np.cumsum(lengths[keep], out=offsets[1:])
        values = self.values[int(self.offsets[0]) : int(self.offsets[-1])]
        return TokenColumn(offsets, values[np.repeat(keep, lengths)])
