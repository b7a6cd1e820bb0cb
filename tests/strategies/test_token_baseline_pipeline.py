"""optimal_token_baseline and tir_optimal_token_baseline through the whole job: rows with
sum_pi_squared columns (as --sum-pi-squared writes them), spread over files, buckets and read
units; every written token advantage (masked tokens included) against verl 0.9.1's own
compute_optimal_token_baseline_advantage / compute_multi_turn_optimal_token_baseline_advantage
over the same float32 values, to 1e-5 relative."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest
import torch
from data import SCHEMA_INT_TASK, by_id, read_output, write_parquet
from refs import RefsUnavailable, ref  # noqa: F401  (ref: the fixture)

SCHEMA = SCHEMA_INT_TASK.append(pa.field("sum_pi_squared", pa.list_(pa.float32())))
RTOL = 1e-5


def _rows(seed: int) -> list[dict]:
    """Groups of 1..6 rows, responses of 0..24 tokens (one of 60 per batch: a zero tail), ~25%
    masked tokens, rows whose last token is masked (their reward is lost, as in verl)."""
    rng = random.Random(seed)
    rows = []
    for batch in range(2):
        for t in range(rng.randint(4, 7)):
            n = rng.choice([1, 2, 3, 4, 6])
            for k, run in enumerate(rng.sample(range(50), n)):
                length = 60 if (t == 0 and k == 0) else rng.randint(0, 24)
                logprobs, spp = [], []
                for _ in range(length):
                    logits = [rng.gauss(0, 2) for _ in range(6)]
                    z = sum(np.exp(logits))
                    p = [float(np.exp(v) / z) for v in logits]
                    logprobs.append(float(np.log(p[rng.randrange(6)])))
                    spp.append(sum(v * v for v in p))
                mask = [rng.random() > 0.25 for _ in range(length)]
                if length:
                    mask[0] = True
                rows.append(
                    {
                        "batch": batch, "task": t * 7 + 3, "run": run, "step": 0,
                        "reward": rng.choice([0.0, 1.0, rng.uniform(-2, 3)]),
                        "tokens": [rng.randint(0, 1000) for _ in range(3 + length)], "prompt_length": 3,
                        "logprobs": logprobs, "action_mask": mask, "note": f"r{batch}-{t}-{run}", "sum_pi_squared": spp,
                    }
                )
    rng.shuffle(rows)
    return rows


def _verl(ref, rows: list[dict], tir: bool, handle_zero_tail: bool = True) -> dict:
    """verl's advantages of every row, by id, over the float32 values the job reads."""
    t = max(len(r["logprobs"]) for r in rows)

    def pad(values):
        return [float(v) for v in values] + [0.0] * (t - len(values))

    f32 = lambda key: torch.tensor([pad(r[key]) for r in rows], dtype=torch.float32).double()  # noqa: E731
    mask = torch.tensor([pad(r["action_mask"]) for r in rows], dtype=torch.float64)
    rewards = torch.zeros(len(rows), t, dtype=torch.float64)
    for i, r in enumerate(rows):
        if r["logprobs"]:
            rewards[i, len(r["logprobs"]) - 1] = r["reward"]
    index = np.array([f"{r['batch']}/{r['task']}" for r in rows], dtype=object)
    fn = ref.verl.compute_multi_turn_optimal_token_baseline_advantage if tir else ref.verl.compute_optimal_token_baseline_advantage
    adv, _ = fn(rewards, mask, index, f32("logprobs"), f32("sum_pi_squared"), handle_zero_tail=handle_zero_tail)
    return {(r["batch"], r["task"], r["run"], 0): adv[i, : len(r["logprobs"])].tolist() for i, r in enumerate(rows)}


def _run(tmp_path, rescore, rows, strategy, params=None, *args):
    glob = write_parquet(rows, str(tmp_path / "in"), files=3, row_group_size=5, schema=SCHEMA)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in (params or {}).items()]
    return rescore(glob, "--strategy", strategy, *sets, "--keep-filtered", "--buckets", "3", "--shard-rows", "8", *args)


