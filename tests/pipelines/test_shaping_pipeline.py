"""Reward shaping through the whole job: the written `reward` is the shaped one, the input's is
`reward_original`, filters and advantages see only the shaped rewards (scores equal GRPO's on the
shaped rewards, computed by the reference), filtered rows carry the shaped reward too."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
import reference
from data import SCHEMA_INT_TASK, by_id, random_rows, read_output, write_parquet

SCHEMA = SCHEMA_INT_TASK.append(pa.field("quality", pa.float64()))
PARAMS = {
    "max_resp_len": 8, "overlong_buffer_len": 4, "penalty_factor": 0.5,
    "stats_key": "quality", "op_type": "sub", "weight": 0.5, "scale": 2.0, "bias": -0.25, "clip_min": -1.0, "clip_max": 3.0,
}


def _shaped(row: dict) -> float:
    """By hand, in the chain's order: DAPO's penalty on the response length, then
    reward_shaping (r - 0.5 * quality where quality is present, then clip(2 r - 0.25, -1, 3))."""
    r, length = float(row["reward"]), len(row["action_mask"])
    if length > 8:
        r -= 0.5
    elif length > 4:
        r += (4 - length) / 4 * 0.5
    if row["quality"] is not None:
        r -= 0.5 * row["quality"]
    return min(max(2 * r - 0.25, -1.0), 3.0)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3, 11])
def test_shaping_then_filter_then_grpo(rescore, tmp_path, seed):
    rows = random_rows(seed, batches=2, max_tasks=6, max_runs=5)
    rng = random.Random(seed)
    for r in rows:
        r["quality"] = None if rng.random() < 0.3 else rng.choice([0.0, 1.0, 0.5])
        if rng.random() < 0.4:  # some responses past the buffer and past the maximum
            extra = rng.randint(1, 6)
            r["logprobs"] += [-0.1] * extra
            r["action_mask"] += [True] * extra
            r["tokens"] += [5] * extra
    glob = write_parquet(rows, str(tmp_path / "in"), schema=SCHEMA)
    sets = [x for k, v in PARAMS.items() for x in ("--set", f"{k}={v}")]
    _, out = rescore(glob, "--strategy", "dapo_overlong_penalty,reward_shaping,reward_variance,grpo", "--keep-filtered", *sets)

    shaped = [{**r, "reward": _shaped(r)} for r in rows]
    expected = reference.rescore_plan(shaped, ["reward_variance", "grpo"], {})
    scored = by_id(read_output(out, "scored"))
    filtered = by_id(read_output(out, "filtered"))
    assert set(scored) == set(expected["scored"]) and set(filtered) == expected["filtered"]
    assert expected["filtered"] and any(len(r["action_mask"]) > 8 for r in rows)
    for r in rows:
        key = (r["batch"], r["task"], r["run"], 0)
        got = scored.get(key) or filtered[key]
        assert got["reward"] == pytest.approx(_shaped(r), abs=1e-12)
        assert got["reward_original"] == r["reward"]
        if key in scored:
            assert got["score"] == pytest.approx(expected["scored"][key][0], abs=1e-6)


def test_shaping_alone_writes_the_shaped_reward_of_an_int_reward(rescore, tmp_path):
    schema = SCHEMA_INT_TASK.set(SCHEMA_INT_TASK.get_field_index("reward"), pa.field("reward", pa.int64()))
    rows = [{"batch": 0, "task": 1, "run": i, "step": 0, "reward": i, "tokens": [1, 2], "prompt_length": 1,
             "logprobs": [-0.5], "action_mask": [True], "note": None} for i in range(3)]
    glob = write_parquet(rows, str(tmp_path / "in"), files=1, schema=schema)
    doc, out = rescore(glob, "--strategy", "reward_shaping", "--set", "scale=0.5")
    got = read_output(out)
    assert got.schema.field("reward").type == pa.float64() and got.schema.field("reward_original").type == pa.int64()
    assert sorted(zip(got["reward_original"].to_pylist(), got["reward"].to_pylist())) == [(0, 0.0), (1, 0.5), (2, 1.0)]
    assert got["score"].null_count == 3  # no advantage stage


@pytest.mark.slow
def test_rejected_rows_keep_their_reward_and_audit_columns_explain_the_shaped_one(rescore, tmp_path):
    rows = [{"batch": 0, "task": 1, "run": i, "step": 0, "reward": r, "tokens": [1, 2], "prompt_length": 1,
             "logprobs": [-0.5], "action_mask": [True], "note": None} for i, r in enumerate([0.0, 1.0, None, 3.0])]
    glob = write_parquet(rows, str(tmp_path / "in"), files=1, schema=SCHEMA_INT_TASK)
    doc, out = rescore(glob, "--strategy", "reward_shaping,grpo", "--set", "clip_max=1", "--audit-columns")
    scored, rejected = read_output(out), read_output(out, "rejected")
    assert sorted(zip(scored["reward_original"].to_pylist(), scored["reward"].to_pylist())) == [(0.0, 0.0), (1.0, 1.0), (3.0, 1.0)]
    assert scored["group_reward_mean"].to_pylist() == [pytest.approx(2 / 3)] * 3  # the mean of the shaped rewards
    assert rejected.num_rows == 1 and rejected["reward"].to_pylist() == [None] and rejected["reward_original"].to_pylist() == [None]
    assert doc["totals"]["rows_rejected"] == 1
