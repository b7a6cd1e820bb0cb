"""Every new estimator and filter through the command line (`--strategy NAME --set ...`) on tiny
data: the written advantages equal the pure scoring path (which test_estimators_refs.py checks
against verl's and Trinity's own functions), and bad input fails with one line."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batched import run_many
from data import read_output
from test_estimators_refs import SCHEMA, dapo_rows, gigpo_batches, ours, random_batches, ref, trinity_dapo_kept, trinity_gigpo  # noqa: F401  (ref: fixture)


CASES = [
    ("reinforceplusplus", {}),
    ("reinforceplusplus", {"gamma": 0.9}),
    ("reinforce_plus_plus", {"gamma": 0.8}),
    ("reinforce", {}),
    ("rec", {"std_normalize": True}),
    ("rec", {"drop": "balance", "seed": 3}),
    ("jsd", {"lambda_coef": 0.3, "kl_coef": 0.5}),
    ("gigpo", {"omega": 0.5, "gamma": 0.9, "fnorm": "std"}),
    ("remax", {"reward_baselines": "reward_baselines"}),
    ("opo", {}),
    ("grpo_passk", {"norm_adv_by_std_in_grpo": False}),
    ("gpg", {"f_norm": 2.0}),
    ("gdpo", {"gdpo_reward_keys": ["acc", "fmt"], "gdpo_reward_weights": [1.0, 0.5]}),
    ("rloo", {"normalize_advantages": True}),
    ("normalize_then_sum", {"reward_keys": ["acc", "fmt"], "reward_weights": [1.0, 0.5]}),
    ("normalize", {"mean_level": "group", "std_level": "batch", "weighting": "token"}),
    ("maxrl", {}),
    ("flash_reinforce", {}),
]


def _write(rows, directory):
    os.makedirs(directory, exist_ok=True)
    half = len(rows) // 2
    for i, part in enumerate((rows[:half], rows[half:])):
        pq.write_table(pa.Table.from_pylist(part, schema=SCHEMA), os.path.join(directory, f"part-{i}.parquet"), row_group_size=5)
    return os.path.join(directory, "*.parquet")


def _sets(params: dict) -> list[str]:
    out = []
    for k, v in params.items():
        out += ["--set", f"{k}={json.dumps(v) if not isinstance(v, str) else v}"]
    return out


def _written(out: str) -> dict:
    table = read_output(out)
    return {(r["batch"], r["task"], r["run"], r["step"]): r for r in table.to_pylist()}


@pytest.mark.slow
@pytest.mark.parametrize("strategy, params", CASES, ids=[f"{s}-{i}" for i, (s, _) in enumerate(CASES)])
def test_estimator_through_the_cli(rescore, tmp_path, strategy, params):
    rows = random_batches(7, batches=2, steps=strategy == "gigpo", multi_turn=strategy != "gigpo")
    rows = [r for r in rows if r["batch"] == 0][:40] + [r for r in rows if r["batch"] == 1][:40]
    if strategy == "gigpo":  # whole runs only
        keep = {(r["batch"], r["task"], r["run"]) for r in rows}
        rows = [r for r in random_batches(7, batches=2, steps=True, multi_turn=False) if (r["batch"], r["task"], r["run"]) in keep]
    glob = _write(rows, str(tmp_path / "in"))
    doc, out = rescore(glob, "--strategy", strategy, *_sets(params))
    written = _written(out)
    assert len(written) == len(rows)
    want = ours(strategy, params, rows)
    for r, w in zip(rows, want):
        got = written[(r["batch"], r["task"], r["run"], r["step"])]
        np.testing.assert_allclose(got["advantages"], w.astype(np.float32), rtol=1e-6, atol=1e-6)
        assert got["returns"] == got["advantages"]
        assert np.isfinite(got["score"])


@pytest.mark.slow
def test_algorithm_gigpo_pools_anchors_across_buckets_as_trinity(rescore, tmp_path, ref):
    """Anchor states shared across tasks, null step rewards, many shuffle buckets: every row of
    a batch meets in one bucket, and the written advantages are Trinity's."""
    rows = gigpo_batches(11)
    glob = _write(rows, str(tmp_path / "in"))
    _, out = rescore(glob, "--algorithm", "gigpo", "--buckets", "16")
    written = _written(out)
    assert len(written) == len(rows)
    for r, w in zip(rows, trinity_gigpo(ref, rows, {})):
        got = written[(r["batch"], r["task"], r["run"], r["step"])]
        np.testing.assert_allclose(got["advantages"], w, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_algorithm_dapo_keeps_the_rows_trinity_keeps(rescore, tmp_path, ref):
    rows = dapo_rows(5)
    glob = _write(rows, str(tmp_path / "in"))
    doc, out = rescore(glob, "--algorithm", "dapo", "--set", "metric_key=acc", "--set", "correct_threshold=0.25")
    written = _written(out)
    kept = trinity_dapo_kept(ref, rows, correct_threshold=0.25)
    assert {(r["batch"], r["task"], r["run"], r["step"]) for i, r in enumerate(rows) if i in kept} == set(written)
    assert doc["totals"]["rows_filtered"] == len(rows) - len(kept) > 0


def test_filter_groups_drops_groups_without_spread_in_the_metric(rescore, tmp_path):
    rows = random_batches(3, batches=2)
    glob = _write(rows, str(tmp_path / "in"))
    doc, out = rescore(glob, "--strategy", "filter_groups,grpo", "--set", "metric=acc")
    written = _written(out)
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["batch"], r["task"]), []).append(r["acc"])
    for r in rows:
        accs = groups[(r["batch"], r["task"])]
        informative = len(accs) == 1 or len(set(accs)) > 1
        assert ((r["batch"], r["task"], r["run"], r["step"]) in written) == informative


