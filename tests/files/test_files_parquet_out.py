"""files/parquet_out.py: output files written by polars (zstd 1) read back exactly as pyarrow's own
files did (schema, metadata, values), load in pyarrow, polars, DuckDB and HF datasets, and are
byte-identical across runs and thread counts; schemas polars would alter stay on pyarrow."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rescore.transforms.files import parquet_out

METADATA = {b"rescore.strategy": b"grpo", b"rescore.params": b'{"grpo": {"epsilon": 1e-06}}', b"rescore.version": b"0.1.0"}


def scored_table(rows: int = 300, seed: int = 0) -> pa.Table:
    """A scored table as _WriteUnit builds it: input columns, list columns with nulls and empty
    lists, a string task, a field with metadata, advantages/returns sharing one array."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 12, rows)
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    total = int(lengths.sum())
    valid = rng.random(rows) > 0.1
    advantages = pa.ListArray.from_arrays(offsets, pa.array(rng.standard_normal(total).astype(np.float32)), mask=pa.array(~valid))
    schema = pa.schema(
        [
            ("batch", pa.int64()), ("task", pa.string()), ("run", pa.int64()), ("step", pa.int64()),
            pa.field("reward", pa.float64(), metadata={b"unit": b"points"}),
            ("tokens", pa.list_(pa.int32())), ("prompt_length", pa.int64()), ("logprobs", pa.list_(pa.float32())),
            ("action_mask", pa.list_(pa.int8())), ("flags", pa.list_(pa.bool_())), ("note", pa.string()),
            ("advantages", pa.list_(pa.float32())), ("returns", pa.list_(pa.float32())), ("score", pa.float32()),
        ],
        metadata=METADATA,
    )
    columns = [
        pa.array(rng.integers(0, 4, rows)), pa.array([f"q{t}" for t in rng.integers(0, 9, rows)]),
        pa.array(rng.integers(0, 8, rows)), pa.array(np.zeros(rows, np.int64)),
        pa.array(np.where(rng.random(rows) > 0.05, rng.random(rows), np.nan)),
        pa.ListArray.from_arrays(offsets, pa.array(rng.integers(0, 150_000, total, dtype=np.int32))),
        pa.array(rng.integers(0, 5, rows)),
        pa.ListArray.from_arrays(offsets, pa.array(-rng.random(total, dtype=np.float32) * 3)),
        pa.ListArray.from_arrays(offsets, pa.array((rng.random(total) > 0.1).astype(np.int8))),
        pa.ListArray.from_arrays(offsets, pa.array(rng.random(total) > 0.5)),
        pa.array([None if i % 7 == 0 else f"row {i} é" for i in range(rows)]),
        advantages, advantages,
        pa.array(rng.standard_normal(rows).astype(np.float32), mask=~valid),
    ]
    return pa.Table.from_arrays(columns, schema=schema)


def pyarrow_reference(table: pa.Table, tmp_path) -> pa.Table:
    """What the same table read back as when pyarrow wrote it (before polars' writer)."""
    path = str(tmp_path / "reference.parquet")
    pq.write_table(table, path)
    return pq.read_table(path)


def same_values(a: pa.Table, b: pa.Table) -> bool:
    """Column by column; float64 columns bit for bit (NaN != NaN for Table.equals)."""
    if a.column_names != b.column_names:
        return False
    for name in a.column_names:
        x, y = a[name], b[name]
        if x.type == pa.float64():
            if x.null_count != y.null_count or not np.array_equal(x.to_numpy().view(np.uint64), y.to_numpy().view(np.uint64)):
                return False
        elif not x.equals(y):
            return False
    return True


def test_polars_writes_the_table_pyarrow_reads_back(tmp_path):
    table = scored_table()
    path = str(tmp_path / "out" / "scored.parquet")
    assert parquet_out.write_table(table, path, plain=("advantages", "returns")) == "polars"
    back, reference = pq.read_table(path), pyarrow_reference(table, tmp_path)
    assert back.schema.equals(reference.schema, check_metadata=True)
    assert back.schema.field("reward").metadata == {b"unit": b"points"}
    assert {k: v for k, v in back.schema.metadata.items()} == METADATA
    assert same_values(back, reference) and np.isnan(back["reward"].to_numpy()).any()
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 1 and meta.num_rows == table.num_rows
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}
    assert pq.ParquetFile(path).schema.equals(pq.ParquetFile(str(tmp_path / "reference.parquet")).schema)


def test_empty_and_sliced_tables(tmp_path):
    table = scored_table(50)
    for name, part in (("empty", table.slice(0, 0)), ("slice", table.slice(17, 20))):
        path = str(tmp_path / f"{name}.parquet")
        parquet_out.write_table(part, path)
        back = pq.read_table(path)
        assert back.num_rows == part.num_rows
        assert same_values(back, pyarrow_reference(part, tmp_path))


