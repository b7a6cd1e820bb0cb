"""In-process runs without --buckets take one bucket per LOCAL_BUCKET_ROWS rows (8 to 64): the
score step runs buckets one after another there, and the scores never depend on the count."""

import json
from pathlib import Path

import pytest
from data import SCHEMA_INT_TASK, random_rows, write_parquet

from rescore.pipelines.config import DEFAULT_BUCKETS, LOCAL_BUCKET_ROWS, local_buckets


def test_local_bucket_counts():
    assert local_buckets(0) == 8 and local_buckets(204_800) == 8
    assert local_buckets(8 * LOCAL_BUCKET_ROWS) == 8 and local_buckets(8 * LOCAL_BUCKET_ROWS + 1) == 9
    assert local_buckets(10_000_000) == DEFAULT_BUCKETS == 64


@pytest.mark.slow
def test_default_and_chosen_buckets_score_the_same(tmp_path, rescore):
    glob = write_parquet(random_rows(seed=31, batches=8), str(tmp_path / "in"), files=2, row_group_size=9, schema=SCHEMA_INT_TASK)
    outputs = {}
    for name, args in (("auto", ()), ("chosen", ("--buckets", "64")), ("one", ("--buckets", "1"))):
        doc, out = rescore(glob, "--strategy", "reward_variance,grpo,duplicate_informative", *args, output=str(tmp_path / name))
        outputs[name] = {p.name: p.read_bytes() for p in sorted(Path(out).glob("*.parquet"))}
        outputs[name + " metrics"] = {k: v for k, v in json.loads((Path(out) / "metrics.json").read_text()).items()
                                      if k not in ("buckets", "output")}
        assert doc["buckets"] == {"auto": 8, "chosen": 64, "one": 1}[name]
    assert outputs["auto"] == outputs["chosen"] == outputs["one"] and len(outputs["auto"]) >= 2
    assert outputs["auto metrics"] == outputs["chosen metrics"] == outputs["one metrics"]
