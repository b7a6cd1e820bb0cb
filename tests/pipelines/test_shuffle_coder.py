"""The bucket shuffle of a real run goes through the Arrow IPC coder (tests/rows/test_coders.py
checks the coder itself)."""

from rescore.transforms.coders import ArrowTableCoder


def test_bucket_shuffle_goes_through_the_arrow_coder(tmp_path, rescore, monkeypatch):
    from data import random_rows, write_parquet

    calls = []
    original = ArrowTableCoder.encode
    monkeypatch.setattr(ArrowTableCoder, "encode", lambda self, t: calls.append(t.num_rows) or original(self, t))
    rows = random_rows(seed=2)
    rescore(write_parquet(rows, str(tmp_path / "in")), "--strategy", "grpo")
    assert sum(calls) >= len(rows)  # every valid row crossed the GroupByKey as Arrow IPC
