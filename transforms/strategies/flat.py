"""Reductions over flat numpy arrays of token values (numpy only: the row layer uses them on the
read path, where torch is not needed)."""

from __future__ import annotations

import numpy as np


def flat_segment_sum(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """(n,) sums of values[offsets[i]:offsets[i + 1]] of a flat token array, in order within a
    row (numpy only; the row layer sums list columns with it too).

    Each row's sum depends only on that row's values (not on its position), so equal rows get
    bit-equal sums. Empty segments sum to 0.
    """
    n = len(offsets) - 1
    out = np.zeros(n, dtype=np.float64 if values.dtype.kind == "f" else np.int64)
    nonempty = offsets[1:] > offsets[:-1]
    if len(values) == 0 or not nonempty.any():
        return out
    # Integers (and booleans) are summed as int64, whatever their width.
    wide = {} if values.dtype.kind == "f" else {"dtype": np.int64}
    out[nonempty] = np.add.reduceat(values, offsets[:-1][nonempty], **wide)
    return out
