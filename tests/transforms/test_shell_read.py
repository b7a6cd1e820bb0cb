"""ReadExperiences on a TestPipeline: light rows keyed by bucket, whole groups per bucket, and a
rejected record for the row with a null reward."""

import numpy as np
import pyarrow as pa
from apache_beam.testing.util import assert_that, equal_to
from shell_data import ROWS, gathered, pipeline, write_experience

from rescore.transforms.read import ReadExperiences, plan_input
from rescore.transforms.rows.keys import bucket_of
from rescore.transforms.rows.outcomes import REJECTED
from rescore.transforms.settings import StepSettings


def test_read_experiences_keys_valid_rows_by_bucket_and_rejects_bad_ones(tmp_path):
    plan = plan_input([write_experience(tmp_path)], shard_rows=4)
    assert len(plan.units) == 3  # row groups of 4, 4 and 1 rows

    def light_rows(buckets):
        rows = []
        for bucket, light in buckets:
            assert (bucket_of(light, 8) == bucket).all()
            rows += zip(light["batch"].to_pylist(), light["task"].to_pylist(), light["run"].to_pylist(),
                        light["reward"].to_pylist(), light["unit"].to_pylist(), light["row"].to_pylist())
        return sorted(rows)

    def rejected(items):
        return [(unit, rec["row"].to_pylist(), rec["status"].to_pylist(), rec["reason"].to_pylist()) for unit, rec in items]

    valid = [(b, t, r, reward, i // 4, i % 4) for i, (b, t, r, reward) in enumerate(ROWS) if reward is not None]
    with pipeline() as p:
        read = p | ReadExperiences(plan, StepSettings(buckets=8), needs=())
        assert_that(read.light | "LightRows" >> gathered(light_rows), equal_to([valid]), label="CheckLight")
        assert_that(
            read.rejected | "Rejected" >> gathered(rejected),
            equal_to([[(2, [0], [REJECTED], ["null_value: reward is null"])]]),
            label="CheckRejected",
        )



def test_units_are_kept_for_the_write_step_only_when_asked(tmp_path):
    """keep_units (the in-process runner) offers each decoded unit to the run's store (the one
    handle the step is given, transforms/unit_store.py); without it (distributed runners, where
    the write of a unit runs elsewhere) nothing is kept, so no worker holds tables nobody takes."""
    from rescore.transforms.unit_store import UnitStoreHandle

    plan = plan_input([write_experience(tmp_path)], shard_rows=4)
    for keep, offered in ((False, 0), (True, len(plan.units))):
        handle = UnitStoreHandle(cache_mb=1)
        with pipeline() as p:
            p | ReadExperiences(plan, StepSettings(buckets=8), needs=(), keep_units=keep, unit_store=handle)
        cache = handle.store.cache  # the step's copy of the handle reached the launcher's store
        assert cache.stats.offered == offered
        assert (cache.held > 0) is keep
        handle.close()
        assert cache.held == 0


def test_the_command_keeps_units_only_where_one_process_runs_every_step():
    from apache_beam.options.pipeline_options import PipelineOptions

    from rescore.pipelines.job import _one_process

    assert _one_process(PipelineOptions([]))
    assert _one_process(PipelineOptions(["--direct_running_mode=multi_threading"]))
    assert not _one_process(PipelineOptions(["--direct_running_mode=multi_processing"]))
    assert not _one_process(PipelineOptions(["--runner=DataflowRunner"]))
