"""Every strategy and composition through the whole job, against the slow reference.

Input: multi-step runs of 1-5 steps with random action masks and expert rows, shuffled over
several files and row groups (tests/data.py multi_step_rows).
"""

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import reference
from data import SCHEMA_MULTI_STEP, by_id, multi_step_rows, read_output, write_parquet

CASES = [
    ("opmd", {}),
    ("opmd", {"opmd_baseline": "logavgexp"}),
    ("opmd", {"opmd_baseline": "logavgexp", "tau": 0.05}),
    ("asymre", {}),
    ("asymre", {"baseline_shift": 0.3}),
    ("step_wise_grpo", {}),
    ("step_wise_grpo", {"enable_step_norm": True}),
    ("step_wise_grpo", {"std_cal_level": "batch", "enable_step_norm": True}),
    ("step_wise_grpo", {"std_threshold": 0.2}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("reinforce_plus_plus_baseline", {}),
    ("raft", {}),
    ("raft", {"top_only": False, "reward_threshold": 0.5, "weight": 2.0}),
    ("constant", {"weight": 0.5}),
    ("reward_variance", {}),
    ("reward_variance", {"variance_threshold": 0.1}),
    ("mix_chord", {"mu_warmup_steps": 3, "mu_decay_steps": 4, "mu_peak": 0.5, "mu_valley": 0.05}),
    ("reward_variance,grpo", {"std_cal_level": "batch"}),
    ("reward_variance,reinforce_plus_plus_baseline", {"variance_threshold": 0.05}),
    ("grpo", {"std_threshold": 0.1, "std_cal_level": "batch"}),
    ("maxrl", {}),
    ("flash_reinforce", {}),
    ("normalize", {}),
    ("normalize", {"mean_level": "group", "std_level": "batch", "std_unbiased": False}),
    ("reward_variance,normalize", {"mean_level": "batch", "std_level": "group", "eps": 1e-3}),
]


def _close(a, b):
    return math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-6)


def _run(tmp_path, rescore, strategy, params, seed=5):
    rows = multi_step_rows(seed)
    glob = write_parquet(rows, str(tmp_path / "in"), files=3, row_group_size=9, schema=SCHEMA_MULTI_STEP)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in params.items()]
    doc, out = rescore(glob, "--strategy", strategy, *sets, "--buckets", "4", "--shard-rows", "20")
    return rows, doc, out


@pytest.mark.slow
@pytest.mark.parametrize("strategy, params", CASES)
def test_matches_reference(tmp_path, rescore, strategy, params):
    rows, doc, out = _run(tmp_path, rescore, strategy, params)
    expected = reference.rescore_plan(rows, strategy.split(","), params)
    scored = by_id(read_output(out, "scored"))
    assert set(scored) == set(expected["scored"])
    if "variance" in strategy or "threshold" in json.dumps(params) or strategy == "raft":
        assert expected["filtered"], "the data should make this case drop rows"
    for rid, (score, advantages, row) in expected["scored"].items():
        got = scored[rid]
        if score is None:
            assert got["score"] is None and got["advantages"] is None and got["returns"] is None
            continue
        assert _close(got["score"], score), (rid, got["score"], score)
        assert len(got["advantages"]) == len(advantages)
        assert all(_close(a, b) for a, b in zip(got["advantages"], advantages)), (rid, got["advantages"], advantages)
        assert got["returns"] == got["advantages"]
        if "_mu" in row:
            assert _close(got["mu"], row["_mu"]) and _close(got["loss_weight"], row["_loss_weight"])
            assert all(_close(a, b) for a, b in zip(got["sft_token_weights"], row["_phi"]))
    t = doc["totals"]
    assert t["rows_read"] == len(rows)
    assert t["rows_filtered"] == len(expected["filtered"])
    assert t["rows_written"] == t["rows_written_original"] == len(expected["scored"])
    assert t["rows_read"] == t["rows_written_original"] + t["rows_filtered"] + t["rows_rejected"]
    for b in doc["batches"]:
        assert b["rows_read"] == b["rows_written_original"] + b["rows_filtered"] + b["rows_rejected"]


@pytest.mark.slow
def test_mix_chord_schedule_values(tmp_path, rescore):
    # warm-up 0 -> peak over 3 steps, cosine to the valley over 4: batches 2, 3, 4 are 2/3 peak,
    # peak, and (peak - valley) * 0.5 * (1 + cos(pi / 4)) + valley.
    rows, _, out = _run(tmp_path, rescore, "mix_chord",
                        {"mu_warmup_steps": 3, "mu_decay_steps": 4, "mu_peak": 0.5, "mu_valley": 0.05})
    table = read_output(out)
    mu = dict(zip(table["batch"].to_pylist(), table["mu"].to_pylist()))
    assert mu[2] == pytest.approx(2 / 3 * 0.5, rel=1e-6)
    assert mu[3] == pytest.approx(0.5, rel=1e-6)
    assert mu[4] == pytest.approx(0.45 * 0.5 * (1 + math.cos(math.pi / 4)) + 0.05, rel=1e-6)
    expert = np.asarray(table["expert"].to_pylist())
    assert expert.any() and (~expert).any()
    weights = np.asarray(table["loss_weight"].to_pylist())
    mus = np.asarray(table["mu"].to_pylist())
    assert np.allclose(weights[expert], mus[expert]) and np.allclose(weights[~expert], 1 - mus[~expert])
    assert all(s == 0 for s, e in zip(table["score"].to_pylist(), expert) if e)


