"""Hostile numbers through the whole job (docs/reliability.md, issue 40's reproductions): log-probs
that are no log-probabilities reject their row in every stage that reads them; log-ratios of 800
and infinite reference log-probs never fail the publish; metrics.json is strict JSON; two task ids
or states with one CRC-32 are two; task-stats on rewards whose variance passes the float range;
a verifier's 10**400 without a worker process; a task id that is not UTF-8."""

from __future__ import annotations

import glob
import json
import math
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import RUNNER

NAN, INF = math.nan, math.inf
LP_SCHEMA = pa.schema([
    ("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64()), ("step", pa.int64()), ("reward", pa.float64()),
    ("tokens", pa.list_(pa.int64())), ("prompt_length", pa.int64()), ("action_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())), ("logprobs_original", pa.list_(pa.float32())), ("ref_logprobs", pa.list_(pa.float32())),
    ("teacher_logprobs", pa.list_(pa.float32())), ("entropy", pa.list_(pa.float32())), ("sum_pi_squared", pa.list_(pa.float32())),
])
GOOD = [-0.1, -0.2]
BAD = {"nan": [NAN, -0.2], "+inf": [INF, -0.2], "-inf": [-INF, -0.2], "positive": [0.5, -0.2]}


def _strict(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.loads(f.read(), parse_constant=lambda c: pytest.fail(f"{path} holds {c}"))


def _rejected(out: str) -> dict:
    """{(batch, task, run): reject_reason} of a run's rejected rows."""
    got = {}
    for f in glob.glob(os.path.join(out, "rejected-*.parquet")):
        for r in pq.read_table(f).to_pylist():
            got[(r["batch"], r["task"], r["run"])] = r["reject_reason"]
    return got


def _logprob_rows(column: str) -> list[dict]:
    """Task 0: clean. Task k (1..4): `column` holds BAD's k-th kind on both rows."""
    rows = []
    for t, bad in enumerate([None, *BAD.values()]):
        for run in range(2):
            row = {"batch": 0, "task": t, "run": run, "step": 0, "reward": float(run), "tokens": [1, 2, 3, 4], "prompt_length": 2,
                   "action_mask": [1, 1], **{c: list(GOOD) for c in LP_SCHEMA.names[8:]}}
            row["entropy"], row["sum_pi_squared"] = [0.7, 0.4], [0.5, 0.6]
            if bad is not None:
                row[column] = bad
            rows.append(row)
    return rows


@pytest.mark.parametrize("strategy, column", [
    ("decoupled_token_is,grpo", "logprobs"),
    ("decoupled_token_is,grpo", "logprobs_original"),
    ("kl_penalty,grpo", "ref_logprobs"),
    pytest.param("on_policy_distill", "teacher_logprobs", marks=pytest.mark.slow),
    pytest.param("optimal_token_baseline", "logprobs", marks=pytest.mark.slow),
    pytest.param("clipb", "logprobs", marks=pytest.mark.slow),
])
def test_logprobs_that_are_no_log_probabilities_reject_their_row(tmp_path, rescore, strategy, column):
    """Issue 40 defect 1: NaN weights, Infinity in metrics.json and all-positive log-probs
    scored silently, before; now every such row is rejected with its reason, in every stage
    that reads the column."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(_logprob_rows(column), schema=LP_SCHEMA), str(tmp_path / "in" / "part-0.parquet"))
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", strategy, "--max-reject-fraction", "1")
    assert doc["totals"]["rows_read"] == 10 and doc["totals"]["rows_written"] == 2
    assert doc["totals"]["reject_reasons"] == {"bad_logprobs": 8}
    reasons = _rejected(out)
    for t, kind in enumerate(BAD, start=1):
        want = f"bad_logprobs: {column} holds 0.5 > 0 (a log-probability is <= 0)" if kind == "positive" else f"bad_logprobs: {column} contain {kind.upper() if kind == 'nan' else kind}".replace("NAN", "NaN")
        assert reasons[(0, t, 0)] == reasons[(0, t, 1)] == want
    _strict(os.path.join(out, "metrics.json"))
    for f in glob.glob(os.path.join(out, "scored-*.parquet")):
        for column_name in ("advantages", "is_weights"):
            table = pq.read_table(f)
            if column_name in table.column_names:
                assert all(math.isfinite(v) for v in table[column_name].combine_chunks().flatten().to_pylist())


def _ratio_rows(ratio: float, ref=None) -> list[dict]:
    rows = []
    for t in range(3):
        for run in range(2):
            lp = [-0.1, -0.2]
            orig = [-0.1 - ratio, -0.2] if t == 1 and run == 0 else ([-0.1, -0.2 + ratio] if t == 2 and ratio < 0 else list(lp))
            rows.append({"batch": 0, "task": t, "run": run, "step": 0, "reward": float(run), "tokens": [1, 2, 3, 4], "prompt_length": 2,
                         "action_mask": [1, 1], "logprobs": lp, "logprobs_original": [min(v, 0.0) for v in orig],
                         "ref_logprobs": ref if ref is not None and t == 1 else [-0.3, -0.2], "teacher_logprobs": lp, "entropy": lp,
                         "sum_pi_squared": [0.5, 0.5]})
    return rows


@pytest.mark.parametrize("strategy", [
    "trl_token_truncate,grpo",
    pytest.param("decoupled_token_is,grpo", marks=pytest.mark.slow),
    pytest.param("trl_sequence_mask,grpo", marks=pytest.mark.slow),
    pytest.param("decoupled_seq_is,grpo", marks=pytest.mark.slow),
])
def test_log_ratios_of_800_never_fail_the_publish(tmp_path, rescore, strategy):
    """Issue 40 defect 5: `overflow in fsum` in Finalize/Publish, before."""
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(_ratio_rows(800.0) + [{**r, "batch": 1} for r in _ratio_rows(-800.0)], schema=LP_SCHEMA),
                   str(tmp_path / "in" / "part-0.parquet"))
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", strategy)
    published = _strict(os.path.join(out, "metrics.json"))
    assert published["totals"]["rows_read"] == 12 and os.path.exists(os.path.join(out, "_SUCCESS"))
    correction = published["totals"]["rollout_correction"]
    assert all(v is None or math.isfinite(v) for v in correction.values())
    assert set(published.get("non_finite_metrics", [])) >= {"totals/rollout_correction/k3_kl"}  # e^800 does not fit


def test_infinite_reference_logprobs_are_rejected_rows_not_a_failed_publish(tmp_path, rescore):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(_ratio_rows(0.0, ref=[INF, -0.1]) + [{**r, "batch": 1} for r in _ratio_rows(0.0, ref=[-INF, -0.1])],
                                        schema=LP_SCHEMA), str(tmp_path / "in" / "part-0.parquet"))
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", "kl_penalty,grpo", "--max-reject-fraction", "1")
    assert doc["totals"]["reject_reasons"] == {"bad_logprobs": 4}
    assert set(_rejected(out).values()) == {"bad_logprobs: ref_logprobs contain +inf", "bad_logprobs: ref_logprobs contain -inf"}
    _strict(os.path.join(out, "metrics.json"))


def test_two_tasks_with_one_crc32_are_two_tasks_to_the_history_band(tmp_path, rescore):
    """Issue 40 defect 2: 'plumless', unseen, took 'buckeroo''s pass rate and was kept under
    unseen=drop; with both in the history the run died ("two tasks share a task hash")."""
    history = tmp_path / "history"
    history.mkdir()
    pq.write_table(pa.table({"task": ["buckeroo"], "pass_rate": [0.5]}), str(history / "task_stats.parquet"))
    rows = [{"batch": 0, "task": t, "run": r, "step": 0, "reward": float(r)} for t in ("buckeroo", "plumless") for r in range(2)]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "in" / "part-0.parquet"))
    band = ["--strategy", "pass_rate_band,grpo", "--set", f"pass_rate_band.task_stats={history}", "--set", "pass_rate_band.unseen=drop",
            "--keep-filtered"]
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), *band)
    assert doc["totals"]["rows_written"] == 2 and doc["totals"]["rows_filtered"] == 2
    filtered = pq.read_table(glob.glob(os.path.join(out, "filtered-*.parquet"))[0]).to_pylist()
    assert {r["task"] for r in filtered} == {"plumless"}
    assert {r["filter_reason"] for r in filtered} == {"pass_rate_band: task not in task_stats (unseen=drop)"}

    pq.write_table(pa.table({"task": ["buckeroo", "plumless"], "pass_rate": [0.5, 0.0]}), str(history / "task_stats.parquet"))
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), *band, output=str(tmp_path / "out2"))
    filtered = pq.read_table(glob.glob(os.path.join(out, "filtered-*.parquet"))[0]).to_pylist()
    assert {r["filter_reason"] for r in filtered} == {"pass_rate_band: task pass rate 0 <= 0"}


def test_two_states_with_one_crc32_are_two_anchor_groups(tmp_path, rescore):
    """GiGPO's env_state_hash: two runs in 'buckeroo' and 'plumless' share no anchor (each is
    seen once: step advantage 0), while two runs in 'buckeroo' do."""
    rows = []
    for run, state, reward in ((0, "buckeroo", 1.0), (1, "plumless", 0.0), (2, "buckeroo", 0.0)):
        for step in range(2):
            rows.append({"batch": 0, "task": 0, "run": run, "step": step, "reward": reward if step == 1 else 0.0,
                         "env_state_hash": state if step == 0 else f"end{run}"})
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "in" / "part-0.parquet"))
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", "gigpo", "--set", "step_reward_key=null", "--audit-columns")
    scored = {(r["run"], r["step"]): r for f in glob.glob(os.path.join(out, "scored-*.parquet")) for r in pq.read_table(f).to_pylist()}
    episode = {run: scored[(run, 1)]["score"] for run in range(3)}  # the last step: its own state, seen once
    assert scored[(1, 0)]["score"] == pytest.approx(episode[1])  # plumless: alone, no step advantage
    assert scored[(0, 0)]["score"] != pytest.approx(episode[0])  # buckeroo: shared by runs 0 and 2


def test_task_stats_std_whose_variance_passes_the_float_range(tmp_path, capsys):
    """Issue 40 defect 6: "integer division result too large for a float", before."""
    from rescore.pipelines.cli import main

    rows = [{"batch": 0, "task": 1, "run": r, "step": 0, "reward": x} for r, x in enumerate([1e200, -1e200, 0.0])]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "in" / "part-0.parquet"))
    assert main(["task-stats", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "stats"), RUNNER]) == 0, capsys.readouterr().err
    (task,) = pq.read_table(str(tmp_path / "stats" / "task_stats.parquet")).to_pylist()
    assert task["reward_mean"] == 0.0 and task["reward_std"] == 1e200


VERIFIER = "def huge(task):\n    return 10**400 if task == 1 else 1.0\n"


def test_a_verifier_returning_10_to_the_400_without_a_worker_rejects_its_row(tmp_path, rescore, monkeypatch):
    """Issue 40 defect 7: with --reward-fn-timeout 0 the run failed; the worker process rejected
    the row. One rule: the call's own (transforms/verifier.py call_reward_fn)."""
    (tmp_path / "huge_verifier.py").write_text(VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"batch": 0, "task": t, "run": r, "step": 0, "reward": 0.0, "tokens": [1, 2, 3], "prompt_length": 1} for t in range(2) for r in range(2)]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "in" / "part-0.parquet"))
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", "grpo", "--reward-fn", "huge_verifier:huge",
                       "--reward-fn-timeout", "0", "--max-reject-fraction", "1")
    assert doc["totals"]["rows_written"] == 2 and doc["totals"]["reject_reasons"] == {"model_reward": 2}
    assert set(_rejected(out).values()) == {"model_reward: reward_fn huge_verifier:huge returned a int that is not a float64 (OverflowError)"}


