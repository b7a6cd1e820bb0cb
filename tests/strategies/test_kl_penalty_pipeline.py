"""kl_penalty (KL in the reward) through the whole job against verl 0.9.1's own `kl_penalty`
(core_algos) and `apply_kl_penalty` (ray_trainer.py, run from the wheel's source with a fixed
KL controller), followed by verl's `compute_grpo_outcome_advantage`, which sums the token
rewards: the written reward, reward_original and advantages, per KL estimator (with verl's
clamps for low_var_kl); plus the one-line errors."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pyarrow as pa
import pytest
import refs
import torch
from data import SCHEMA_INT_TASK, by_id, random_rows, read_output, write_parquet
from refs import RefsUnavailable

SCHEMA = SCHEMA_INT_TASK.append(pa.field("ref_logprobs", pa.list_(pa.float32())))


@pytest.fixture(scope="module")
def verl():
    try:
        ref = refs.load()
        path = os.path.join(refs._unpacked(), "verl", "trainer", "ppo", "ray_trainer.py")
        ns = refs._extract(
            path, {"apply_kl_penalty"},
            {"__name__": "_ref_verl_ray_trainer", "core_algos": ref.verl, "masked_mean": ref.verl.verl_F.masked_mean,
             "DataProto": refs.DataProto, "torch": torch},
        )
    except RefsUnavailable as e:
        pytest.skip(str(e))
    return ref.verl, ns["apply_kl_penalty"]


class _Batch(dict):
    """verl's TensorDict as apply_kl_penalty reads it (a dict with batch_size)."""

    @property
    def batch_size(self):
        return (len(self["response_mask"]),)


def _rows(seed: int) -> list[dict]:
    rows = random_rows(seed, batches=2, max_tasks=6)
    rng = random.Random(seed)
    for r in rows:
        # ratios up to e^+-25 on some tokens: low_var_kl's clamps are reached
        # (log-probabilities, so never above 0: a row holding one is rejected, bad_logprobs)
        r["ref_logprobs"] = [min(0.0, float(f"{lp + (rng.choice([-25.0, 25.0]) if rng.random() < 0.05 else rng.gauss(0, 0.5)):.6g}")) for lp in r["logprobs"]]
    return rows