DUP_CASES = [
    ("duplicate_informative", {}),
    ("reward_variance,grpo,duplicate_informative", {"grpo.std_cal_level": "batch", "duplicate_informative.seed": 7}),
    ("grpo,duplicate_informative", {"std_threshold": 0.0}),
    ("step_wise_grpo,duplicate_informative", {"enable_step_norm": True, "duplicate_informative.variance_threshold": 0.05}),
]
ID_COLUMNS = ("batch", "task", "run", "step", "copy_index", "source_task")


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([(c, "ascending") for c in ("batch", "task", "run", "step")])


@pytest.mark.slow
@pytest.mark.parametrize("strategy, params", DUP_CASES)
def test_duplication_invariants(tmp_path, rescore, strategy, params):
    rows, doc, out = _run(tmp_path, rescore, strategy, params)
    expected = reference.rescore_plan(rows, strategy.split(","), params)
    table = read_output(out)
    originals = table.filter(pc.equal(table["copy_index"], 0))
    copies = table.filter(pc.greater(table["copy_index"], 0))
    assert copies.num_rows > 0

    # Originals: exactly the reference's kept rows with its scores; source_task is their task.
    got = by_id(originals)
    assert set(got) == set(expected["scored"])
    for rid, (score, _, _) in expected["scored"].items():
        assert (got[rid]["score"] is None) if score is None else _close(got[rid]["score"], score)
    assert originals["source_task"].to_pylist() == originals["task"].to_pylist()

    # Unique ids across originals and copies.
    ids = list(zip(*(table[c].to_pylist() for c in ("batch", "task", "run", "step"))))
    assert len(ids) == len(set(ids))

    # Every copy equals its source row except the id columns.
    source = {(r["batch"], r["task"], r["run"], r["step"]): r for r in originals.to_pylist()}
    per_group_copies = {}
    for r in copies.to_pylist():
        src = source[(r["batch"], r["source_task"], r["run"], r["step"])]
        assert {k: v for k, v in r.items() if k not in ID_COLUMNS} == {k: v for k, v in src.items() if k not in ID_COLUMNS}
        per_group_copies.setdefault((r["batch"], r["source_task"], r["copy_index"]), set()).add(r["task"])
    # A copy is a whole group under one new task id.
    assert all(len(tasks) == 1 for tasks in per_group_copies.values())
    for (b, task, k), _ in per_group_copies.items():
        n_src = sum(1 for rid in got if rid[0] == b and rid[1] == task)
        n_copy = sum(1 for r in copies.to_pylist() if r["batch"] == b and r["source_task"] == task and r["copy_index"] == k)
        assert n_copy == n_src

    # Per batch: written >= rows before filtering, and less than that plus the largest group.
    written = {}
    for b in table["batch"].to_pylist():
        written[b] = written.get(b, 0) + 1
    informative = expected["informative"]
    for b, before in expected["before"].items():
        sizes = [len(ids_) for (bb, _), ids_ in informative.items() if bb == b]
        if not sizes:
            assert written.get(b, 0) == 0
            continue
        assert before <= written[b] < before + max(sizes), (b, before, written[b], sizes)
    # No uninformative group survives.
    kept_groups = {(rid[0], rid[1]) for rid in got}
    assert kept_groups == set(informative)

    t = doc["totals"]
    assert t["rows_duplicated"] == copies.num_rows and t["rows_written"] == table.num_rows
    assert t["rows_read"] == t["rows_written_original"] + t["rows_filtered"] + t["rows_rejected"]
    assert t["groups_duplicated"] == len(per_group_copies)
    name = strategy.split(",")[-1]
    assert t["strategies"][name]["duplicated_count"] == copies.num_rows


@pytest.mark.slow
def test_duplication_is_the_same_with_shuffled_input(tmp_path, rescore):
    """Other files, row groups, read units and buckets, rows in reverse: the same rows and copies.
    (The same chain with two worker processes: tests/pipelines/test_runners.py, multi-process.)"""
    strategy, params = DUP_CASES[1]
    _, _, one = _run(tmp_path, rescore, strategy, params)
    rows = multi_step_rows(5)
    rows.reverse()
    glob = write_parquet(rows, str(tmp_path / "in2"), files=2, row_group_size=4, schema=SCHEMA_MULTI_STEP)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in params.items()]
    _, two = rescore(glob, "--strategy", strategy, *sets, "--buckets", "3", "--shard-rows", "7", output=str(tmp_path / "two"))
    a, b = _sorted(read_output(one)), _sorted(read_output(two))
    assert a.num_rows == b.num_rows and a.equals(b)


