"""The whole job on the in-process runner, compared with the slow reference."""

import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import reference
from data import by_id, random_rows, read_output, write_parquet

CASES = [
    ("grpo", {}),
    ("grpo", {"epsilon": 1e-3}),
    ("grpo", {"std_cal_level": "batch"}),
    ("grpo", {"std_threshold": 0.0}),
    ("grpo", {"std_threshold": 0.5, "std_cal_level": "batch"}),
    ("grpo", {"rank_penalty": 0.3}),
    ("correct_bias", {}),
    ("correct_bias", {"rank_penalty": 0.2, "epsilon": 1e-7}),
]


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)


def _compare(rows, out_dir, strategy, params):
    expected = reference.rescore(rows, strategy, params)
    scored = by_id(read_output(out_dir, "scored"))
    rejected = by_id(read_output(out_dir, "rejected"))
    assert set(scored) == set(expected["scored"])
    assert set(rejected) == set(expected["rejected"])
    for rid, (score, advantages) in expected["scored"].items():
        row = scored[rid]
        assert _close(row["score"], score), (rid, row["score"], score)
        assert len(row["advantages"]) == len(advantages)
        assert all(_close(a, b) for a, b in zip(row["advantages"], advantages)), rid
        assert row["returns"] == row["advantages"]
    for rid, category in expected["rejected"].items():
        assert rejected[rid]["reject_reason"].startswith(category), (rid, rejected[rid]["reject_reason"])
    return expected


@pytest.mark.slow
@pytest.mark.parametrize("strategy, params", CASES)
@pytest.mark.parametrize("string_tasks", [False, True])
def test_matches_reference(tmp_path, rescore, strategy, params, string_tasks):
    rows = random_rows(seed=len(params) + 11 * string_tasks, string_tasks=string_tasks)
    glob = write_parquet(rows, str(tmp_path / "in"), files=3, row_group_size=5)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in params.items()]
    doc, out = rescore(glob, "--strategy", strategy, *sets, "--buckets", "5", "--shard-rows", "8")
    expected = _compare(rows, out, strategy, params)
    t = doc["totals"]
    assert t["rows_read"] == len(rows)
    assert t["rows_written"] == len(expected["scored"])
    assert t["rows_filtered"] == len(expected["filtered"])
    assert t["rows_read"] == t["rows_written_original"] + t["rows_filtered"] + t["rows_rejected"]


@pytest.mark.slow
def test_passthrough_columns_are_unchanged(tmp_path, rescore):
    rows = random_rows(seed=3)
    glob = write_parquet(rows, str(tmp_path / "in"))
    _, out = rescore(glob, "--strategy", "grpo")
    scored = by_id(read_output(out))
    for row in rows:
        got = scored[(row["batch"], row["task"], row["run"], row["step"])]
        for key, value in row.items():
            if key == "logprobs":
                assert got[key] == pytest.approx(value)
            else:
                assert got[key] == value, key
    schema = pq.read_schema(os.path.join(out, sorted(os.listdir(out))[-1]))
    assert schema.names[-3:] == ["advantages", "returns", "score"]
    assert schema.field("advantages").type == pa.list_(pa.float32())


def test_spec_vectors_through_the_pipeline(tmp_path, rescore):
    # Trinity-RFT's vectors: 3 tasks x rewards 0..4, plus a batch of singleton groups.
    rows = [
        {"batch": 0, "task": t, "run": r, "reward": float(r), "logprobs": [0.0, 0.0], "action_mask": [1, 0]}
        for t in range(3)
        for r in range(5)
    ] + [{"batch": 1, "task": t, "run": 0, "reward": float(t), "logprobs": [0.0], "action_mask": [1]} for t in range(3)]
    schema = pa.schema(
        [("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64()), ("reward", pa.float32()),
         ("logprobs", pa.list_(pa.float32())), ("action_mask", pa.list_(pa.int8()))]
    )
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=4, schema=schema)
    doc, out = rescore(glob, "--strategy", "grpo")
    b0, b1 = doc["batches"]
    assert b0["group_advantages/reward_mean/mean"] == 2.0
    assert b0["group_advantages/reward_std/mean"] == pytest.approx(math.sqrt(2.5), rel=1e-7)
    assert b1["group_advantages/reward_mean/mean"] == 0.0 and b1["group_advantages/reward_std/mean"] == 1.0
    scored = by_id(read_output(out))
    assert scored[(0, 1, 4, 0)]["advantages"] == pytest.approx([2 / (math.sqrt(2.5) + 1e-6), 0.0])
    assert scored[(1, 2, 0, 0)]["score"] == pytest.approx(2 / (1 + 1e-6))


@pytest.mark.slow
def test_bad_rows_are_rejected_with_reasons_and_counted(tmp_path, rescore):
    rows = random_rows(seed=5)
    rows[0]["reward"] = float("nan")
    rows[1]["logprobs"] = rows[1]["logprobs"] + [-0.1]
    rows[2]["action_mask"] = None
    dup = dict(rows[3])
    rows.append(dup)
    glob = write_parquet(rows, str(tmp_path / "in"))
    doc, out = rescore(glob, "--strategy", "grpo")
    expected = _compare(rows, out, "grpo", {})
    rejected = read_output(out, "rejected")
    assert rejected.num_rows == 5  # NaN, length, null, and both copies of the duplicate id
    assert set(rejected.column_names) >= {"note", "tokens", "reject_reason"}
    t = doc["totals"]
    assert t["rows_rejected"] == 5
    assert t["reject_reasons"] == {"bad_reward": 1, "duplicate_id": 2, "length_mismatch": 1, "null_value": 1}
    assert t["rows_read"] == len(rows) == t["rows_written_original"] + t["rows_filtered"] + t["rows_rejected"]
    assert len(expected["rejected"]) == 4  # the reference counts ids; the duplicate id is one key


