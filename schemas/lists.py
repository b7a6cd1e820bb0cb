"""Flat views of Arrow list columns: per-row lengths and offsets over one values array.

Token-level work (validation, masked means, the score broadcast) runs on these flat arrays,
never row by row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


@dataclass(frozen=True)
class FlatList:
    valid: np.ndarray
    """(n,) bool: the row's list is not null."""
    lengths: np.ndarray
    """(n,) int64: list length, 0 for null lists."""
    offsets: np.ndarray
    """(n + 1,) int64: row i's values are values[offsets[i]:offsets[i + 1]]."""
    values: pa.Array
    """The non-null lists' values, concatenated in row order."""


def flat_list(column: pa.ChunkedArray | pa.Array) -> FlatList:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    lengths = pc.list_value_length(arr)
    valid = np.asarray(lengths.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    lengths = np.asarray(lengths.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    # flatten() honours slicing and skips the value ranges of null lists, so it lines up
    # with offsets built from lengths where null lists count as empty.
    return FlatList(valid, lengths, offsets, arr.flatten())


def row_of_value(offsets: np.ndarray) -> np.ndarray:
    """(len(values),) int64: the row each flat value belongs to."""
    lengths = np.diff(offsets)
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
