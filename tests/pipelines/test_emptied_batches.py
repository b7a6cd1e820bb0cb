"""Issue 13 item 1: a filter that empties a batch must not crash the batch statistics.

Minimal input (the issue's): batch 0 rewards [0, 1], batch 1 rewards [0.5, 0.5], one task each.
Every filter stage (and std_threshold, which drops groups inside the advantage stage) with every
advantage stage that uses batch statistics, through the whole job, with and without POLARIS
duplication; the scores are checked against the spec's formulas, the accounting per batch.
"""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import reference
from data import SCHEMA_MULTI_STEP, by_id, multi_step_rows, read_output, write_parquet

from rescore.transforms.strategies import create, names, spec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SQRT_HALF = math.sqrt(0.5)  # std (ddof 1) of [0, 1]


def minimal_rows():
    """Two rows per batch, two action tokens each; run 0 is the less likely one."""
    rows = []
    for batch, rewards in ((0, [0.0, 1.0]), (1, [0.5, 0.5])):
        for run, reward in enumerate(rewards):
            lp = -1.0 if run == 0 else -0.5
            rows.append({"batch": batch, "task": 7, "run": run, "step": 0, "reward": reward,
                         "logprobs": [lp, lp], "action_mask": [1, 1], "expert": False})
    return rows


# (advantage strategy, params, score of batch 0 run 1 (run 0 scores its negative)) from the spec.
ADVANTAGES = [
    ("grpo", {"std_cal_level": "batch"}, 0.5 / (SQRT_HALF + 1e-6)),
    ("grpo", {"std_cal_level": "batch", "std_threshold": 0.0}, 0.5 / (SQRT_HALF + 1e-6)),
    ("grpo", {"std_cal_level": "batch", "epsilon": 0.0}, 0.5 / SQRT_HALF),
    # rank-corrected rewards r' = [0, 1 * (1 - 1/2 * 0.25)], the batch std over the raw rewards
    ("grpo", {"std_cal_level": "batch", "rank_penalty": 0.25}, 0.4375 / (SQRT_HALF + 1e-6)),
    ("step_wise_grpo", {"std_cal_level": "batch"}, 0.5 / (SQRT_HALF + 1e-6)),
    ("step_wise_grpo", {"std_cal_level": "batch", "std_threshold": 0.0, "enable_step_norm": True}, 0.5 / (SQRT_HALF + 1e-6)),
    # s = [-0.5, 0.5] with 2 tokens each: mu = 0, var = 4 * 0.25 / (4 - 1)
    ("reinforce_plus_plus_baseline", {}, 0.5 / math.sqrt(1 / 3 + 1e-8)),
]
FILTERS = [
    ("reward_variance", {}),
    ("reward_variance", {"reward_variance.variance_threshold": 0.1}),
    (None, {}),  # only std_threshold drops batch 1
]


def _cases():
    for f, fparams in FILTERS:
        for adv, params, expected in ADVANTAGES:
            if f is None and "std_threshold" not in params:
                continue  # nothing would empty batch 1
            for dup in (False, True):
                yield pytest.param(f, fparams, adv, params, expected, dup, id=f"{f}{json.dumps(fparams) if fparams else ''}-{adv}-{json.dumps(params)}-{'dup' if dup else 'nodup'}")


@pytest.mark.slow
@pytest.mark.parametrize("filter_stage, filter_params, advantage, params, expected, duplicate", list(_cases()))
def test_filter_that_empties_a_batch(tmp_path, rescore, filter_stage, filter_params, advantage, params, expected, duplicate):
    rows = minimal_rows()
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=2, schema=SCHEMA_MULTI_STEP)
    stages = [s for s in (filter_stage, advantage, "duplicate_informative" if duplicate else None) if s]
    all_params = {**filter_params, **params}
    sets = [f"--set={k}={json.dumps(v)}" for k, v in all_params.items()]
    buckets = "1" if duplicate else "3"  # batch 1 shares a bucket with batch 0, or may not
    doc, out = rescore(glob, "--strategy", ",".join(stages), *sets, "--buckets", buckets)

    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    scored = by_id(read_output(out, "scored"))
    assert set(scored) == {(0, 7, 0, 0), (0, 7, 1, 0)}
    for run, sign in ((0, -1.0), (1, 1.0)):
        got = scored[(0, 7, run, 0)]
        assert math.isclose(got["score"], sign * expected, rel_tol=1e-6), (run, got["score"], expected)
        assert got["advantages"] == got["returns"] == [pytest.approx(sign * expected, rel=1e-6)] * 2
        if duplicate:
            assert got["copy_index"] == 0
    # The spec's independent reference agrees.
    ref = reference.rescore_plan(minimal_rows(), stages, all_params)
    assert set(ref["scored"]) == set(scored) and ref["filtered"] == {(1, 7, 0, 0), (1, 7, 1, 0)}
    for rid, (score, _, _) in ref["scored"].items():
        assert math.isclose(scored[rid]["score"], score, rel_tol=1e-6)

    t = doc["totals"]
    assert (t["rows_read"], t["rows_written"], t["rows_written_original"], t["rows_filtered"], t["rows_rejected"]) == (4, 2, 2, 2, 0)
    assert t["rows_duplicated"] == 0
    batches = {b["batch"]: b for b in doc["batches"]}
    assert (batches[0]["rows_written"], batches[0]["rows_filtered"]) == (2, 0)
    assert (batches[1]["rows_written"], batches[1]["rows_filtered"], batches[1]["groups_filtered"]) == (0, 2, 1)
    for b in batches.values():
        assert b["rows_read"] == b["rows_written_original"] + b["rows_filtered"] + b["rows_rejected"]


