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
    values: pa.Array | pa.ChunkedArray
    """The non-null lists' values in row order (one Arrow array per chunk of the column)."""


def flat_list(column: pa.ChunkedArray | pa.Array) -> FlatList:
    """The flat view of a list column, chunk by chunk: the per-row arrays are built from each
    chunk's lengths, and `values` is each chunk's flattened values (zero-copy; a ChunkedArray
    where the column has several chunks). The column's values are never concatenated here: a
    caller that needs them as one numpy array gets them with one copy (`to_numpy`)."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    if not chunks:
        chunks = [pa.array([], type=column.type)]
    valid_parts, length_parts, value_parts = [], [], []
    for arr in chunks:
        lengths = pc.list_value_length(arr)
        valid_parts.append(np.asarray(lengths.is_valid().to_numpy(zero_copy_only=False), dtype=bool))
        length_parts.append(np.asarray(lengths.fill_null(0).to_numpy(zero_copy_only=False), dtype=np.int64))
        # flatten() honours slicing and skips the value ranges of null lists, so it lines up
        # with offsets built from lengths where null lists count as empty.
        value_parts.append(arr.flatten())
    valid = valid_parts[0] if len(chunks) == 1 else np.concatenate(valid_parts)
    lengths = length_parts[0] if len(chunks) == 1 else np.concatenate(length_parts)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    values = value_parts[0] if len(chunks) == 1 else pa.chunked_array(value_parts, type=value_parts[0].type)
    return FlatList(valid, lengths, offsets, values)


def row_of_value(offsets: np.ndarray) -> np.ndarray:
    """(len(values),) int64: the row each flat value belongs to."""
    lengths = np.diff(offsets)
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