@pytest.mark.parametrize(
    "strategy,params",
    [
        ("optimal_token_baseline", {}),
        pytest.param("tir_optimal_token_baseline", {}, marks=pytest.mark.slow),
        pytest.param("optimal_token_baseline", {"handle_zero_tail": False}, marks=pytest.mark.slow),
    ],
)
def test_token_baseline_through_the_job_equals_verl(tmp_path, rescore, ref, strategy, params):
    rows = _rows(5)
    doc, out = _run(tmp_path, rescore, rows, strategy, params)
    want = _verl(ref, rows, tir=strategy.startswith("tir"), handle_zero_tail=params.get("handle_zero_tail", True))
    scored = by_id(read_output(out, "scored"))
    assert set(scored) == set(want) and read_output(out, "filtered") is None
    assert doc["totals"]["rows_written"] == len(rows) and doc["totals"]["rows_filtered"] == 0
    nonzero = 0
    for key, row in scored.items():
        np.testing.assert_allclose(row["advantages"], want[key], rtol=RTOL, atol=1e-6, err_msg=str(key))
        mask = np.asarray(row["action_mask"], dtype=np.float64)
        assert all(a == 0.0 for a, m in zip(row["advantages"], mask) if not m)  # masked tokens: 0
        actions = mask.sum()
        assert row["score"] == pytest.approx(sum(row["advantages"]) / actions if actions else 0.0, rel=1e-5, abs=1e-6)
        nonzero += any(abs(a) > 1e-3 for a in row["advantages"])
    assert nonzero > len(rows) // 2  # the check is not over zeros


@pytest.mark.slow
def test_token_baseline_drops_rows_whose_statistics_do_not_line_up(tmp_path, rescore, ref):
    """A row whose sum_pi_squared is shorter than its response is filtered with the reason;
    the others are scored as verl scores them without it."""
    rows = _rows(8)
    victim = next(r for r in rows if len(r["logprobs"]) > 3)
    victim["sum_pi_squared"] = victim["sum_pi_squared"][:-1]
    doc, out = _run(tmp_path, rescore, rows, "optimal_token_baseline")
    filtered = by_id(read_output(out, "filtered"))
    key = (victim["batch"], victim["task"], victim["run"], 0)
    assert list(filtered) == [key]
    assert filtered[key]["filter_reason"].startswith("optimal_token_baseline: logprobs, sum_pi_squared")
    want = _verl(ref, [r for r in rows if r is not victim], tir=False)
    scored = by_id(read_output(out, "scored"))
    assert set(scored) == set(want)
    for k, row in scored.items():
        np.testing.assert_allclose(row["advantages"], want[k], rtol=RTOL, atol=1e-6, err_msg=str(k))


def _with_behaviour(rows: list[dict], seed: int, sd: float, calm: float | None = None) -> list[dict]:
    """Behaviour log-probs off by N(0, sd) (with `calm`: on 30% of the rows, by N(0, calm) on the
    others), except on each row's first token."""
    rng = random.Random(seed)
    for r in rows:
        sd_row = sd if calm is None or rng.random() < 0.3 else calm
        r["logprobs_original"] = [min(0.0, float(f"{lp + (rng.gauss(0, sd_row) if k else 0.0):.6g}")) for k, lp in enumerate(r["logprobs"])]  # log-probs: <= 0
    return rows


