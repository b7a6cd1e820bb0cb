"""Per-row outcomes sent back to the row's read unit: scored, filtered or rejected.

Every input row gets exactly one record; WriteScored checks that before it writes anything.
DUPLICATED never appears in a record: it only counts the copies a write step adds.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

SCORED, FILTERED, REJECTED, DUPLICATED = 0, 1, 2, 3

RECORD_SCHEMA = pa.schema(
    [
        pa.field("row", pa.int32()),
        pa.field("batch", pa.int64()),
        pa.field("status", pa.int8()),
        pa.field("score", pa.float64()),
        pa.field("token_scale", pa.float64()),
        pa.field("reason", pa.string()),
    ]
)
"""`score` is null where the run computes no advantage (a filter or duplication alone)."""


def records(row, batch, status, score=None, token_scale=None, reason=None, *, has_score=True) -> pa.Table:
    n = len(row)
    score = np.zeros(n) if score is None else np.asarray(score, dtype=np.float64)
    mask = None if has_score is True else ~np.broadcast_to(np.asarray(has_score, dtype=bool), (n,))
    return pa.Table.from_arrays(
        [
            pa.array(np.asarray(row, dtype=np.int32)),
            batch if isinstance(batch, (pa.Array, pa.ChunkedArray)) else pa.array(np.asarray(batch, dtype=np.int64)),
            pa.array(np.broadcast_to(np.asarray(status, dtype=np.int8), (n,))),
            pa.array(score, mask=mask),
            pa.array(np.ones(n) if token_scale is None else np.asarray(token_scale, dtype=np.float64)),
            pa.nulls(n, pa.string()) if reason is None else pa.array(list(reason), pa.string()),
        ],
        schema=RECORD_SCHEMA,
    )


def rejected_records(row: np.ndarray, batch: pa.Array | pa.ChunkedArray, reasons) -> pa.Table:
    batch = pc.cast(batch, pa.int64())
    if isinstance(batch, pa.ChunkedArray):
        batch = batch.combine_chunks()
    return records(row, batch, REJECTED, reason=reasons, has_score=False)
