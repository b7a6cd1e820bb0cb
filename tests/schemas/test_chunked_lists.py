"""List columns read from several row groups arrive as several chunks: validation and the light
rows work chunk by chunk (no concatenated copy of a token column) and must give exactly what
they give on the same column in one chunk."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from rescore.schemas.lists import flat_list
from rescore.schemas.validation import check_rows
from rescore.transforms.rows.keys import light_rows
from rescore.transforms.strategies.flat import flat_segment_sum


def _rows(n: int, seed: int, mask_type=pa.int8()) -> pa.Table:
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, 4, n)
    response = rng.integers(0, 300, n)  # past 127: an int8 sum would wrap
    cast = bool if mask_type == pa.bool_() else int
    mask = [[cast(v) for v in rng.integers(0, 2, r)] for r in response]
    mask[0] = [cast(1)] * int(response[0])
    return pa.table(
        {
            "batch": pa.array(rng.integers(0, 3, n), pa.int64()),
            "task": pa.array(rng.integers(0, 5, n), pa.int64()),
            "run": pa.array(np.arange(n), pa.int64()),
            "step": pa.array(np.zeros(n, np.int64)),
            "reward": pa.array(rng.random(n)),
            "tokens": pa.array([list(range(p + r)) for p, r in zip(prompt, response)], pa.list_(pa.int32())),
            "prompt_length": pa.array(prompt, pa.int64()),
            "logprobs": pa.array([list(-rng.random(r)) for r in response], pa.list_(pa.float32())),
            "action_mask": pa.array(mask, pa.list_(mask_type)),
        }
    )


def _chunked(table: pa.Table, cuts: list[int]) -> pa.Table:
    bounds = [0, *cuts, table.num_rows]
    parts = [table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]
    out = pa.concat_tables(parts)
    assert out["tokens"].num_chunks == len(parts)
    return out


def test_flat_list_of_chunks_equals_one_chunk():
    table = _rows(40, 0)
    table = table.set_column(5, "tokens", pa.array([None if i % 7 == 3 else v for i, v in enumerate(table["tokens"].to_pylist())], pa.list_(pa.int32())))
    whole = flat_list(table["tokens"].combine_chunks())
    parts = flat_list(_chunked(table, [5, 6, 30])["tokens"])
    assert np.array_equal(parts.valid, whole.valid)
    assert np.array_equal(parts.lengths, whole.lengths)
    assert np.array_equal(parts.offsets, whole.offsets)
    assert parts.values.to_pylist() == whole.values.to_pylist()
    assert np.array_equal(parts.values.to_numpy(zero_copy_only=False), whole.values.to_numpy(zero_copy_only=False))
    assert not whole.valid[3] and whole.lengths[3] == 0


def test_flat_list_of_an_empty_chunked_column():
    fl = flat_list(pa.chunked_array([], pa.list_(pa.int8())))
    assert len(fl.lengths) == 0 and fl.offsets.tolist() == [0] and len(fl.values) == 0


@pytest.mark.parametrize("mask_type", [pa.int8(), pa.int32(), pa.bool_()])
def test_check_rows_and_light_rows_chunked_match_one_chunk(mask_type):
    table = _rows(60, 1, mask_type)
    chunked = _chunked(table, [10, 11, 45])
    one = check_rows(table)
    many = check_rows(chunked)
    assert one.ok.all() and many.ok.all()
    assert np.array_equal(one.response_length, many.response_length)
    a = light_rows(0, table, one, task_type=pa.int64())
    b = light_rows(0, chunked, many, task_type=pa.int64())
    assert a.equals(b)
    # action_tokens is the number of 1s in each mask, past the int8 range too
    expected = [int(np.sum(np.asarray(m, dtype=np.int64))) for m in table["action_mask"].to_pylist()]
    assert b["action_tokens"].to_pylist() == expected
    assert max(expected) > 127
    last = [bool(m) and bool(m[-1]) for m in table["action_mask"].to_pylist()]
    assert b["last_action"].to_pylist() == last


def test_bad_mask_value_in_a_later_chunk_is_found_and_named():
    table = _rows(30, 2, pa.int8())
    masks = table["action_mask"].to_pylist()
    row = 25
    masks[row] = [1, 2, 0] + masks[row][3:] if len(masks[row]) >= 3 else [2]
    table = table.set_column(8, "action_mask", pa.array(masks, pa.list_(pa.int8())))
    check = check_rows(_chunked(table, [10, 20]))
    assert np.flatnonzero(~check.ok).tolist() == [row]
    assert check.reasons[row] == "bad_action_mask: action_mask values must be 0 or 1"


def test_null_mask_element_keeps_both_reasons():
    # A null element reads as NaN in the value check, as before: both reasons are recorded.
    table = _rows(12, 3, pa.int8())
    masks = table["action_mask"].to_pylist()
    masks[4] = [None] + [1] * (len(masks[4]) - 1) if masks[4] else [None]
    lengths = len(masks[4])
    tokens = table["tokens"].to_pylist()
    tokens[4] = list(range(table["prompt_length"][4].as_py() + lengths))
    logprobs = table["logprobs"].to_pylist()
    logprobs[4] = [-0.5] * lengths
    table = table.set_column(8, "action_mask", pa.array(masks, pa.list_(pa.int8())))
    table = table.set_column(5, "tokens", pa.array(tokens, pa.list_(pa.int32())))
    table = table.set_column(7, "logprobs", pa.array(logprobs, pa.list_(pa.float32())))
    check = check_rows(_chunked(table, [3, 8]))
    assert np.flatnonzero(~check.ok).tolist() == [4]
    assert check.reasons[4] == (
        "null_value: action_mask has a null element; bad_action_mask: action_mask values must be 0 or 1"
    )


def test_segment_sum_of_narrow_integers_does_not_wrap():
    values = np.ones(1000, dtype=np.int8)
    offsets = np.array([0, 0, 300, 1000])
    assert flat_segment_sum(values, offsets).tolist() == [0, 300, 700]
    assert flat_segment_sum(values.astype(bool), offsets).tolist() == [0, 300, 700]


@pytest.mark.parametrize("window", [1, 3, 17, 1 << 20])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int16, np.int32, bool])
def test_segment_sum_windows_give_each_rows_exact_sum(monkeypatch, window, dtype):
    """Narrow integers are widened a window of rows at a time: every window size (smaller than
    one row, splitting rows anywhere) gives each row's exact sum, empty rows 0, and the offsets
    may start past 0 (a slice of a longer flat array)."""
    monkeypatch.setattr("rescore.transforms.strategies.flat.SUM_WINDOW", window)
    rng = np.random.default_rng(window)
    lengths = rng.integers(0, 12, 400) * (rng.random(400) < 0.7)
    lengths[7] = 260  # one row longer than every small window
    offsets = np.concatenate([[5], 5 + np.cumsum(lengths)])
    values = rng.integers(-120, 120, int(offsets[-1]) + 3)
    values = (values > 0) if dtype is bool else values.astype(dtype)
    expected = [int(values[a:b].astype(np.int64).sum()) for a, b in zip(offsets[:-1], offsets[1:])]
    got = flat_segment_sum(values, offsets)
    assert got.dtype == np.int64
    assert got.tolist() == expected
    assert got[7] == int(values[offsets[7] : offsets[8]].astype(np.int64).sum())