@pytest.mark.slow
def test_other_readers_load_it(tmp_path, monkeypatch):
    import polars as pl

    table = scored_table(200, seed=3)
    path = str(tmp_path / "scored.parquet")
    parquet_out.write_table(table, path)

    frame = pl.read_parquet(path)
    assert frame["score"].to_list() == table["score"].to_pylist()
    assert frame["tokens"].to_list() == table["tokens"].to_pylist()
    assert frame["note"].to_list() == table["note"].to_pylist()

    duckdb = pytest.importorskip("duckdb")
    count, tokens, scored = duckdb.sql(
        f"SELECT count(*), sum(len(tokens)), count(score) FROM read_parquet('{path}')"
    ).fetchall()[0]
    assert (count, tokens, scored) == (200, sum(len(t) for t in table["tokens"].to_pylist()), 200 - table["score"].null_count)

    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ds = datasets.load_dataset("parquet", data_files=path, split="train", cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == 200 and ds.features["advantages"].feature.dtype == "float32"
    assert ds[5]["tokens"] == table["tokens"][5].as_py() and ds[5]["note"] == table["note"][5].as_py()


WRITE_ONCE = """
import sys
sys.path.insert(0, {here!r})
from test_files_parquet_out import scored_table
from rescore.transforms.files import parquet_out
print(parquet_out.write_table(scored_table(2000, seed=1), sys.argv[1]))
"""


@pytest.mark.slow
def test_same_bytes_across_processes_and_thread_counts(tmp_path):
    code = WRITE_ONCE.format(here=os.path.dirname(os.path.abspath(__file__)))
    digests = []
    for threads in ("1", "2", "4"):
        path = str(tmp_path / f"t{threads}.parquet")
        env = {**os.environ, "POLARS_MAX_THREADS": threads}
        subprocess.run([sys.executable, "-c", code, path], check=True, env=env, capture_output=True)
        with open(path, "rb") as f:
            digests.append(f.read())
    assert digests[0] == digests[1] == digests[2]


WRITTEN_BY_POLARS = {
    "timestamp_ns_utc": pa.array([0, None, 1_700_000_000_123_456_789], pa.timestamp("ns", "UTC")),
    "timestamp_s": pa.array([0, None, 1_700_000_000], pa.timestamp("s")),
    "timestamp_ms_tz": pa.array([0, None, 1_700_000_000_123], pa.timestamp("ms", "Europe/Paris")),
    "date": pa.array([0, None, 19000], pa.date32()),
    "large_string": pa.array(["x", None, "é"], pa.large_string()),
    "uint64": pa.array([0, None, 2**64 - 1], pa.uint64()),
    "int8": pa.array([-128, None, 127], pa.int8()),
    "struct": pa.array([{"x": 1, "s": "a"}, None, {"x": None, "s": None}], pa.struct([("x", pa.int32()), ("s", pa.string())])),
    "large_list": pa.array([[1], None, []], pa.large_list(pa.int32())),
    "large_binary": pa.array([b"a", None, b"\x00\xff"], pa.large_binary()),
    "list_of_lists": pa.array([[[1, None], None, []], None, [[]]], pa.list_(pa.list_(pa.int64()))),
    "list_of_structs": pa.array([[{"a": 1}, None], None, [{"a": None}]], pa.list_(pa.struct([("a", pa.int64())]))),
    "struct_of_list": pa.array([{"l": [1, None]}, None, {"l": None}], pa.struct([("l", pa.list_(pa.int64()))])),
    "list_of_bools": pa.array([[True, None, False], None, []], pa.list_(pa.bool_())),
}


@pytest.mark.parametrize("name", sorted(WRITTEN_BY_POLARS))
def test_extra_column_types_round_trip(tmp_path, name):
    """Input columns Rescore carries through unchanged: every type polars takes reads back as
    pyarrow's own file did (whole and sliced, as parts are)."""
    table = pa.table({name: WRITTEN_BY_POLARS[name], "row": pa.array([1, 2, 3])})
    for part in (table, table.slice(1, 2)):
        path = str(tmp_path / f"{name}.parquet")
        assert parquet_out.write_table(part, path) == "polars"
        back, reference = pq.read_table(path), pyarrow_reference(part, tmp_path)
        assert back.schema.equals(reference.schema, check_metadata=True) and back.equals(reference)


def add_column(table: pa.Table, field: pa.Field, values: list) -> pa.Table:
    if field.name in table.column_names:
        return table.set_column(table.schema.get_field_index(field.name), field, table[field.name])
    return table.append_column(field, pa.array(values, field.type))


@pytest.mark.parametrize(
    "field, values",
    [
        (pa.field("reward", pa.float64(), nullable=False), None),  # polars writes every column optional
        (pa.field("window", pa.list_(pa.int32(), 2)), [[1, 2], [3, None]] * 10),  # not on the list polars is checked for
        (pa.field("price", pa.decimal128(10, 2)), [None] * 20),
        (pa.field("label", pa.dictionary(pa.int32(), pa.string())), ["a", None] * 10),
    ],
    ids=["non-nullable", "fixed-size-list", "decimal", "dictionary"],
)
def test_schemas_polars_would_alter_stay_on_pyarrow(tmp_path, field, values):
    table = add_column(scored_table(20), field, values)
    encoding = parquet_out.encoding_for(table.schema, ("advantages",))
    assert encoding.writer == "pyarrow"
    path, reference = str(tmp_path / "pyarrow.parquet"), str(tmp_path / "reference.parquet")
    assert parquet_out.write_table(table, path, plain=("advantages",)) == "pyarrow"
    pq.write_table(table, reference, use_dictionary=encoding.use_dictionary)
    with open(path, "rb") as a, open(reference, "rb") as b:
        assert a.read() == b.read()  # exactly what Rescore wrote before
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["advantages.list.element"]
    assert "RLE_DICTIONARY" in encodings["returns.list.element"]
    assert same_values(pq.read_table(path), pq.read_table(reference))