@pytest.mark.slow
@pytest.mark.parametrize(
    "strategy,correction,verl_cfg",
    [
        # token IS and token-level rejection: no row is emptied, so every row keeps its place in its group
        ("optimal_token_baseline", {"rollout_is": "token", "rollout_rs": "token_k1", "rollout_rs_threshold": "0.7_1.4"},
         dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="token_k1", rollout_rs_threshold="0.7_1.4")),
        # verl's geometric sequence rejection: emptied rows leave the TIR groups, in verl as here
        ("tir_optimal_token_baseline", "decoupled_geo_rs_token_tis",
         dict(rollout_is="token", rollout_is_threshold=2.0, rollout_rs="seq_mean_k1", rollout_rs_threshold="0.999_1.001")),
    ],
)
def test_token_baseline_after_rollout_correction_equals_verl(tmp_path, rescore, ref, strategy, correction, verl_cfg):
    """verl's trainer runs its rollout correction (rollout_corr_helper) before the advantage: the
    baseline reads the corrected response_mask and the rollout_is_weights."""
    import refs_offpolicy

    try:
        helper = refs_offpolicy.verl()
    except RefsUnavailable as e:
        pytest.skip(str(e))
    rows = _with_behaviour(_rows(6), 6, 0.05, 0.0002) if strategy.startswith("tir") else _with_behaviour(_rows(6), 6, 0.3)
    if isinstance(correction, dict):
        stage, params = "rollout_correction", {f"rollout_correction.{k}": v for k, v in correction.items()}
    else:
        stage, params = correction, {}
    schema = SCHEMA.append(pa.field("logprobs_original", pa.list_(pa.float32())))
    glob = write_parquet(rows, str(tmp_path / "in"), files=3, row_group_size=5, schema=schema)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in params.items()]
    doc, out = rescore(glob, "--strategy", f"{stage},{strategy}", *sets, "--keep-filtered", "--buckets", "3", "--shard-rows", "8")

    t = max(len(r["logprobs"]) for r in rows)
    pad = lambda xs: [float(v) for v in xs] + [0.0] * (t - len(xs))  # noqa: E731
    f32 = lambda key: torch.tensor([pad(r[key]) for r in rows], dtype=torch.float32).double()  # noqa: E731
    lp, bp = f32("logprobs"), f32("logprobs_original")
    mask = torch.tensor([pad(r["action_mask"]) for r in rows], dtype=torch.float64)
    weights, new_mask, _ = helper.compute_rollout_correction_and_rejection_mask(lp, bp, mask, **verl_cfg)
    new_mask = new_mask.double()
    emptied = (new_mask.sum(-1) == 0) & (mask.sum(-1) > 0)
    if strategy == "optimal_token_baseline":
        assert not emptied.any() and (new_mask != mask).any()  # tokens rejected, no row emptied
    else:
        assert 0 < int(emptied.sum()) < len(rows) // 2
    rewards = torch.zeros(len(rows), t, dtype=torch.float64)
    for i, r in enumerate(rows):
        if r["logprobs"]:
            rewards[i, len(r["logprobs"]) - 1] = r["reward"]
    index = np.array([f"{r['batch']}/{r['task']}" for r in rows], dtype=object)
    fn = ref.verl.compute_multi_turn_optimal_token_baseline_advantage if strategy.startswith("tir") else ref.verl.compute_optimal_token_baseline_advantage
    adv, _ = fn(rewards, new_mask, index, lp, f32("sum_pi_squared"), rollout_is_weights=weights.batch["rollout_is_weights"])
    scored = by_id(read_output(out, "scored"))
    want = {(r["batch"], r["task"], r["run"], 0): i for i, r in enumerate(rows) if not bool(emptied[i])}
    assert set(scored) == set(want)
    for key, row in scored.items():
        i, n = want[key], len(rows[want[key]]["logprobs"])
        assert [int(v) for v in row["action_mask"]] == [int(v) for v in new_mask[i, :n].tolist()]
        np.testing.assert_allclose(row["advantages"], adv[i, :n].numpy(), rtol=RTOL, atol=1e-6, err_msg=str(key))


def test_token_baseline_refuses_two_sources_of_weights(tmp_path):
    from rescore.transforms.strategies import ConfigError, chain_of

    with pytest.raises(ConfigError, match="rollout_is_weights=true reads an is_weights column"):
        chain_of("decoupled_token_is,optimal_token_baseline", {"rollout_is_weights": True})
    assert "is_weights" in chain_of("optimal_token_baseline", {"rollout_is_weights": True}).needs


@pytest.mark.slow
def test_missing_statistics_and_two_weight_sources_are_one_line_errors(tmp_path):
    """Exit 2 with one `rescore: error:` line, before any work: an input without sum_pi_squared
    (the message says how to get it), and is_weights asked for beside a correction stage."""
    import subprocess
    import sys

    rows = _rows(1)
    for r in rows:
        del r["sum_pi_squared"]
    glob = write_parquet(rows, str(tmp_path / "in"), files=1, row_group_size=50, schema=SCHEMA_INT_TASK)
    cases = [
        (["--strategy", "optimal_token_baseline"], "missing column 'sum_pi_squared', which the chosen strategy needs"),
        (["--strategy", "decoupled_token_is,tir_optimal_token_baseline", "--set", "rollout_is_weights=true"],
         "rollout_is_weights=true reads an is_weights column, but decoupled_token_is"),
    ]
    for i, (args, message) in enumerate(cases):
        proc = subprocess.run(
            [sys.executable, "-m", "rescore", "--input", glob, "--output", str(tmp_path / f"out{i}"), *args],
            capture_output=True, text=True, timeout=300,
        )
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("rescore: error:"), proc.stderr
        assert message in lines[0], lines[0]
        if i == 0:
            assert "--sum-pi-squared" in lines[0]
        assert not (tmp_path / f"out{i}" / "_SUCCESS").exists()