@pytest.mark.slow
def test_dynamic_filtering_keeps_groups_with_mean_strictly_inside(rescore, tmp_path):
    rows = random_batches(4, batches=2)
    glob = _write(rows, str(tmp_path / "in"))
    _, out = rescore(glob, "--strategy", "dynamic_filtering,rloo", "--set", "dynamic_filtering_reward_range=[0,1]")
    written = _written(out)
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["batch"], r["task"]), []).append(r["reward"])
    for r in rows:
        rewards = groups[(r["batch"], r["task"])]
        inside = 0 < sum(rewards) / len(rewards) < 1
        assert ((r["batch"], r["task"], r["run"], r["step"]) in written) == inside


@pytest.mark.slow
@pytest.mark.parametrize("drop", [False, True])
def test_truncated_responses_are_masked_or_dropped(rescore, tmp_path, drop):
    rows = random_batches(5, batches=1)
    schema = SCHEMA.append(pa.field("truncate_status", pa.string()))
    for i, r in enumerate(rows):
        r["truncate_status"] = ["response_truncated", None, "none"][i % 3]
    os.makedirs(tmp_path / "in")
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), str(tmp_path / "in" / "part-0.parquet"))
    _, out = rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", "mask_response_truncated,grpo", "--set", f"drop={json.dumps(drop)}")
    written = _written(out)
    plain = _written(rescore(str(tmp_path / "in" / "*.parquet"), "--strategy", "grpo", output=str(tmp_path / "plain"))[1])
    for r in rows:
        key = (r["batch"], r["task"], r["run"], r["step"])
        if r["truncate_status"] == "response_truncated":
            if drop:
                assert key not in written
            else:
                # Stays in its group's statistics: the others score as without masking.
                assert not any(written[key]["advantages"]) and not any(written[key]["action_mask"])
        elif not drop:
            assert written[key]["advantages"] == plain[key]["advantages"]
            assert written[key]["action_mask"] == plain[key]["action_mask"]


MISSING_REWARD = ["--strategy", "gdpo", "--set", 'gdpo_reward_keys=["acc","missing_metric"]']
BAD_PARAMETERS = [
    (["--strategy", "rec", "--set", "drop=random"], "drop"),
    (["--strategy", "reinforceplusplus", "--set", "gamma=1.5"], "gamma"),
    (["--strategy", "gdpo", "--set", 'gdpo_reward_keys=["acc"]', "--set", "gdpo_reward_weights=[1,2]"], "weights"),
    (["--algorithm", "ppo"], "critic"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory):
    """MISSING_REWARD and every BAD_PARAMETERS command line, in one child process (batched.py):
    {args: (exit status, stderr)}."""
    work = tmp_path_factory.mktemp("refusals")
    glob = _write(random_batches(1, batches=1), str(work / "in"))
    cases = [MISSING_REWARD, *(args for args, _ in BAD_PARAMETERS)]
    runs = run_many(work, [["--input", glob, "--output", str(work / f"out{i}"), "--runner=FnApiRunner", *args]
                           for i, args in enumerate(cases)])
    return {tuple(args): run for args, run in zip(cases, runs)}


def _exit_2_with_one_line(run, message):
    code, stderr = run
    assert code == 2, stderr
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rescore: error:") and message in lines[0], stderr


@pytest.mark.slow
def test_a_missing_reward_column_fails_with_one_line(refusals):
    _exit_2_with_one_line(refusals[tuple(MISSING_REWARD)], "missing_metric")


@pytest.mark.slow
@pytest.mark.parametrize("args, message", BAD_PARAMETERS)
def test_bad_parameters_fail_with_one_line(refusals, args, message):
    _exit_2_with_one_line(refusals[tuple(args)], message)


@pytest.mark.slow
def test_filtered_token_level_estimator_with_duplication(rescore, tmp_path):
    """reward_variance -> reinforceplusplus (batch statistics over the kept rows only) ->
    duplicate_informative: originals match the pure path, copies carry their source's values."""
    rows = random_batches(11, batches=2)
    glob = _write(rows, str(tmp_path / "in"))
    strategy = "reward_variance,reinforceplusplus,duplicate_informative"
    _, out = rescore(glob, "--strategy", strategy, "--set", "gamma=0.9")
    table = read_output(out).to_pylist()
    want = ours(strategy, {"gamma": 0.9}, rows)
    by_key = {(r["batch"], r["task"], r["run"], r["step"]): w for r, w in zip(rows, want)}
    originals = [r for r in table if r["copy_index"] == 0]
    assert {(r["batch"], r["task"], r["run"], r["step"]) for r in originals} == {k for k, w in by_key.items() if w is not None}
    for r in originals:
        np.testing.assert_allclose(r["advantages"], by_key[(r["batch"], r["task"], r["run"], r["step"])].astype(np.float32), rtol=1e-6, atol=1e-6)
    copies = [r for r in table if r["copy_index"] > 0]
    assert copies
    for r in copies:
        np.testing.assert_allclose(r["advantages"], by_key[(r["batch"], r["source_task"], r["run"], r["step"])].astype(np.float32), rtol=1e-6, atol=1e-6)
