"""Exact zero spread through the whole job: all-equal groups (rewards whose naive float sums are
not exact, tests/strategies/test_zero_spread.py) score exactly 0 under every advantage, and every
filter and duplication drops them; the numbers equal the slow reference's."""

import json
import math
import os

import pyarrow.compute as pc
import pytest
import reference
from data import SCHEMA_MULTI_STEP, by_id, read_output, write_parquet
from test_zero_spread import FLAT


def _rows():
    """Batch 3: all-equal groups of 3 and 6 (0.1, 0.2, 0.7) and one informative group;
    batch 4: every reward 0.7 (groups of 1, 3, 6); batch 5: only all-equal groups (0.1 x 3,
    0.2 x 6, 0.7 x 3), so even REINFORCE++'s batch whitening sees equal values."""
    rows = []
    task = 0
    for r, n in FLAT + [(None, 3)]:
        for run in range(n):
            reward = [0.1, 0.2, 0.7][run] if r is None else r
            rows.append({"batch": 3, "task": task, "run": run, "step": 0, "reward": reward,
                         "logprobs": [-0.1 * (run + 1)] * 2, "action_mask": [1, 1], "expert": False})
        task += 1
    for n in (1, 3, 6):
        for run in range(n):
            rows.append({"batch": 4, "task": task, "run": run, "step": 0, "reward": 0.7,
                         "logprobs": [-0.3] * 2, "action_mask": [1, 1], "expert": False})
        task += 1
    for r, n in ((0.1, 3), (0.2, 6), (0.7, 3)):
        for run in range(n):
            rows.append({"batch": 5, "task": task, "run": run, "step": 0, "reward": r,
                         "logprobs": [-0.3] * 2, "action_mask": [1, 1], "expert": False})
        task += 1
    return rows


INFORMATIVE_TASK = len(FLAT)


SINGLETON_TASK = len(FLAT) + 1  # batch 4's group of one keeps its reward (mean 0, std 1)


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, params",
    [
        ("grpo", {"epsilon": 0.0}),
        ("grpo", {"std_cal_level": "batch", "epsilon": 0.0}),
        ("opmd", {"opmd_baseline": "logavgexp", "tau": 0.05}),
        ("rloo", {}),
        ("reinforce_plus_plus_baseline", {}),
        ("step_wise_grpo", {"epsilon": 0.0}),
    ],
)
def test_end_to_end_all_equal_groups_score_zero(tmp_path, rescore, strategy, params):
    rows = _rows()
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=5, schema=SCHEMA_MULTI_STEP)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in params.items()]
    doc, out = rescore(glob, "--strategy", strategy, *sets, "--buckets", "3")
    scored = by_id(read_output(out, "scored"))
    assert len(scored) == len(rows)
    expected = reference.rescore_plan(rows, [strategy], params)
    for rid, row in scored.items():
        assert math.isfinite(row["score"])
        # REINFORCE++ whitens over the batch: only an all-flat batch scores 0 everywhere.
        if rid[1] not in (INFORMATIVE_TASK, SINGLETON_TASK) and (strategy != "reinforce_plus_plus_baseline" or rid[0] == 5):
            assert row["score"] == 0.0 and row["advantages"] == [0.0, 0.0], (rid, row["score"])
        assert row["score"] == pytest.approx(expected["scored"][rid][0], rel=1e-6, abs=1e-12)
    for b in doc["batches"]:
        if b["batch"] == 4 and strategy != "reinforce_plus_plus_baseline":
            assert b["group_advantages/reward_std/mean"] == pytest.approx((1 + 0 + 0) / 3)  # the singleton's std is 1


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy, params",
    [
        ("reward_variance", {}),
        ("grpo", {"std_threshold": 0.0}),
        ("reward_variance,grpo,duplicate_informative", {"std_cal_level": "batch", "epsilon": 0.0}),
        ("grpo,duplicate_informative", {"std_threshold": 0.0}),
        ("duplicate_informative", {}),
    ],
)
def test_end_to_end_filters_and_duplication_drop_all_equal_groups(tmp_path, rescore, strategy, params):
    rows = _rows()
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=5, schema=SCHEMA_MULTI_STEP)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in params.items()]
    doc, out = rescore(glob, "--strategy", strategy, *sets)
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    table = read_output(out, "scored")
    source = table["source_task"] if "source_task" in table.column_names else table["task"]
    assert set(source.to_pylist()) == {INFORMATIVE_TASK}
    originals = table.filter(pc.equal(table["copy_index"], 0)) if "copy_index" in table.column_names else table
    assert sorted(by_id(originals)) == [(3, INFORMATIVE_TASK, r, 0) for r in range(3)]
    t = doc["totals"]
    assert t["rows_filtered"] == len(rows) - 3
    if "duplicate" in strategy:
        # batch 3 had 30 rows before filtering: 3 kept + 9 copies of the 3-row group
        assert t["rows_duplicated"] == 27 and table.num_rows == 30
        assert set(table["copy_index"].to_pylist()) == set(range(10))
    assert t["rows_read"] == t["rows_written_original"] + t["rows_filtered"] + t["rows_rejected"]
    expected = reference.rescore_plan(rows, strategy.split(","), params)
    assert set(expected["scored"]) == set(by_id(originals))
