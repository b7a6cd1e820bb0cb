"""A retried write bundle rewrites its files, byte for byte: what a runner that restarts a task
(Flink's region failover after a lost TaskManager, Dataflow's bundle retries) relies on. The
first attempt's staged files are left cut short (a worker killed mid-write); the retry writes
the same names with the bytes of a write that was never interrupted, and nothing else."""

import os

import apache_beam as beam
import numpy as np
import pytest
from shell_data import grpo, pipeline, write_experience

from rescore.transforms.read import plan_input
from rescore.transforms.rows.outcomes import REJECTED, SCORED, records
from rescore.transforms.settings import StepSettings
from rescore.transforms.strategies import build_chain
from rescore.transforms.write import WriteScored

UNIT_RECORDS = [
    (0, records(np.arange(4), [0] * 4, SCORED, grpo([1.0, 0.0, 0.0, 1.0]))),
    (1, records([0, 1, 2, 3], [0, 0, 1, 1], SCORED, grpo([0.0, 2.0, 1.0, 1.0]))),
    (2, records([0], [1], REJECTED, reason=["null_value: reward is null"], has_score=False)),
]


def _write(plan, out):
    chain = build_chain(["grpo"], {})
    with pipeline() as p:
        p | "Units" >> beam.Create(UNIT_RECORDS) | WriteScored(
            plan, str(out), chain, None, StepSettings(device="cpu", io_threads=1))
    staging = os.path.join(out, "_staging")
    return {n: open(os.path.join(staging, n), "rb").read() for n in sorted(os.listdir(staging)) if n.endswith(".parquet")}


@pytest.mark.slow  # three pipelines: ~10 s on a loaded machine
def test_a_retried_write_rewrites_the_same_bytes_over_a_cut_short_attempt(tmp_path):
    plan = plan_input([write_experience(tmp_path / "in")], shard_rows=4)
    clean = _write(plan, tmp_path / "clean")
    assert sorted(clean) == ["rejected-00002-of-00003.parquet", "scored-00000-of-00003.parquet",
                             "scored-00001-of-00003.parquet", "scored-00002-of-00003.parquet"]
    # the killed attempt: every staged file there, cut to half its length (and one to nothing)
    retried = tmp_path / "retried"
    staging = retried / "_staging"
    staging.mkdir(parents=True)
    for i, (name, data) in enumerate(sorted(clean.items())):
        (staging / name).write_bytes(b"" if i == 0 else data[: len(data) // 2])
    assert _write(plan, retried) == clean
    assert _write(plan, retried) == clean  # and again: a second retry changes nothing either