@pytest.mark.parametrize("kind", ["kl", pytest.param("abs", marks=pytest.mark.slow), pytest.param("mse", marks=pytest.mark.slow), "low_var_kl"])
def test_kl_in_reward_equals_verl(tmp_path, rescore, verl, kind):
    core, apply_kl_penalty = verl
    rows = _rows(31)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=8, schema=SCHEMA)
    beta = 0.05
    doc, out = rescore(glob, "--strategy", "kl_penalty,grpo", f"--set=kl_penalty={json.dumps(kind)}", f"--set=kl_coef={beta}",
                       "--buckets", "3", "--shard-rows", "16")
    t = max(len(r["logprobs"]) for r in rows)
    pad = lambda xs: [float(v) for v in xs] + [0.0] * (t - len(xs))  # noqa: E731
    f32 = lambda key: torch.tensor([pad(r[key]) for r in rows], dtype=torch.float32).double()  # noqa: E731
    mask = torch.tensor([pad(r["action_mask"]) for r in rows], dtype=torch.float64)
    scores = torch.zeros(len(rows), t, dtype=torch.float64)
    for i, r in enumerate(rows):
        scores[i, max(len(r["logprobs"]) - 1, 0)] = r["reward"]  # a row without tokens keeps its reward
    data = refs.DataProto(_Batch(response_mask=mask, token_level_scores=scores, old_log_probs=f32("logprobs"), ref_log_prob=f32("ref_logprobs")))
    data, metrics = apply_kl_penalty(data, core.FixedKLController(beta), kl_penalty=kind)
    assert metrics["actor/reward_kl_penalty_coeff"] == beta
    token_rewards = data.batch["token_level_rewards"]
    index = np.array([f"{r['batch']}/{r['task']}" for r in rows], dtype=object)
    adv, _ = core.compute_grpo_outcome_advantage(token_rewards, mask, index)
    kld = core.kl_penalty(f32("logprobs"), f32("ref_logprobs"), kind) * mask
    if kind == "low_var_kl":
        assert float(kld.max()) == 10.0  # the clamp is reached
    scored = by_id(read_output(out, "scored"))
    assert len(scored) == len(rows)
    for i, r in enumerate(rows):
        row = scored[(r["batch"], r["task"], r["run"], 0)]
        n = len(r["logprobs"])
        assert row["reward_original"] == r["reward"]
        np.testing.assert_allclose(row["reward"], float(token_rewards[i].sum()), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(row["advantages"], adv[i, :n].numpy(), rtol=1e-5, atol=1e-6)
    assert any(abs(scored[k]["reward"] - scored[k]["reward_original"]) > 1e-3 for k in scored)


@pytest.mark.parametrize("kind,gamma", [("kl", 1.0), pytest.param("low_var_kl", 0.9, marks=pytest.mark.slow)])
def test_kl_in_reward_before_reinforce_plus_plus_equals_verl(tmp_path, rescore, verl, kind, gamma):
    """verl puts -kl_coef * kl_t on each token's reward and reinforce_plus_plus discounts the
    token rewards over action tokens, then whitens over the batch's action tokens."""
    import types

    core, apply_kl_penalty = verl
    rows = _rows(32)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=8, schema=SCHEMA)
    beta = 0.05
    doc, out = rescore(glob, "--strategy", "kl_penalty,reinforce_plus_plus", f"--set=kl_penalty={json.dumps(kind)}",
                       f"--set=kl_coef={beta}", f"--set=gamma={gamma}", "--buckets", "3", "--shard-rows", "16")
    scored = by_id(read_output(out, "scored"))
    assert len(scored) == len(rows)
    checked = 0
    for b in sorted({r["batch"] for r in rows}):
        members = [r for r in rows if r["batch"] == b]
        t = max(max(len(r["logprobs"]) for r in members), 1)
        pad = lambda xs: [float(v) for v in xs] + [0.0] * (t - len(xs))  # noqa: E731
        f32 = lambda key: torch.tensor([pad(r[key]) for r in members], dtype=torch.float32).double()  # noqa: E731
        mask = torch.tensor([pad(r["action_mask"]) for r in members], dtype=torch.float64)
        scores = torch.zeros(len(members), t, dtype=torch.float64)
        for i, r in enumerate(members):
            scores[i, max(len(r["logprobs"]) - 1, 0)] = r["reward"]
        data = refs.DataProto(_Batch(response_mask=mask, token_level_scores=scores, old_log_probs=f32("logprobs"), ref_log_prob=f32("ref_logprobs")))
        data, _ = apply_kl_penalty(data, core.FixedKLController(beta), kl_penalty=kind)
        adv, _ = core.compute_reinforce_plus_plus_outcome_advantage(data.batch["token_level_rewards"], mask, config=types.SimpleNamespace(gamma=gamma))
        for i, r in enumerate(members):
            row = scored[(r["batch"], r["task"], r["run"], 0)]
            n = len(r["logprobs"])
            np.testing.assert_allclose(row["reward"], float(data.batch["token_level_rewards"][i].sum()), rtol=1e-9, atol=1e-12)
            np.testing.assert_allclose(row["advantages"], adv[i, :n].numpy(), rtol=1e-5, atol=1e-5, err_msg=str(r))
            checked += n
    assert checked > 30


def test_kl_penalty_one_line_errors(tmp_path):
    from rescore.transforms.strategies import ConfigError, chain_of

    with pytest.raises(ConfigError, match="kl_penalty before reinforceplusplus: of the token-level estimators only verl's"):
        chain_of("kl_penalty,reinforceplusplus")
    with pytest.raises(ConfigError, match="not with a filter that rewrites or zeroes the action mask"):
        chain_of("kl_penalty,decoupled_token_is,reinforce_plus_plus")
    with pytest.raises(ConfigError, match="kl_penalty: parameter 'kl_penalty' must be one of"):
        chain_of("kl_penalty,grpo", {"kl_penalty": "k4"})
    with pytest.raises(ConfigError, match="ending in 'ref_logprobs'"):
        chain_of("kl_penalty,grpo", {"ref_logprobs": "logprobs"})


def test_misaligned_reference_logprobs_are_rejected(tmp_path, rescore):
    rows = _rows(4)
    victim = next(r for r in rows if len(r["logprobs"]) > 2)
    victim["ref_logprobs"] = victim["ref_logprobs"][:-1]
    glob = write_parquet(rows, str(tmp_path / "in"), files=1, row_group_size=50, schema=SCHEMA)
    doc, out = rescore(glob, "--strategy", "kl_penalty,grpo")
    rejected = by_id(read_output(out, "rejected"))
    key = (victim["batch"], victim["task"], victim["run"], 0)
    assert list(rejected) == [key]
    assert rejected[key]["reject_reason"].startswith("length_mismatch:") and "ref_logprobs" in rejected[key]["reject_reason"]
