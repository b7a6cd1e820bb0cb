"""The Arrow IPC coder moves only a slice's own rows, and the shuffle uses it."""

import numpy as np
import pyarrow as pa

from rescore.transforms.coders import ArrowTableCoder


def test_slice_encodes_without_its_parent_buffer():
    parent = pa.table({"x": np.arange(1_000_000, dtype=np.int64)})
    part = parent.slice(10, 100)
    coder = ArrowTableCoder()
    encoded = coder.encode(part)
    assert len(encoded) < 10_000
    assert coder.decode(encoded).equals(part)


def test_bucket_shuffle_goes_through_the_arrow_coder(tmp_path, rescore, monkeypatch):
    from data import random_rows, write_parquet

    calls = []
    original = ArrowTableCoder.encode
    monkeypatch.setattr(ArrowTableCoder, "encode", lambda self, t: calls.append(t.num_rows) or original(self, t))
    rows = random_rows(seed=2)
    rescore(write_parquet(rows, str(tmp_path / "in")), "--strategy", "grpo")
    assert sum(calls) >= len(rows)  # every valid row crossed the GroupByKey as Arrow IPC
