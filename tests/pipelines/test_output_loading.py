"""The scored output loads where users train: pyarrow, polars, HuggingFace datasets; its file
metadata says how it was scored; rows convert to Trinity-RFT Experience fields."""

import glob
import json
import os

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest
from data import SCHEMA_MULTI_STEP, multi_step_rows, write_parquet

DOCUMENTED = {
    "advantages": pa.list_(pa.float32()),
    "returns": pa.list_(pa.float32()),
    "score": pa.float32(),
    "copy_index": pa.int32(),
    "source_task": pa.int64(),
}


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    from rescore.pipelines.cli import run

    d = tmp_path_factory.mktemp("loading")
    rows = multi_step_rows(7)
    glob_ = write_parquet(rows, str(d / "in"), files=2, row_group_size=9, schema=SCHEMA_MULTI_STEP)
    doc = run(["--input", glob_, "--output", str(d / "out"), "--runner=FnApiRunner",
               "--strategy", "grpo,duplicate_informative", "--set", "std_cal_level=batch"])
    return str(d / "out"), doc


def test_pyarrow_reads_the_documented_schema(scored):
    out, doc = scored
    table = pads.dataset(sorted(glob.glob(os.path.join(out, "scored-*.parquet"))), format="parquet").to_table()
    assert table.num_rows == doc["totals"]["rows_written"]
    for name, expected in DOCUMENTED.items():
        assert table.schema.field(name).type == expected, name
    for name in SCHEMA_MULTI_STEP.names:
        assert table.schema.field(name).type == SCHEMA_MULTI_STEP.field(name).type  # input columns unchanged


def test_polars_reads_the_glob(scored):
    import polars as pl

    out, doc = scored
    df = pl.read_parquet(os.path.join(out, "scored-*.parquet"))
    assert df.height == doc["totals"]["rows_written"]
    assert df.schema["advantages"] == pl.List(pl.Float32) and df.schema["score"] == pl.Float32
    assert (df["advantages"].list.len() == df["action_mask"].list.len()).all()


@pytest.mark.slow
def test_huggingface_datasets_loads_the_glob(scored, tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out, doc = scored
    ds = datasets.load_dataset("parquet", data_files=os.path.join(out, "scored-*.parquet"), split="train",
                               cache_dir=str(tmp_path / "hf"))
    assert ds.num_rows == doc["totals"]["rows_written"]
    assert ds.features["advantages"].feature.dtype == "float32"
    assert ds.features["score"].dtype == "float32"


def test_file_metadata_says_how_rows_were_scored(scored):
    out, doc = scored
    for path in glob.glob(os.path.join(out, "*.parquet")):
        meta = pq.read_schema(path).metadata
        assert meta[b"rescore.version"].decode() == doc["rescore_version"]
        assert meta[b"rescore.strategy"] == b"grpo,duplicate_informative"
        assert json.loads(meta[b"rescore.params"])["grpo"]["std_cal_level"] == "batch"
        assert meta[b"rescore.config_hash"].decode() == doc["config_hash"] and len(doc["config_hash"]) == 64


def test_config_hash_changes_with_the_scoring_only():
    from rescore.pipelines.job import config_hash

    a = config_hash("grpo", {"grpo": {"epsilon": 1e-6}}, None)
    assert a == config_hash("grpo", {"grpo": {"epsilon": 1e-6}}, None)
    assert a != config_hash("grpo", {"grpo": {"epsilon": 1e-5}}, None)


def test_rows_convert_to_trinity_experience_fields(scored):
    import polars as pl

    from rescore.examples.to_trinity import experience_kwargs

    out, _ = scored
    row = pl.read_parquet(os.path.join(out, "scored-*.parquet")).to_dicts()[0]
    kwargs = experience_kwargs(row)
    assert set(kwargs["eid"]) == {"batch", "task", "run", "step"}
    assert kwargs["advantages"] == row["advantages"] and kwargs["reward"] == row["reward"]
    assert all(isinstance(m, bool) for m in kwargs["action_mask"])
    assert {"score", "copy_index", "source_task", "expert"} <= set(kwargs["info"])
