"""Token columns of the scored output: per-row values broadcast over each response's tokens
(`advantages`, `returns`, `score`), in chunks that int32 list offsets can hold."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from rescore.schemas.experience import SCORE_FIELDS
from rescore.transforms.rows.response import response_lengths
from rescore.transforms.rows.tensors import to_device
from rescore.transforms.strategies.tokens import token_advantages, token_advantages_host

if TYPE_CHECKING:
    import torch

_MAX_TOKENS_PER_CHUNK = 1 << 30  # list<float32> offsets are int32


def _chunk_bounds(lengths: np.ndarray) -> list[int]:
    """Row boundaries such that each chunk holds at most ~2^30 tokens (int32 list offsets)."""
    ends = np.cumsum(lengths)
    bounds = [0]
    while bounds[-1] < len(lengths):
        first = bounds[-1]
        base = int(ends[first - 1]) if first else 0
        stop = int(np.searchsorted(ends, base + _MAX_TOKENS_PER_CHUNK, side="right"))
        bounds.append(max(stop, first + 1))
    return bounds if len(bounds) > 1 else [0, 0]


def _pool_floats(n: int) -> np.ndarray:
    """(n,) float32, uninitialised, in Arrow's memory pool: its jemalloc hands a thread the pages
    its last unit's column freed, where numpy's own allocation of ~50 MB a unit came from fresh
    pages every time (zeroed by the kernel: ~6 % of a 1,024,000-row run's CPU, benchmarks/README.md
    issue 42). The Arrow column made from it holds the buffer."""
    return np.frombuffer(pa.allocate_buffer(4 * n), dtype=np.float32, count=n) if n else np.empty(0, np.float32)


def score_columns(
    table: pa.Table,
    row_value: np.ndarray,
    score: np.ndarray,
    valid: np.ndarray | None = None,
    token_values: np.ndarray | None = None,
    device: torch.device | None = None,
) -> list[pa.ChunkedArray]:
    """advantages, returns (list<float32>) and score (float32) for the rows of `table`.

    advantages = row_value * action_mask, or `token_values` (flat, already masked) for a
    token-level strategy. `returns` equals `advantages`; both columns share one buffer in
    memory. Rows where `valid` is False (no advantage computed) get nulls in all three. The
    broadcast runs on `device` (None: the host, with numpy) over flat token arrays: one copy
    in, one out.
    """
    lengths, mask = response_lengths(table)
    if valid is not None:
        row_value = np.where(valid, row_value, 0.0)
    if token_values is not None:
        with np.errstate(over="ignore"):  # beyond float32: inf, and the row is rejected (output_rows.written_rows)
            flat = np.asarray(token_values, dtype=np.float32) + np.float32(0.0)  # -0.0 -> +0.0
    elif device is None or device.type == "cpu":  # the same values, without torch's per-token index
        lengths = np.asarray(lengths, dtype=np.int64)
        flat = token_advantages_host(np.asarray(row_value, dtype=np.float64), lengths, mask, out=_pool_floats(int(lengths.sum())))
    else:
        flat = token_advantages(
            to_device(np.asarray(row_value, dtype=np.float64), device),
            to_device(np.asarray(lengths, dtype=np.int64), device),
            None if mask is None else to_device(np.asarray(mask), device),
        ).cpu().numpy()
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    bounds = _chunk_bounds(lengths)
    chunks = []
    for first, stop in zip(bounds[:-1], bounds[1:]):
        local = (offsets[first : stop + 1] - offsets[first]).astype(np.int32)
        values = flat[offsets[first] : offsets[stop]]
        nulls = None if valid is None else pa.array(~valid[first:stop])
        chunks.append(pa.ListArray.from_arrays(pa.array(local), pa.array(values), mask=nulls))
    advantages = pa.chunked_array(chunks, type=SCORE_FIELDS[0].type)
    with np.errstate(over="ignore"):  # beyond float32: inf, and the row is rejected (output_rows.written_rows)
        score32 = pa.array(score.astype(np.float32), mask=None if valid is None else ~valid)
    return [advantages, advantages, pa.chunked_array([score32])]
