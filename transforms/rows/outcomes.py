"""Per-row outcomes sent back to the row's read unit: scored, filtered or rejected.

Every input row gets exactly one record; WriteScored checks that before it writes anything.
DUPLICATED never appears in a record: it only counts the copies a write step adds.
"""

from __future__ import annotations

from collections.abc import Iterator

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.transforms.rows.keys import split_by

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
SHAPED_REWARD = "shaped_reward"
"""A record column of a run with reward shaping: the reward every stage used (float64)."""
IS_NORM = "is_batch_norm_factor"
"""A record column of a run with rollout_is_batch_normalize: the divisor of the row's
importance weights (float64)."""
ROW_TOKENS = "row_tokens"
"""A record column of a run whose advantage stage returns per-token values with its scores
(Scores.row_tokens, list<float64>: optimal_token_baseline's baselines)."""


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


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _writable(values: np.ndarray) -> np.ndarray:
    """(n,) bool: finite, and finite once written as float32 (advantages and scores are)."""
    with np.errstate(invalid="ignore"):
        return np.isfinite(values) & (np.abs(values) <= FLOAT32_MAX)


def unpublishable(keep: np.ndarray, score: np.ndarray | None, token_scale: np.ndarray | None, reward: np.ndarray | None) -> np.ndarray | None:
    """(n,) bool: the kept rows whose score, score * token_scale (the advantage written) or
    shaped reward cannot be published (NaN, +-inf, or beyond float32 where the output is
    float32: rewards of +-1e300 can give such advantages); None where there is none."""
    bad = np.zeros(len(keep), dtype=bool)
    if score is not None:
        score = np.asarray(score, dtype=np.float64)
        with np.errstate(over="ignore", invalid="ignore"):
            value = score if token_scale is None else score * np.asarray(token_scale, dtype=np.float64)
        bad |= ~_writable(score) | ~_writable(value)
    if reward is not None:
        bad |= ~np.isfinite(np.asarray(reward, dtype=np.float64))
    bad &= np.asarray(keep, dtype=bool)
    return bad if bad.any() else None


def _unpublishable_reason(i: int, score, token_scale, reward) -> str:
    if reward is not None and not math.isfinite(float(reward[i])):
        return f"non_finite_score: the shaped reward is {float(reward[i])} (the row's inputs pass the float range)"
    value = float(score[i]) * (1.0 if token_scale is None else float(token_scale[i]))
    return f"non_finite_score: the advantage would be {value:.6g}, beyond float32 (the row's inputs pass the float range)"


def scored_outcomes(
    light: pa.Table, keep: np.ndarray, score: np.ndarray | None, token_scale: np.ndarray | None, *,
    reasons: np.ndarray | None = None, audit: dict[str, np.ndarray] | None = None, audit_fields=(),
    reward: np.ndarray | None = None, row_tokens=None, is_norm: np.ndarray | None = None,
) -> Iterator[tuple[int, pa.Table]]:
    """(unit, records) for the scored rows of a bucket, one table per read unit in unit order.

    light: the bucket's sorted light rows (unit, row, batch); keep: (n,) bool, SCORED where
    True, FILTERED where False; score: (n,) float64, None where the run computes no advantage
    (nulls); token_scale: (n,) or None for ones; reasons: (n,) why each row was filtered (kept
    rows: None); audit: values of `audit_fields` (NaN becomes null); reward: (n,) the shaped
    rewards (a SHAPED_REWARD column; rejected rows' records have none); row_tokens: a
    TokenColumn over the n rows (a ROW_TOKENS column); is_norm: (n,) an IS_NORM column.
    """
    n = len(keep)
    status = np.where(keep, SCORED, FILTERED).astype(np.int8)
    has_score = score is not None
    bad = unpublishable(keep, score, token_scale, reward)
    if bad is not None:  # a number that cannot be written: the row is rejected with it
        status[bad] = REJECTED
        why = np.full(n, None, dtype=object) if reasons is None else np.asarray(reasons, dtype=object).copy()
        for i in np.flatnonzero(bad):
            why[i] = _unpublishable_reason(i, score, token_scale, reward)
        reasons = why
        has_score = True if score is None else ~bad
    out = pa.table(
        {
            "unit": light["unit"], "row": light["row"], "batch": light["batch"], "status": status,
            "score": np.zeros(n) if score is None else score,
            "token_scale": np.ones(n) if token_scale is None else token_scale,
        }
    )
    if reasons is not None:
        out = out.append_column("reason", pa.array(list(reasons), pa.string()))
    if not isinstance(has_score, bool):
        out = out.append_column("has_score", pa.array(has_score))
    if audit:
        for f in audit_fields:
            out = out.append_column(f, pa.array(audit[f.name], f.type, from_pandas=True))  # NaN -> null
    if reward is not None:
        out = out.append_column(SHAPED_REWARD, pa.array(np.asarray(reward, dtype=np.float64)))
    if row_tokens is not None:
        values = np.asarray(row_tokens.values, dtype=np.float64)[int(row_tokens.offsets[0]) :]
        offsets = np.asarray(row_tokens.offsets, dtype=np.int64) - int(row_tokens.offsets[0])
        out = out.append_column(ROW_TOKENS, pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values)))
    if is_norm is not None:
        out = out.append_column(IS_NORM, pa.array(np.asarray(is_norm, dtype=np.float64)))
    for unit, part in split_by(out, out["unit"].to_numpy()):
        rec = records(
            part["row"].to_numpy(),
            part["batch"].combine_chunks(),
            part["status"].to_numpy(),
            part["score"].to_numpy(),
            part["token_scale"].to_numpy(),
            reason=part["reason"].to_pylist() if "reason" in part.column_names else None,
            has_score=has_score if isinstance(has_score, bool) else part["has_score"].to_numpy(zero_copy_only=False),
        )
        for f in audit_fields if audit else ():
            rec = rec.append_column(part.schema.field(f.name), part[f.name])
        if reward is not None:
            rec = rec.append_column(SHAPED_REWARD, part[SHAPED_REWARD])
        if row_tokens is not None:
            rec = rec.append_column(ROW_TOKENS, part[ROW_TOKENS])
        if is_norm is not None:
            rec = rec.append_column(IS_NORM, part[IS_NORM])
        yield unit, rec
