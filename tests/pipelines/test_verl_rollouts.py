"""verl rollout dumps (trainer.rollout_data_dir/{step}.jsonl) as input: grouped by (step, input)."""

import json
import os

import numpy as np
import pytest

from batched import run_many
from conftest import RUNNER
from data import read_output



def _dump(directory, step, entries, extra_lines=()):
    os.makedirs(directory, exist_ok=True)
    lines = [json.dumps({"input": i, "output": o, "score": s, "step": step, **extra}) for i, o, s, extra in entries]
    with open(os.path.join(directory, f"{step}.jsonl"), "w") as f:
        f.write("\n".join([*lines, *extra_lines]) + "\n")


def test_groups_by_step_and_prompt_and_scores_scalar(tmp_path, rescore):
    d = tmp_path / "rollouts"
    _dump(d, 1, [("p1", "a", 1.0, {"acc": 1}), ("p1", "b", 0.0, {"acc": 0}), ("p2", "c", 0.5, {}),
                 ("p1", "d", 1.0, {}), ("p2", "e", 0.5, {})])
    _dump(d, 2, [("p1", "f", 0.0, {"gts": [1, 2]}), ("p1", "g", 2.0, {})],
          extra_lines=["{not json", json.dumps({"input": "p3", "output": "x", "step": 2}), json.dumps({"input": "p3", "output": "x", "step": 2, "score": "high"})])
    doc, out = rescore(str(d / "*.jsonl"), "--input-format", "verl-rollouts", "--strategy", "grpo")
    assert doc["source"] == {"format": "verl-rollouts", "files": 2}
    rows = read_output(out).to_pylist()
    assert len(rows) == 7 and doc["totals"]["rows_rejected"] == 3
    by = {(r["batch"], r["input"], r["output"]): r for r in rows}
    # step 1, "p1": rewards 1, 0, 1 -> mean 2/3, unbiased std 0.57735
    mean, std = 2 / 3, np.std([1.0, 0.0, 1.0], ddof=1)
    assert by[(1, "p1", "a")]["score"] == pytest.approx((1 - mean) / (std + 1e-6), abs=1e-5)
    assert by[(1, "p1", "b")]["score"] == pytest.approx((0 - mean) / (std + 1e-6), abs=1e-5)
    assert by[(1, "p2", "c")]["score"] == 0.0  # equal rewards: exactly 0
    # step 2 is a batch of its own: "p1" there is not step 1's group
    assert by[(2, "p1", "g")]["score"] == pytest.approx(1 / (np.std([0.0, 2.0], ddof=1) + 1e-6), abs=1e-5)
    assert {r["run"] for r in rows if r["batch"] == 1 and r["input"] == "p1"} == {0, 1, 2}
    assert all(r["advantages"] == [] and r["step"] == 0 for r in rows)  # no tokens: scalar scores only
    assert by[(1, "p1", "a")]["extra"] == '{"acc": 1}' and by[(2, "p1", "f")]["gts"] == "[1, 2]"
    reasons = sorted(r["reject_reason"].split(":")[0] for r in read_output(out, "rejected").to_pylist())
    assert reasons == ["bad_json", "bad_reward", "missing_field"]


def test_sample_rollouts_and_refusals(tmp_path):
    (code, _), (run, run_err), (text_only, text_only_err), (none, none_err) = run_many(tmp_path, [
        ["sample", "--format", "verl-rollouts", "--output", str(tmp_path / "r"), "--batches", "2", "--tasks", "3"],
        ["--input", str(tmp_path / "r"), "--input-format", "verl-rollouts", "--output", str(tmp_path / "o"),
         "--algorithm", "grpo", "--quiet", RUNNER],
        ["--input", str(tmp_path / "r"), "--input-format", "verl-rollouts", "--output", str(tmp_path / "o2"),
         "--strategy", "grpo", "--output-db", f"sqlite:///{tmp_path}/x.db", "--output-table", "t", RUNNER],
        ["--input", str(tmp_path / "none" / "*.jsonl"), "--input-format", "verl-rollouts", "--output",
         str(tmp_path / "o3"), "--strategy", "grpo", RUNNER],
    ])  # one child process (batched.py), each run with its own stderr
    assert code == 0 and sorted(os.listdir(tmp_path / "r")) == ["1.jsonl", "2.jsonl"]
    assert run == 0, run_err
    assert os.path.exists(tmp_path / "o" / "_SUCCESS")
    assert text_only == 2 and "verl rollout dumps hold text only" in text_only_err
    assert len(text_only_err.strip().splitlines()) == 1
    assert none == 2 and "no verl rollout files match" in none_err
