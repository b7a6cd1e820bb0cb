"""A row group larger than --shard-rows is planned as slices (input_plan.file_units) and each slice
is read with the column decoders of files/row_group_slices.py: the same rows, types and schema
as pyarrow's read of the whole row group, sliced; each row decoded once when the slices are read
in order, or two at a time; a read behind its decoder starts over."""

import random
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import unit_cache
from rescore.transforms.files.row_group_slices import SliceDecoders
from rescore.transforms.input_plan import ReadUnit, file_units, plan_input
from rescore.transforms.unit_read import read_unit

ROWS = 5_000


@pytest.fixture()
def one_group(tmp_path):
    """A file of one row group of ROWS rows: ids, a reward with nulls, token lists of varying
    length (some empty, some null), a string column; with schema metadata."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(0, 700, ROWS)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    tokens = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(0, 1000, offsets[-1], dtype=np.int32)),
                                      mask=pa.array(rng.random(ROWS) < 0.02))
    table = pa.table({
        "batch": np.arange(ROWS, dtype=np.int64) // 64,
        "task": (np.arange(ROWS) // 8 % 8).astype(np.int64),
        "run": (np.arange(ROWS) % 8).astype(np.int64),
        "reward": pa.array(rng.random(ROWS), mask=rng.random(ROWS) < 0.05),
        "ids": tokens,
        "note": pa.array([f"row {i}" for i in range(ROWS)]),
    }).replace_schema_metadata({"origin": "test"})
    path = str(tmp_path / "one.parquet")
    pq.write_table(table, path, row_group_size=ROWS)
    return path, pq.ParquetFile(path).read_row_group(0)


@pytest.fixture()
def slices():
    """The decoders of one run (a UnitStore's, transforms/unit_store.py)."""
    decoders = SliceDecoders()
    yield decoders
    decoders.clear()


def _units(path, shard_rows=1_000):
    return list(plan_input([path], shard_rows=shard_rows).units)


def _check(unit, got, whole, columns=None):
    want = whole if columns is None else whole.select(columns)
    assert got.equals(want.slice(unit.rows[0], unit.num_rows), check_metadata=True)
    assert got.schema.equals(want.schema, check_metadata=True)
    assert all(column.num_chunks == 1 for column in got.columns)


def test_file_units_slice_only_row_groups_past_shard_rows():
    units = file_units("f", [30, 30, 100, 0, 40], 40, first=7)
    assert [(u.index, u.row_groups, u.rows, u.num_rows) for u in units] == [
        (7, (0,), None, 30), (8, (1,), None, 30),
        (9, (2,), (0, 33), 33), (10, (2,), (33, 66), 33), (11, (2,), (66, 100), 34),
        (12, (4,), None, 40),
    ]
    assert units[2].where() == "rows 0-32 of row group 2" and units[0].where() == "row groups [0]"
    # slices of one row group with equal rows are different units to the cache
    assert unit_cache.unit_key(units[2]) != unit_cache.unit_key(units[3])


def test_slices_read_in_order_decode_each_row_once(one_group, slices):
    path, whole = one_group
    units = _units(path)
    assert len(units) == 5 and [u.rows for u in units][:2] == [(0, 1000), (1000, 2000)]
    start = type(slices.stats)(**vars(slices.stats))
    for unit in units:
        _check(unit, read_unit(unit, slices=slices), whole)
    assert slices.stats.decoded_rows - start.decoded_rows == ROWS * whole.num_columns
    assert slices.stats.restarts == start.restarts
    assert slices.open() == 0  # read to the end: closed


def test_any_order_and_any_columns_give_the_same_rows(one_group, slices):
    path, whole = one_group
    units = _units(path, shard_rows=700)
    order = list(range(len(units)))
    random.Random(5).shuffle(order)
    for k in order:
        _check(units[k], read_unit(units[k], ["ids", "batch"], slices=slices), whole, ["ids", "batch"])
    for k in reversed(order):
        _check(units[k], read_unit(units[k], slices=slices), whole)


def test_a_slice_ahead_keeps_the_rows_it_passes_for_the_next_read(one_group, slices):
    path, whole = one_group
    units = _units(path)
    start = slices.stats.decoded_rows
    for k in (1, 0, 3, 2, 4):  # two threads asking for consecutive slices, the second first
        _check(units[k], read_unit(units[k], ["ids"], slices=slices), whole, ["ids"])
    assert slices.stats.decoded_rows - start == ROWS


def test_a_read_behind_its_decoder_starts_over(one_group, slices):
    path, whole = one_group
    units = _units(path)
    restarts = slices.stats.restarts
    for k in (0, 1, 2, 0):
        _check(units[k], read_unit(units[k], ["reward"], slices=slices), whole, ["reward"])
    assert slices.stats.restarts == restarts + 1


def test_slices_read_on_threads(one_group, slices):
    path, whole = one_group
    units = _units(path, shard_rows=500)
    got, errors = {}, []

    def read(unit):
        try:
            got[unit.index] = read_unit(unit, slices=slices)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    start = slices.stats.decoded_rows
    for first in range(0, len(units), 2):
        threads = [threading.Thread(target=read, args=(u,)) for u in units[first:first + 2]]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    for unit in units:
        _check(unit, got[unit.index], whole)
    assert slices.stats.decoded_rows - start == ROWS * whole.num_columns


def test_a_failed_read_leaves_the_next_read_right(slices):
    batches = [pa.record_batch({"x": pa.array(np.arange(k, k + 10))}) for k in range(0, 50, 10)]
    calls = []

    def open_column(name):
        calls.append(name)
        for i, batch in enumerate(batches):
            if len(calls) == 1 and i == 2:
                raise OSError("disk went away")
            yield batch

    with pytest.raises(OSError):
        slices.read(("f", None, 0), 50, 0, 25, ["x"], open_column)
    got = slices.read(("f", None, 0), 50, 0, 25, ["x"], open_column)
    assert got["x"].to_pylist() == list(range(25)) and len(calls) == 2
    assert slices.read(("f", None, 0), 50, 25, 50, ["x"], open_column)["x"].to_pylist() == list(range(25, 50))
    with pytest.raises(ValueError, match="ended after 50 rows, the footer says 60"):
        slices.read(("g", None, 0), 60, 40, 60, ["x"], lambda name: iter(batches))
    slices.clear()
    assert slices.open() == 0


def test_a_sliced_file_changed_after_planning_is_not_read(one_group, slices, tmp_path):
    path, whole = one_group
    unit = _units(path)[2]
    read_unit(_units(path)[0], slices=slices)  # decoders open on the planned file
    pq.write_table(whole.slice(0, 10), path)
    with pytest.raises(fingerprints.InputChanged):
        read_unit(unit, slices=slices)


def test_unit_of_a_row_group_is_read_whole(one_group, slices):
    path, whole = one_group
    (unit,) = _units(path, shard_rows=ROWS)
    assert unit.rows is None and read_unit(unit, slices=slices).equals(whole)
    assert isinstance(unit, ReadUnit)


def test_a_slice_read_without_the_runs_decoders_gives_the_same_rows(one_group):
    """read_unit with no SliceDecoders (a read on its own, e.g. the launcher's) decodes the rows
    before the slice with decoders of its own and leaves nothing open."""
    path, whole = one_group
    for unit in reversed(_units(path)):
        _check(unit, read_unit(unit), whole)
