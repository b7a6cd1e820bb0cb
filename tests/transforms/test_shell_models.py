"""ComputeModelColumns on a TestPipeline (with a --reward-fn, so no model weights): every read
unit is emitted once its side file is written, and reading the unit joins the computed column."""

import pyarrow as pa
from apache_beam.testing.util import assert_that, equal_to
from shell_data import ROWS, pipeline, write_experience

from rescore.transforms.rows.model_columns import ModelOptions
from rescore.transforms.models import ComputeModelColumns, plan_with_models
from rescore.transforms.read import plan_input, read_unit
from rescore.transforms.settings import StepSettings


def test_compute_model_columns_writes_a_side_file_per_unit(tmp_path):
    options = ModelOptions(reward_fn="shell_data:response_length_reward")
    staging = str(tmp_path / "out" / "_staging")
    plan, context = plan_with_models(plan_input([write_experience(tmp_path / "in")], shard_rows=4), options, staging)
    assert len(plan.units) == 3 and all(u.model_file for u in plan.units)
    with pipeline() as p:
        units = p | ComputeModelColumns(plan, options, staging, StepSettings(device="cpu"), context=context)
        assert_that(units, equal_to([0, 1, 2]))
    table = pa.concat_tables([read_unit(u) for u in plan.units])
    # every response has 4 tokens; a row that fails validation (the null reward) goes to no model
    assert table["reward"].to_pylist() == [4.0 if r is not None else None for *_, r in ROWS]
    assert table["reward_original"].to_pylist() == [r for *_, r in ROWS]
