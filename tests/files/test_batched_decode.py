"""unit_read.read_unit decodes a unit in batches of about READ_BATCH_VALUES list values (the
Parquet list reader otherwise grows whole-unit buffers by reallocation) and joins them: the
table must be exactly what pyarrow's `read_row_groups` gives, whatever the batch size (and
unjoined, joined=False, the same values in the batches' chunks)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rescore.transforms import unit_read
from rescore.transforms.input_plan import ReadUnit
from rescore.transforms.unit_read import read_unit


def _file(path, rows: int, row_group: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, rows)
    lengths[3] = 300  # one row longer than a small batch's share
    table = pa.table({
        "batch": pa.array(rng.integers(0, 3, rows), pa.int64()),
        "task": pa.array([f"t{k % 7}" for k in range(rows)]),
        "reward": pa.array([None if k == 5 else float(k) for k in range(rows)], pa.float64()),
        "tokens": pa.array([list(range(n)) for n in lengths], pa.list_(pa.int32())),
        "action_mask": pa.array([None if k == 9 else [1] * int(n) for k, n in enumerate(lengths)], pa.list_(pa.int8())),
        "meta": pa.array([{"a": k, "b": [0.5] * (k % 4)} for k in range(rows)],
                         pa.struct([("a", pa.int64()), ("b", pa.list_(pa.float32()))])),
    }).replace_schema_metadata({"origin": "test"})
    pq.write_table(table, path, row_group_size=row_group)
    return path


@pytest.mark.parametrize("batch_values", [1, 2000, 8000, 1 << 20])  # 64, ~100, ~400 rows, whole groups
@pytest.mark.parametrize("columns", [None, ["reward", "tokens"], ["task"], ["meta", "batch"]])
def test_batched_read_equals_whole_read(tmp_path, monkeypatch, batch_values, columns):
    monkeypatch.setattr(unit_read, "READ_BATCH_VALUES", batch_values)
    path = _file(str(tmp_path / "x.parquet"), rows=500, row_group=120)
    groups = (0, 1, 3)  # row 3 (300 values), the null reward and the null mask are in group 0
    unit = ReadUnit(0, path, groups, sum(pq.ParquetFile(path).metadata.row_group(g).num_rows for g in groups))
    expected = pq.ParquetFile(path).read_row_groups(list(groups), columns=columns)
    got = read_unit(unit, columns)
    assert got.equals(expected)
    assert got.schema.equals(expected.schema, check_metadata=True)  # the file's metadata too
    assert all(c.num_chunks == 1 for c in got.columns)  # joined: the writer takes it as it is
    chunked = read_unit(unit, columns, joined=False)  # the read step's, where the table is not kept
    assert chunked.equals(expected) and chunked.schema.equals(expected.schema, check_metadata=True)
    batches = -(-unit.num_rows // unit_read._batch_rows(pq.ParquetFile(path), list(groups), columns))
    assert all(c.num_chunks >= min(batches, 3) for c in chunked.columns)  # one chunk per batch (at least one per row group)


def test_batch_rows_follow_the_widest_column_read(tmp_path):
    path = _file(str(tmp_path / "x.parquet"), rows=500, row_group=500)
    pf = pq.ParquetFile(path)
    per_row = pf.metadata.row_group(0).column(3).num_values / 500  # tokens: ~20 values a row
    assert unit_read._batch_rows(pf, [0], None) == int(unit_read.READ_BATCH_VALUES // per_row)
    assert unit_read._batch_rows(pf, [0], ["batch", "reward"]) == 1 << 16  # scalars: capped


def test_empty_unit_keeps_the_schema(tmp_path):
    path = str(tmp_path / "empty.parquet")
    pq.write_table(pa.table({"x": pa.array([], pa.int64()), "l": pa.array([], pa.list_(pa.int32()))}), path)
    groups = tuple(range(pq.ParquetFile(path).num_row_groups))
    got = read_unit(ReadUnit(0, path, groups, 0))
    assert got.num_rows == 0 and got.schema.names == ["x", "l"]


def test_batch_rows_count_each_columns_own_leaves(tmp_path):
    """A column named "x.y" is not a part of a column "x": the footer's leaves are matched to
    columns by the schema, not by splitting dotted paths."""
    path = str(tmp_path / "dotted.parquet")
    table = pa.table({
        "x": pa.array([[1] * 50] * 100, pa.list_(pa.int32())),
        "x.y": pa.array(range(100), pa.int64()),
        "s": pa.array([{"a": k, "b": [k] * 100} for k in range(100)]),
    })
    pq.write_table(table, path)
    pf = pq.ParquetFile(path)
    assert unit_read._batch_rows(pf, [0], ["x.y"]) == 1 << 16
    assert unit_read._batch_rows(pf, [0], ["x"]) == int(unit_read.READ_BATCH_VALUES // 50)
    assert unit_read._batch_rows(pf, [0], ["s"]) == int(unit_read.READ_BATCH_VALUES // 100)
    assert read_unit(ReadUnit(0, path, (0,), 100), ["s", "x.y"]).equals(pf.read_row_groups([0], columns=["s", "x.y"]))


def test_a_column_name_twice_reads_as_the_file_gives_it(tmp_path):
    """Columns are decoded one name at a time; a file whose schema holds a name twice (hostile
    input that Parquet allows) is read whole instead, exactly as pyarrow reads it."""
    path = str(tmp_path / "dup.parquet")
    table = pa.Table.from_arrays(
        [pa.array([1, 2, 3], pa.int64()), pa.array([[1], [2, 3], []], pa.list_(pa.int32())), pa.array([0.5, 1.5, 2.5])],
        names=["batch", "tokens", "batch"],
    )
    pq.write_table(table, path, row_group_size=2)
    unit = ReadUnit(0, path, (0, 1), 3)
    got = read_unit(unit)
    assert got.equals(pq.ParquetFile(path).read_row_groups([0, 1])) and got.column_names == ["batch", "tokens", "batch"]
    assert all(c.num_chunks == 1 for c in got.columns)