@pytest.mark.slow
def test_output_does_not_depend_on_file_layout_or_order(tmp_path, rescore):
    rows = random_rows(seed=9)
    a = write_parquet(rows, str(tmp_path / "a"), files=1, row_group_size=1000)
    b = write_parquet(list(reversed(rows)), str(tmp_path / "b"), files=4, row_group_size=3)
    _, out_a = rescore(a, "--strategy", "grpo", "--set", "std_cal_level=batch", output=str(tmp_path / "oa"))
    _, out_b = rescore(b, "--strategy", "grpo", "--set", "std_cal_level=batch", "--buckets", "3", output=str(tmp_path / "ob"))
    keys = [("batch", "ascending"), ("task", "ascending"), ("run", "ascending")]
    ta, tb = read_output(out_a).sort_by(keys), read_output(out_b).sort_by(keys)
    assert ta.equals(tb)


@pytest.mark.slow
def test_rerun_is_identical_and_refuses_a_finished_output(tmp_path, rescore):
    from rescore.transforms.strategies import ConfigError

    glob = write_parquet(random_rows(seed=4), str(tmp_path / "in"))
    doc1, out = rescore(glob, "--strategy", "correct_bias")
    first = {p: open(os.path.join(out, p), "rb").read() for p in os.listdir(out)}
    with pytest.raises(ConfigError, match="already holds a finished run"):
        rescore(glob, "--strategy", "correct_bias")
    doc2, _ = rescore(glob, "--strategy", "correct_bias", "--overwrite")
    second = {p: open(os.path.join(out, p), "rb").read() for p in os.listdir(out)}
    assert first == second and doc1 == doc2


@pytest.mark.slow
def test_output_layout_and_success_last(tmp_path, rescore):
    glob = write_parquet(random_rows(seed=6), str(tmp_path / "in"), files=2, row_group_size=4)
    _, out = rescore(glob, "--strategy", "grpo", "--shard-rows", "10")
    names = sorted(os.listdir(out))
    assert "_SUCCESS" in names and "metrics.json" in names and "_staging" not in names
    scored = [n for n in names if n.startswith("scored-")]
    assert len(scored) > 2 and all(n.endswith(".parquet") for n in scored)
    success = os.stat(os.path.join(out, "_SUCCESS")).st_mtime_ns
    assert all(os.stat(os.path.join(out, n)).st_mtime_ns <= success for n in names)


@pytest.mark.slow
def test_schemas_that_differ_across_files_are_unified(tmp_path, rescore):
    rows = random_rows(seed=8)
    half = len(rows) // 2
    d = tmp_path / "in"
    d.mkdir()
    narrow = pa.Table.from_pylist(rows[:half]).drop_columns(["note"])
    narrow = narrow.set_column(narrow.schema.get_field_index("batch"), "batch", narrow["batch"].cast(pa.int32()))
    pq.write_table(narrow, d / "a.parquet", row_group_size=5)
    pq.write_table(pa.Table.from_pylist(rows[half:]), d / "b.parquet", row_group_size=5)
    _, out = rescore(str(d), "--strategy", "grpo")
    t = read_output(out)
    assert t.num_rows == len(rows) and t.schema.field("batch").type == pa.int64()
    assert t["note"].null_count == half
    _compare(rows, out, "grpo", {})


@pytest.mark.slow
def test_rows_without_token_columns_get_empty_advantages(tmp_path, rescore):
    rows = [{"batch": 0, "task": 0, "run": r, "reward": float(r)} for r in range(3)]
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), d / "x.parquet")
    _, out = rescore(str(d), "--strategy", "grpo")
    t = read_output(out).sort_by("run")
    assert t["advantages"].to_pylist() == [[], [], []]
    assert np.allclose(t["score"].to_numpy(), [-1, 0, 1], atol=1e-5)


@pytest.mark.slow
def test_multi_process_workers_give_the_same_rows(tmp_path, rescore):
    glob = write_parquet(random_rows(seed=12), str(tmp_path / "in"), files=3, row_group_size=4)
    _, one = rescore(glob, "--strategy", "grpo", "--shard-rows", "6", output=str(tmp_path / "one"))
    _, two = rescore(glob, "--strategy", "grpo", "--shard-rows", "6", "--direct_num_workers=2",
                     "--direct_running_mode=multi_processing", output=str(tmp_path / "two"))
    keys = [("batch", "ascending"), ("task", "ascending"), ("run", "ascending")]
    assert read_output(one).sort_by(keys).equals(read_output(two).sort_by(keys))


@pytest.mark.slow
def test_empty_file_is_counted_and_the_rest_is_scored(tmp_path, rescore):
    rows = random_rows(seed=13)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2)
    pq.write_table(pa.Table.from_pylist([], schema=pa.Table.from_pylist(rows).schema), tmp_path / "in" / "empty.parquet")
    doc, out = rescore(glob, "--strategy", "grpo")
    assert doc["input_files"] == 3 and doc["totals"]["rows_read"] == len(rows)
    _compare(rows, out, "grpo", {})