@pytest.mark.slow
def test_emptied_batches_among_random_ones_match_the_reference(tmp_path, rescore):
    """Random multi-step batches plus two batches the filter empties (all-equal groups and
    single-row groups, with rewards not exact in binary), several buckets, POLARIS chain."""
    rows = multi_step_rows(11)
    for task, (n, reward) in enumerate([(3, 0.1), (6, 0.7), (1, 0.3)]):
        for run in range(n):
            rows.append({"batch": 90, "task": task, "run": run, "step": 0, "reward": reward,
                         "logprobs": [-0.2], "action_mask": [1], "expert": False})
    for task in range(3):
        rows.append({"batch": 91, "task": task, "run": 0, "step": 0, "reward": 0.2 * task,
                     "logprobs": [-0.2], "action_mask": [1], "expert": False})
    glob = write_parquet(rows, str(tmp_path / "in"), files=3, row_group_size=9, schema=SCHEMA_MULTI_STEP)
    for stages, params in [
        ("reward_variance,grpo,duplicate_informative", {"std_cal_level": "batch"}),
        ("reward_variance,reinforce_plus_plus_baseline", {}),
        ("reward_variance,step_wise_grpo", {"std_cal_level": "batch", "std_threshold": 0.0}),
    ]:
        out = str(tmp_path / stages.replace(",", "-"))
        sets = [f"--set={k}={json.dumps(v)}" for k, v in params.items()]
        doc, out = rescore(glob, "--strategy", stages, *sets, "--buckets", "4", output=out)
        expected = reference.rescore_plan(rows, stages.split(","), params)
        table = read_output(out, "scored")
        if "copy_index" in table.column_names:
            table = table.filter(pa.compute.equal(table["copy_index"], 0))
        scored = by_id(table)
        assert set(scored) == set(expected["scored"])
        assert not any(b in (90, 91) for b, *_ in scored)
        for rid, (score, _, _) in expected["scored"].items():
            assert math.isclose(scored[rid]["score"], score, rel_tol=1e-6, abs_tol=1e-9), (stages, rid)
        batches = {b["batch"]: b for b in doc["batches"]}
        assert batches[90]["rows_filtered"] == 10 and batches[91]["rows_filtered"] == 3
        assert batches[90]["rows_written"] == batches[91]["rows_written"] == 0
        t = doc["totals"]
        assert t["rows_read"] == len(rows) == t["rows_written_original"] + t["rows_filtered"] + t["rows_rejected"]


@pytest.mark.slow
def test_cli_exit_0_for_the_issue_command(tmp_path):
    """The issue's command line, as a user runs it: exit 0, _SUCCESS, nothing on stderr that
    looks like a crash."""
    table = pa.Table.from_pylist(minimal_rows(), schema=SCHEMA_MULTI_STEP)
    os.makedirs(tmp_path / "in")
    pq.write_table(table, tmp_path / "in" / "x.parquet")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "rescore", "--input", str(tmp_path / "in" / "*.parquet"), "--output", str(out),
         "--strategy", "reward_variance,grpo", "--set", "std_cal_level=batch", "--runner=FnApiRunner", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr
    assert (out / "_SUCCESS").exists()
    assert json.loads((out / "metrics.json").read_text())["totals"]["rows_filtered"] == 2


def _batch_level_strategies():
    for name in names():
        defaults = spec(name).defaults
        variants = [{}] + ([{"std_cal_level": "batch"}] if "std_cal_level" in defaults else [])
        for params in variants:
            strategy = create(name, params)
            if strategy.batch_level:
                yield name, params, strategy


def test_every_batch_level_strategy_accepts_a_batch_without_values():
    """The score step asks for the statistics of every batch, also one an earlier filter
    emptied: every registered batch-level strategy must answer with finite numbers."""
    found = list(_batch_level_strategies())
    assert {n for n, _, _ in found} >= {"grpo", "step_wise_grpo", "reinforce_plus_plus_baseline"}
    for name, params, strategy in found:
        stats = strategy.batch_stats(np.zeros(0), np.zeros(0))
        assert len(stats) >= 1 and all(np.isfinite(stats)), (name, params, stats)
