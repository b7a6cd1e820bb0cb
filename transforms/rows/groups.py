"""A bucket's light rows made into groups for the math: sorted by (batch, task, run, step),
rows sharing an id rejected, (batch, task) groups cut by offsets, group sizes capped, and the
rows handed to the strategies as GroupedRows tensors."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rescore.errors import GroupTooLarge
from rescore.transforms.rows.tensors import to_device
from rescore.transforms.rows.keys import EXTRA_PREFIX, ID_KEYS, SORT_KEYS, split_by, string_codes, task_hash
from rescore.transforms.rows.outcomes import REJECTED, records
from rescore.schemas.lists import flat_list
from rescore.transforms.strategies import GroupedRows
from rescore.transforms.strategies.base import TokenColumn

if TYPE_CHECKING:
    import torch


def _changes(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """(n,) bool: row i differs from row i - 1 in this column (row 0 counts as a change)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n = len(arr)
    out = np.ones(n, dtype=bool)
    if n > 1:
        out[1:] = pc.not_equal(arr.slice(1), arr.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    return out


def sort_rows(light: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Rows sorted by (batch, task, run, step) with rows sharing an id removed.

    Returns (sorted unique rows, the removed rows). Every copy of a duplicated id is removed:
    no copy has a better claim than another, and keeping one would depend on read order.
    """
    light = light.sort_by(SORT_KEYS)
    new_id = np.zeros(light.num_rows, dtype=bool)
    for key in ID_KEYS:
        new_id |= _changes(light[key])
    # A row is a duplicate if it starts no new id, or the next row starts none.
    dup = ~new_id
    dup[:-1] |= ~new_id[1:]
    if not dup.any():
        return light, light.slice(0, 0)
    return light.filter(pa.array(~dup)), light.filter(pa.array(dup))


def group_offsets(light: pa.Table) -> np.ndarray:
    """(G + 1,) int64 boundaries of the (batch, task) groups of sorted light rows."""
    starts = np.flatnonzero(_changes(light["batch"]) | _changes(light["task"]))
    return np.append(starts, light.num_rows).astype(np.int64)


def to_grouped_rows(light: pa.Table, device: torch.device) -> GroupedRows:
    """The light rows of a bucket (sorted) as tensors on `device`, each copied once."""

    def t(name, dtype):
        return to_device(np.asarray(light[name].to_numpy(zero_copy_only=False), dtype=dtype), device)

    names = light.column_names
    lists = [n for n in names if n.startswith(EXTRA_PREFIX) and pa.types.is_large_list(light.schema.field(n).type)]
    return GroupedRows(
        reward=t("reward", np.float64),
        offsets=to_device(group_offsets(light), device),
        batch=t("batch", np.int64),
        run=t("run", np.int64),
        step=t("step", np.int64),
        action_tokens=t("action_tokens", np.int64),
        mean_logprob=t("mean_logprob", np.float64) if "mean_logprob" in names else None,
        expert=t("expert", bool) if "expert" in names else None,
        response_length=t("response_length", np.int64) if "response_length" in names else None,
        last_action=t("last_action", bool) if "last_action" in names else None,
        task_key=to_device(task_hash(light["task"].combine_chunks()).view(np.int64), device),
        columns={n[len(EXTRA_PREFIX) :]: _scalar_column(light, n, device) for n in names if n.startswith(EXTRA_PREFIX) and n not in lists},
        token_columns={n[len(EXTRA_PREFIX) :]: _token_column(light[n]) for n in lists},
    )


def _scalar_column(light: pa.Table, name: str, device: torch.device):
    """A light scalar column as a tensor: float64 numbers, int64 integers, and for a string
    column int64 codes equal exactly where the strings are (rows/keys.py string_codes; 0: null),
    so rows share a state or a status only where their strings do, whatever their hashes."""
    type_ = light.schema.field(name).type
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        values = string_codes(light[name])
    else:
        values = np.asarray(light[name].to_numpy(zero_copy_only=False), dtype=np.int64 if pa.types.is_integer(type_) else np.float64)
    return to_device(values, device)


def _token_column(column: pa.ChunkedArray) -> TokenColumn:
    """A light list column (a token feature) as a numpy TokenColumn with offsets from 0."""
    flat = flat_list(column)
    return TokenColumn(flat.offsets - flat.offsets[0], np.asarray(flat.values.to_numpy(zero_copy_only=False), dtype=np.float64))


def duplicate_records(dups: pa.Table) -> Iterator[tuple[int, pa.Table]]:
    """(unit, rejected records) for rows whose id appears more than once."""
    ids = list(zip(*(dups[k].to_pylist() for k in ID_KEYS)))
    count = Counter(ids)
    reasons = [
        f"duplicate_id: (batch={b}, task={t!r}, run={r}, step={s}) appears {count[(b, t, r, s)]} times"
        for b, t, r, s in ids
    ]
    dups = dups.append_column("reason", pa.array(reasons, pa.string()))
    for unit, part in split_by(dups, dups["unit"].to_numpy()):
        yield unit, records(part["row"].to_numpy(), part["batch"].combine_chunks(), REJECTED, reason=part["reason"].to_pylist())


def check_group_sizes(light: pa.Table, max_group_rows: int) -> None:
    offsets = group_offsets(light)
    sizes = np.diff(offsets)
    if len(sizes) and sizes.max() > max_group_rows:
        g = int(np.argmax(sizes))
        first = offsets[g]
        raise GroupTooLarge(
            f"task group (batch={light['batch'][first].as_py()}, task={light['task'][first].as_py()!r}) has "
            f"{int(sizes[g]):,} rows, more than --max-group-rows={max_group_rows:,}; a group is scored in "
            "one piece on one worker, so raise the cap only where a worker has the memory "
            "(about 100 bytes per row), or check the input for a task id shared by mistake"
        )


def prepare_bucket(parts: list[pa.Table], max_group_rows: int) -> tuple[pa.Table, pa.Table]:
    """A bucket's light rows (in any number of parts) as (sorted unique rows, rows with a
    duplicated id); GroupTooLarge where a group passes `max_group_rows`."""
    if sum(p.num_rows for p in parts) > max_group_rows:
        check_group_sizes(pa.concat_tables(parts).sort_by(SORT_KEYS[:2]), max_group_rows)
    return sort_rows(pa.concat_tables(parts))


def batch_stats_per_row(light: pa.Table, batch_stats: dict[int, tuple[float, ...]]) -> np.ndarray:
    """(n, k) float64: the statistics of each light row's batch (batch_stats: batch -> k values,
    the strategy chain's batch-level statistics)."""
    batches, inverse = np.unique(light["batch"].to_numpy(), return_inverse=True)
    stats = np.array([batch_stats[int(b)] for b in batches], dtype=np.float64).reshape(len(batches), -1)
    return stats[inverse]