@pytest.mark.slow
def test_the_seed_changes_which_groups_are_copied(tmp_path, rescore):
    rows = multi_step_rows(5, batches=6)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=9, schema=SCHEMA_MULTI_STEP)
    outputs = []
    for seed in (0, 0, 1):
        _, out = rescore(glob, "--strategy", "duplicate_informative", f"--set=seed={seed}", output=str(tmp_path / f"o{len(outputs)}"))
        outputs.append(_sorted(read_output(out)))
    assert outputs[0].equals(outputs[1])
    assert not outputs[0].equals(outputs[2])


def test_string_task_copies_get_new_task_names(tmp_path, rescore):
    from data import random_rows

    rows = random_rows(3, string_tasks=True, batches=4)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=6)
    doc, out = rescore(glob, "--strategy", "grpo,duplicate_informative")
    table = read_output(out)
    copies = table.filter(pc.greater(table["copy_index"], 0)).to_pylist()
    assert copies and all(r["task"] == f"{r['source_task']}#copy{r['copy_index']}" for r in copies)
    ids = list(zip(*(table[c].to_pylist() for c in ("batch", "task", "run", "step"))))
    assert len(ids) == len(set(ids))
    assert doc["totals"]["rows_duplicated"] == len(copies)


@pytest.mark.slow
def test_stage_metrics_per_batch(tmp_path, rescore):
    rows, doc, _ = _run(tmp_path, rescore, "reward_variance,grpo,duplicate_informative",
                        {"reward_variance.variance_threshold": 0.01, "std_threshold": 0.3})
    expected = reference.rescore_plan(rows, ["reward_variance", "grpo", "duplicate_informative"],
                                      {"reward_variance.variance_threshold": 0.01, "std_threshold": 0.3})
    t = doc["totals"]
    stages = t["strategies"]
    assert set(stages) == {"reward_variance", "grpo", "duplicate_informative"}
    assert stages["grpo"]["std_threshold_skipped"] == stages["grpo"]["filtered_groups"]
    filtered = sum(s["filtered_count"] for s in stages.values())
    assert filtered == t["rows_filtered"] == len(expected["filtered"])
    assert sum(b["strategies"]["reward_variance"]["filtered_count"] for b in doc["batches"]) == stages["reward_variance"]["filtered_count"]
    assert t["groups_filtered"] == sum(s["filtered_groups"] for s in stages.values())


@pytest.mark.slow
def test_algorithm_preset_runs_from_the_command_line(tmp_path, rescore):
    rows, _, _ = _run(tmp_path, rescore, "grpo", {})
    doc, out = rescore(str(tmp_path / "in" / "*.parquet"), "--algorithm", "multi_step_grpo", "--set", "enable_step_norm=true",
                       output=str(tmp_path / "preset"))
    assert doc["algorithm"] == "multi_step_grpo" and doc["strategy"] == "step_wise_grpo"
    expected = reference.rescore_plan(rows, ["step_wise_grpo"], {"enable_step_norm": True})
    got = by_id(read_output(out))
    assert set(got) == set(expected["scored"])
    assert all(_close(got[i]["score"], s) for i, (s, _, _) in expected["scored"].items())


@pytest.mark.slow
def test_on_policy_distill_token_advantages(tmp_path, rescore):
    rows = multi_step_rows(9)
    for i, r in enumerate(rows):
        r["teacher_logprobs"] = [min(0.0, x + 0.25 * ((i + j) % 3)) for j, x in enumerate(r["logprobs"])]  # log-probs: <= 0
    rows[0]["teacher_logprobs"] = rows[0]["teacher_logprobs"] + [-1.0]  # wrong length: rejected
    schema = SCHEMA_MULTI_STEP.append(pa.field("teacher_logprobs", pa.list_(pa.float32())))
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=9, schema=schema)
    doc, out = rescore(glob, "--algorithm", "on_policy_distill", "--set", "kl_coef=0.5")
    got = by_id(read_output(out))
    rejected = by_id(read_output(out, "rejected"))
    first = (rows[0]["batch"], rows[0]["task"], rows[0]["run"], rows[0]["step"])
    assert rejected[first]["reject_reason"].startswith("length_mismatch")
    f32 = lambda xs: np.asarray(xs, np.float32).astype(np.float64)
    for r in rows[1:]:
        g = got[(r["batch"], r["task"], r["run"], r["step"])]
        expected = 0.5 * (f32(r["teacher_logprobs"]) - f32(r["logprobs"])) * np.asarray(r["action_mask"])
        assert np.allclose(g["advantages"], expected, rtol=1e-5, atol=1e-6)
        tokens = sum(r["action_mask"])
        assert _close(g["score"], float(expected.sum() / tokens) if tokens else 0.0)
    assert doc["totals"]["rows_rejected"] == 1


@pytest.mark.slow
def test_on_policy_distill_without_teacher_logprobs_says_what_is_needed(tmp_path, rescore):
    from rescore.schemas import SchemaError

    glob = write_parquet(multi_step_rows(9), str(tmp_path / "in"), files=1, schema=SCHEMA_MULTI_STEP)
    with pytest.raises(SchemaError, match="missing column 'teacher_logprobs'.*teacher model's log-probs"):
        rescore(glob, "--algorithm", "on_policy_distill")
