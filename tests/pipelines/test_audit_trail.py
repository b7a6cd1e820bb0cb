"""--keep-filtered and --audit-columns: the rows a filter drops, with the reason, and the numbers
each score came from, checked against values computed here independently (numpy)."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import RUNNER

SCHEMA = pa.schema(
    [("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64()), ("reward", pa.float64()),
     ("action_mask", pa.list_(pa.int8()))]
)
# batch 0: task 1 dead (var 0), task 2 one row, task 3 informative (std 0.5 at ddof=1 is 0.5773...)
# batch 1: task 1 informative, task 2 rewards 1, 1, 1.5 (tiny spread, kept at threshold 0)
GROUPS = {
    (0, 1): [1.0, 1.0, 1.0],
    (0, 2): [0.5],
    (0, 3): [0.0, 1.0, 0.5, 1.0],
    (1, 1): [0.0, 0.0, 1.0],
    (1, 2): [1.0, 1.0, 1.5],
}


def _input(tmp_path) -> str:
    rows = []
    for (b, t), rewards in GROUPS.items():
        for r, reward in enumerate(rewards):
            rows.append({"batch": b, "task": t, "run": r, "reward": reward, "action_mask": [0, 1, 1]})
    rows.reverse()  # input order must not matter
    path = tmp_path / "in"
    path.mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), str(path / "part.parquet"))
    return str(path / "*.parquet")


def _read(out: str, kind: str) -> pa.Table:
    files = sorted(glob.glob(os.path.join(out, f"{kind}-*.parquet")))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else None


def _run(tmp_path, name, *args):
    from rescore.pipelines.cli import run

    out = str(tmp_path / name)
    doc = run(["--input", _input(tmp_path) if not (tmp_path / "in").exists() else str(tmp_path / "in" / "*.parquet"),
               "--output", out, RUNNER, "--quiet", *args])
    return doc, out


def test_keep_filtered_writes_every_dropped_row_with_its_reason(tmp_path):
    doc, out = _run(tmp_path, "out", "--strategy", "reward_variance,grpo", "--keep-filtered")
    filtered = _read(out, "filtered").sort_by([("batch", "ascending"), ("task", "ascending"), ("run", "ascending")])
    got = list(zip(filtered["batch"].to_pylist(), filtered["task"].to_pylist(), filtered["filter_reason"].to_pylist()))
    assert got == [
        (0, 1, "reward_variance: var 0 <= 0"),
        (0, 1, "reward_variance: var 0 <= 0"),
        (0, 1, "reward_variance: var 0 <= 0"),
        (0, 2, "reward_variance: group of 1 row < 2 rows"),
    ]
    # the input columns come through unchanged; no score columns on a dropped row
    assert filtered.schema.names == ["batch", "task", "run", "reward", "action_mask", "filter_reason"]
    assert filtered["action_mask"].to_pylist() == [[0, 1, 1]] * 4
    # counted as before: every row is written, filtered or rejected exactly once
    t = doc["totals"]
    scored = _read(out, "scored")
    assert t["rows_filtered"] == filtered.num_rows == 4
    assert scored.num_rows + filtered.num_rows == t["rows_read"] == sum(len(v) for v in GROUPS.values())
    assert doc["keep_filtered"] is True and json.load(open(os.path.join(out, "metrics.json")))["keep_filtered"] is True
    assert os.path.exists(os.path.join(out, "_SUCCESS"))


@pytest.mark.slow
def test_filter_reasons_name_the_stage_statistic_and_threshold(tmp_path):
    _, out = _run(tmp_path, "thr", "--strategy", "grpo", "--set", "std_threshold=0.3", "--keep-filtered")
    filtered = _read(out, "filtered")
    reasons = dict(zip(zip(filtered["batch"].to_pylist(), filtered["task"].to_pylist()), filtered["filter_reason"].to_pylist()))
    std = np.std(GROUPS[(1, 2)], ddof=1)  # 0.2887 <= 0.3
    assert reasons == {
        (0, 1): "grpo: std 0 <= 0.3",
        (0, 2): "grpo: group of one row (std_threshold drops it)",
        (1, 2): f"grpo: std {std:.6g} <= 0.3",
    }


@pytest.mark.slow
def test_without_keep_filtered_no_filtered_files_and_same_scores(tmp_path):
    _, plain = _run(tmp_path, "plain", "--strategy", "reward_variance,grpo")
    _, audited = _run(tmp_path, "audited", "--strategy", "reward_variance,grpo", "--keep-filtered", "--audit-columns")
    assert not glob.glob(os.path.join(plain, "filtered-*"))
    a, b = _read(plain, "scored"), _read(audited, "scored")
    assert b.select(a.schema.names).equals(a)  # the audit adds columns and changes nothing else


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["grpo", "rloo", "opmd"])
def test_audit_columns_hold_the_numbers_the_score_came_from(tmp_path, strategy):
    _, out = _run(tmp_path, strategy, "--strategy", strategy, "--audit-columns")
    t = _read(out, "scored")
    assert t.schema.names[-5:] == ["group_size", "group_reward_mean", "group_reward_std", "batch_reward_std", "baseline"]
    for row in t.to_pylist():
        rewards = np.array(GROUPS[(row["batch"], row["task"])])
        n = len(rewards)
        assert row["group_size"] == n
        mean = rewards.mean() if n > 1 else 0.0  # the spec: a group of one row has mean 0, std 1
        std = rewards.std(ddof=1) if n > 1 else 1.0
        assert row["group_reward_mean"] == pytest.approx(mean, abs=1e-12)
        assert row["group_reward_std"] == pytest.approx(std, abs=1e-12)
        assert row["batch_reward_std"] is None  # group-level std
        if strategy == "rloo":
            baseline = (rewards.sum() - row["reward"]) / (n - 1) if n > 1 else 0.0
            assert row["score"] == pytest.approx(row["reward"] - baseline, abs=1e-6)
        else:
            baseline = mean
        assert row["baseline"] == pytest.approx(baseline, abs=1e-12)
        if strategy == "grpo":
            assert row["score"] == pytest.approx((row["reward"] - baseline) / (std + 1e-6), abs=1e-5)
        if strategy == "opmd":
            assert row["score"] == pytest.approx(row["reward"] - baseline, abs=1e-6)


@pytest.mark.slow
def test_audit_batch_std_with_std_cal_level_batch(tmp_path):
    _, out = _run(tmp_path, "batch", "--strategy", "grpo", "--set", "std_cal_level=batch", "--audit-columns")
    t = _read(out, "scored")
    for row in t.to_pylist():
        batch_rewards = np.concatenate([v for (b, _), v in GROUPS.items() if b == row["batch"]])
        assert row["batch_reward_std"] == pytest.approx(batch_rewards.std(ddof=1), abs=1e-12)
        assert row["score"] == pytest.approx((row["reward"] - row["baseline"]) / (row["batch_reward_std"] + 1e-6), abs=1e-5)


@pytest.mark.slow
def test_raft_reasons_per_row(tmp_path):
    _, out = _run(tmp_path, "raft", "--strategy", "raft", "--keep-filtered", "--audit-columns")
    filtered = _read(out, "filtered").sort_by([("batch", "ascending"), ("task", "ascending"), ("run", "ascending")])
    got = list(zip(filtered["batch"].to_pylist(), filtered["task"].to_pylist(), filtered["reward"].to_pylist(),
                   filtered["filter_reason"].to_pylist()))
    assert got == [
        (0, 3, 0.0, "raft: reward 0 <= 0"),
        (0, 3, 0.5, "raft: reward 0.5 < the group's top 1"),
        (1, 1, 0.0, "raft: reward 0 <= 0"),
        (1, 1, 0.0, "raft: reward 0 <= 0"),
        (1, 2, 1.0, "raft: reward 1 < the group's top 1.5"),
        (1, 2, 1.0, "raft: reward 1 < the group's top 1.5"),
    ]
    scored = _read(out, "scored")
    assert scored["baseline"].null_count == scored.num_rows  # RAFT subtracts no baseline


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["rec", "gpg", "opo", "reinforce", "grpo_passk"])
def test_audit_baseline_of_the_new_estimators(tmp_path, strategy):
    _, out = _run(tmp_path, strategy, "--strategy", strategy, "--audit-columns")
    t = _read(out, "scored")
    for row in t.to_pylist():
        rewards = np.array(GROUPS[(row["batch"], row["task"])])
        n = len(rewards)
        mean = rewards.mean() if n > 1 else 0.0
        if strategy in ("rec", "gpg", "opo"):  # every row has 2 action tokens: opo's weighted mean is the mean
            assert row["baseline"] == pytest.approx(mean, abs=1e-12)
        elif strategy == "reinforce":
            assert row["baseline"] == 0.0
        else:  # grpo_passk: the first top row scores r_max - r_second, the others 0 (no baseline)
            top = int(np.argmax(rewards))
            if n > 1 and row["run"] == top:  # rows are in run order
                assert row["baseline"] == pytest.approx(np.max(np.delete(rewards, top)), abs=1e-12)
            else:
                assert row["baseline"] is None
        if strategy == "rec":
            assert row["score"] == pytest.approx(row["reward"] - row["baseline"], abs=1e-6)
            assert row["group_reward_std"] == pytest.approx(rewards.std(ddof=1) if n > 1 else 1.0, abs=1e-12)
    if strategy == "grpo_passk":
        assert t["baseline"].null_count < t.num_rows


@pytest.mark.slow
def test_filter_reasons_of_filter_groups_and_dynamic_filtering(tmp_path):
    _, out = _run(tmp_path, "fg", "--strategy", "filter_groups,grpo", "--set", "metric=reward", "--keep-filtered")
    f = _read(out, "filtered")
    reasons = set(zip(f["batch"].to_pylist(), f["task"].to_pylist(), f["filter_reason"].to_pylist()))
    assert reasons == {(0, 1, "filter_groups: reward std 0 <= 0")}
    _, out = _run(tmp_path, "df", "--strategy", "dynamic_filtering,grpo", "--keep-filtered")
    f = _read(out, "filtered")
    reasons = set(zip(f["batch"].to_pylist(), f["task"].to_pylist(), f["filter_reason"].to_pylist()))
    high = np.mean(GROUPS[(1, 2)])
    assert reasons == {(0, 1, "dynamic_filtering: reward mean 1 >= 1"), (1, 2, f"dynamic_filtering: reward mean {high:.6g} >= 1")}


@pytest.mark.slow
def test_filter_reason_of_mask_response_truncated_with_drop(tmp_path):
    rows = [{"batch": 0, "task": 1, "run": r, "reward": float(r), "action_mask": [1],
             "truncate_status": "response_truncated" if r == 1 else "none", "reward_baselines": 0.25 * r} for r in range(3)]
    schema = SCHEMA.append(pa.field("truncate_status", pa.string())).append(pa.field("reward_baselines", pa.float64()))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(tmp_path / "in" / "part.parquet"))
    _, out = _run(tmp_path, "mask", "--strategy", "mask_response_truncated,remax", "--set", "drop=true", "--keep-filtered",
                  "--audit-columns")
    f = _read(out, "filtered")
    assert f["run"].to_pylist() == [1]
    assert f["filter_reason"].to_pylist() == ["mask_response_truncated: truncate_status is response_truncated (drop=true)"]
    scored = _read(out, "scored").sort_by("run")
    assert scored["baseline"].to_pylist() == [0.0, 0.5]  # remax: the reward_baselines column