def test_a_task_that_is_not_utf8_is_a_rejected_row(tmp_path, rescore):
    """Issue 40 defect 8: exit 1 with a Beam step name in the middle, before."""
    tasks = pa.array([b"ok", b"ok", b"bad\xff", b"bad\xff"], pa.binary()).view(pa.string())
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"batch": [0] * 4, "task": tasks, "run": [0, 1, 0, 1], "step": [0] * 4, "reward": [0.0, 1.0, 0.0, 1.0]}),
                   str(tmp_path / "in" / "part-0.parquet"))
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", "grpo", "--max-reject-fraction", "1")
    assert doc["totals"]["rows_written"] == 2 and doc["totals"]["reject_reasons"] == {"bad_task": 2}
    (rejected,) = glob.glob(os.path.join(out, "rejected-*.parquet"))
    rows = pq.read_table(rejected).to_pylist()  # readable: the bytes are in the reason
    assert {r["task"] for r in rows} == {"bad\ufffd"}
    assert {r["reject_reason"] for r in rows} == {"bad_task: task is not valid UTF-8 (b'bad\\xff')"}


@pytest.mark.slow
def test_a_verifier_number_that_is_no_float_gets_one_answer_on_both_paths(tmp_path, monkeypatch):
    """The worker process (--reward-fn-timeout > 0) and the call in the step (0) answer alike."""
    from rescore.transforms.verifier import VerifierProcess, call_reward_fn, load_reward_fn

    (tmp_path / "huge_verifier2.py").write_text(VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    worker = VerifierProcess("huge_verifier2:huge", 30.0)
    try:
        answers = worker([{"task": 1}, {"task": 0}])
    finally:
        worker.close()
    fn = load_reward_fn("huge_verifier2:huge")
    assert answers == [call_reward_fn(fn, {"task": 1}), call_reward_fn(fn, {"task": 0})]
    assert answers[0] == (None, "model_reward: reward_fn huge_verifier2:huge returned a int that is not a float64 (OverflowError)")
    assert answers[1] == (1.0, None)


@pytest.mark.parametrize("strategy", ["on_policy_distill", pytest.param("jsd", marks=pytest.mark.slow)])
def test_a_token_advantage_beyond_float32_rejects_its_row(tmp_path, rescore, strategy):
    """Log-probs of -1e300 are log-probabilities, but teacher - logprobs = 1e300 is no float32:
    the row is rejected (non_finite_score), never written as inf under _SUCCESS."""
    rows = [{"batch": 0, "task": 5, "run": r, "step": 0, "reward": float(r), "tokens": [0, 1, 2], "prompt_length": 1, "action_mask": [1, 1],
             "logprobs": [-1e300 if r == 0 else -0.5, -0.2], "teacher_logprobs": [-0.1, -0.1]} for r in range(3)]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "in" / "part-0.parquet"))
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", strategy, "--max-reject-fraction", "1")
    assert doc["totals"]["rows_written"] == 2 and doc["totals"]["reject_reasons"] == {"non_finite_score": 1}
    assert _rejected(out) == {(0, 5, 0): "non_finite_score: advantages is not finite once written (the row's inputs pass the float range)"}
    _strict(os.path.join(out, "metrics.json"))
