"""rollout_correction through the whole job: presets over logged (logprobs_original) and
refreshed (logprobs) log-probs; the written is_weights, action_mask (action_mask_original the
input's), the filtered rows and the advantages against verl's, TRL's and SkyRL's own functions
and the GRPO reference over the rows left."""

from __future__ import annotations

import json
import math
import random

import pyarrow as pa
import pytest
import reference
import refs_offpolicy
import torch
from data import SCHEMA_INT_TASK, by_id, random_rows, read_output, write_parquet
from refs import RefsUnavailable

SCHEMA = SCHEMA_INT_TASK.append(pa.field("logprobs_original", pa.list_(pa.float32())))


def _rows(seed: int, wild: float = 0.3) -> list[dict]:
    rows = random_rows(seed, batches=2, max_tasks=6)
    rng = random.Random(seed)
    for r in rows:
        sd = wild if rng.random() < 0.4 else 0.0005
        r["logprobs_original"] = [min(0.0, float(f"{lp + rng.gauss(0, sd):.6g}")) for lp in r["logprobs"]]  # log-probs: <= 0
    return rows


def _padded(rows: list[dict]):
    """(logprobs, behaviour, mask) (B, T) float64 as the job reads them (float32 values)."""
    t = max([len(r["logprobs"]) for r in rows] + [1])

    def pad(values):
        return [float(v) for v in values] + [0.0] * (t - len(values))

    f32 = lambda xs: torch.tensor([pad(x) for x in xs], dtype=torch.float32).double()  # noqa: E731
    mask = torch.tensor([pad(r["action_mask"]) for r in rows], dtype=torch.float64)
    return f32([r["logprobs"] for r in rows]), f32([r["logprobs_original"] for r in rows]), mask


def _key(r):
    return (r["batch"], r["task"], r["run"], r.get("step", 0))


def _check(rows, out, weights, new_mask, opsm=None):
    """The job's output against reference weights and mask (B, T), GRPO over the rows left."""
    had = [sum(r["action_mask"]) > 0 for r in rows]
    left = new_mask.sum(-1) > 0
    dropped = {_key(r) for i, r in enumerate(rows) if had[i] and not bool(left[i])}
    filtered = by_id(read_output(out, "filtered"))
    assert set(filtered) == dropped
    assert all(f["filter_reason"].startswith(("decoupled", "trl", "skyrl", "rollout")) for f in filtered.values())
    kept_rows = [r for r in rows if _key(r) not in dropped]
    expected = reference.rescore_plan(kept_rows, ["grpo"], {})["scored"]
    scored = by_id(read_output(out, "scored"))
    assert set(scored) == set(expected)
    index = {_key(r): i for i, r in enumerate(rows)}
    for key, row in scored.items():
        i, n = index[key], len(row["action_mask"])
        assert row["action_mask_original"] == rows[i]["action_mask"]
        mask_i = new_mask[i, :n]
        score = expected[key][0]
        if opsm is not None and score < 0 and not opsm(i):
            mask_i = torch.zeros_like(mask_i)
        assert [int(v) for v in row["action_mask"]] == [int(v) for v in mask_i.tolist()], key
        torch.testing.assert_close(torch.tensor(row["is_weights"], dtype=torch.float64), weights[i, :n].float().double(), rtol=1e-5, atol=1e-7)
        assert math.isclose(row["score"], score, rel_tol=1e-5, abs_tol=1e-6)
        assert row["advantages"] == pytest.approx([score * m for m in mask_i.tolist()], rel=1e-5, abs=1e-6)


def _run(tmp_path, rescore, rows, strategy, params=None):
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=8, schema=SCHEMA)
    sets = [f"--set={k}={json.dumps(v)}" for k, v in (params or {}).items()]
    doc, out = rescore(glob, "--strategy", strategy, *sets, "--keep-filtered", "--buckets", "3", "--shard-rows", "16")
    return doc, out


def _ref(loader):
    try:
        return loader()
    except RefsUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["decoupled_geo_rs_token_tis", "decoupled_seq_is_rs"])
def test_verl_presets_through_the_job(tmp_path, rescore, preset):
    verl = _ref(refs_offpolicy.verl)
    rows = _rows(11)
    doc, out = _run(tmp_path, rescore, rows, f"{preset},grpo")
    lp, bp, mask = _padded(rows)
    cfg = {
        "decoupled_geo_rs_token_tis": ("token", 2.0, "seq_mean_k1", "0.999_1.001"),
        "decoupled_seq_is_rs": ("sequence", 2.0, "seq_sum_k1", "0.5_2.0"),
    }[preset]
    weights, new_mask, _ = verl.compute_rollout_correction_and_rejection_mask(
        lp, bp, mask, rollout_is=cfg[0], rollout_is_threshold=cfg[1], rollout_rs=cfg[2], rollout_rs_threshold=cfg[3]
    )
    assert 0 < int(((new_mask.sum(-1) == 0) & (mask.sum(-1) > 0)).sum()) < len(rows)  # some rows dropped, not all
    _check(rows, out, weights.batch["rollout_is_weights"] * mask, new_mask.double())
    assert doc["totals"]["rows_filtered"] == len({_key(r) for r in read_output(out, "filtered").to_pylist()})
    # verl's off-policy diagnostics of each batch (over all its rows, before any rejection)
    for entry in doc["batches"]:
        members = [r for r in rows if r["batch"] == entry["batch"]]
        want = verl.compute_offpolicy_metrics(*_padded(members))
        got = entry["rollout_correction"]
        is_keys = ("rollout_is_eff_sample_size", "rollout_is_mean", "rollout_is_std", "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low")
        assert set(got) == set(want) | set(is_keys)
        for name, value in want.items():
            assert math.isclose(got[name], value, rel_tol=1e-5, abs_tol=1e-7), name
        _, is_metrics = verl.compute_rollout_correction_weights(
            *(lambda lp, bp, m: (lp - bp, m))(*_padded(members)), rollout_is=cfg[0], rollout_is_threshold=cfg[1]
        )
        for name in is_keys:
            assert math.isclose(got[name], is_metrics[name], rel_tol=1e-5, abs_tol=1e-7), (name, entry["batch"])
    # the fractions beyond the bounds are exercised, not all zero
    assert any(e["rollout_correction"]["rollout_is_ratio_fraction_high"] > 0 for e in doc["batches"])
    total = verl.compute_offpolicy_metrics(*_padded(rows))
    assert all(math.isclose(doc["totals"]["rollout_correction"][k], v, rel_tol=1e-5, abs_tol=1e-7) for k, v in total.items())


@pytest.mark.slow
def test_trl_sequence_mask_with_opsm_through_the_job(tmp_path, rescore):
    trl = _ref(refs_offpolicy.trl)
    rows = _rows(12, wild=0.05)
    doc, out = _run(tmp_path, rescore, rows, "trl_sequence_mask,grpo", {"off_policy_mask_threshold": 0.001})
    lp, bp, mask = _padded(rows)
    owner = type("T", (), {"vllm_importance_sampling_mode": "sequence_mask", "vllm_importance_sampling_clip_min": None, "vllm_importance_sampling_clip_max": 3.0})()
    ratio = trl.importance_sampling_ratio(owner, lp, bp, mask).expand_as(lp) * mask
    neg = -torch.ones(len(rows), 1, dtype=torch.float64)
    keep_if_negative = trl.get_off_policy_mask(neg, lp, bp, mask, 0.001).squeeze(-1)
    assert 0 < int((keep_if_negative == 0).sum())
    _check(rows, out, ratio, mask.clone(), opsm=lambda i: bool(keep_if_negative[i]))


@pytest.mark.slow
def test_skyrl_geometric_mask_through_the_job(tmp_path, rescore):
    sky = _ref(refs_offpolicy.skyrl)
    rows = _rows(13, wild=0.02)
    doc, out = _run(tmp_path, rescore, rows, "skyrl_geometric_mask,grpo")
    lp, bp, mask = _padded(rows)
    _, _, loss_mask = sky.compute_off_policy_correction(lp, bp, mask, refs_offpolicy.skyrl_config(sequence_mask_metric="geometric"))
    _check(rows, out, mask.clone(), loss_mask.double())


@pytest.mark.slow
def test_every_row_rejected_publishes_an_empty_scored_set(tmp_path, rescore):
    rows = _rows(14, wild=1.0)
    for r in rows:
        r["logprobs_original"] = [lp - 1.0 for lp in r["logprobs"]]
    doc, out = _run(tmp_path, rescore, rows, "rollout_correction,grpo", {"rollout_rs": "token_k2", "rollout_rs_threshold": "0.1"})
    had = sum(1 for r in rows if sum(r["action_mask"]) > 0)
    assert doc["totals"]["rows_filtered"] == had
    scored = by_id(read_output(out, "scored"))
    assert all(sum(r["action_mask_original"]) == 0 for r in scored.values())


@pytest.mark.slow
@pytest.mark.parametrize("given", [None, 6])
def test_staleness_cap_drops_rows_behind_the_newest_or_a_given_version(tmp_path, rescore, given):
    rows = _rows(15)
    rng = random.Random(15)
    for r in rows:
        r["model_version"] = rng.randint(0, 5)
        r["logprobs_original"] = list(r["logprobs"])  # on-policy: only the staleness cap drops rows
    schema = SCHEMA.append(pa.field("model_version", pa.int64()))
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=8, schema=schema)
    params = {"max_staleness": 2, **({"current_model_version": given} if given is not None else {})}
    sets = [f"--set={k}={json.dumps(v)}" for k, v in params.items()]
    doc, out = rescore(glob, "--strategy", "rollout_correction,grpo", *sets, "--keep-filtered", "--buckets", "3")
    current = 5 if given is None else given
    stale = {_key(r) for r in rows if r["model_version"] < current - 2}
    filtered = by_id(read_output(out, "filtered"))
    assert set(filtered) == stale and stale
    assert all(f"more than max_staleness 2 behind {current}" in f["filter_reason"] for f in filtered.values())
    assert doc["params"]["rollout_correction"]["current_model_version"] == current
    expected = reference.rescore_plan([r for r in rows if _key(r) not in stale], ["grpo"], {})["scored"]
    scored = by_id(read_output(out, "scored"))
    assert set(scored) == set(expected)
    for key, row in scored.items():
        assert math.isclose(row["score"], expected[key][0], rel_tol=1e-5, abs_tol=1e-6)
        assert row["is_weights"] == [float(m) for m in row["action_mask"]]


@pytest.mark.slow
def test_audit_columns_give_the_sequence_log_ratio_and_the_mask(tmp_path, rescore):
    verl = _ref(refs_offpolicy.verl)
    rows = _rows(16)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=8, schema=SCHEMA)
    doc, out = rescore(glob, "--strategy", "rollout_correction,grpo", '--set=rollout_rs="token_k1"',
                       '--set=rollout_rs_threshold="0.8_1.25"', "--audit-columns", "--buckets", "3")
    lp, bp, mask = _padded(rows)
    new_mask, _ = verl.compute_rollout_rejection_mask(lp - bp, mask, rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25")
    index = {_key(r): i for i, r in enumerate(rows)}
    scored = by_id(read_output(out, "scored"))
    reasons = set()
    for key, row in scored.items():
        i = index[key]
        assert math.isclose(row["offpolicy_seq_log_ratio"], float(((lp[i] - bp[i]) * mask[i]).sum()), rel_tol=1e-9, abs_tol=1e-9)
        touched = bool((new_mask[i] < mask[i]).any())
        assert row["offpolicy_mask_reason"] == ("rollout_rs" if touched else None)
        reasons.add(row["offpolicy_mask_reason"])
    assert reasons == {"rollout_rs", None}


@pytest.mark.slow
def test_token_weighted_advantage_counts_only_the_tokens_left(tmp_path, rescore):
    """reinforce_plus_plus_baseline whitens over the batch weighted by action tokens: after a
    token-level rejection it weighs each row by the tokens left (verl rejects before the
    advantage), i.e. the reference over rows whose action_mask is the corrected one."""
    verl = _ref(refs_offpolicy.verl)
    rows = _rows(17)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=8, schema=SCHEMA)
    doc, out = rescore(glob, "--strategy", "rollout_correction,reinforce_plus_plus_baseline", '--set=rollout_rs="token_k1"',
                       '--set=rollout_rs_threshold="0.8_1.25"', "--buckets", "3")
    lp, bp, mask = _padded(rows)
    new_mask, _ = verl.compute_rollout_rejection_mask(lp - bp, mask, rollout_rs="token_k1", rollout_rs_threshold="0.8_1.25")
    corrected = []
    for i, r in enumerate(rows):
        m = [bool(v) for v in new_mask[i, : len(r["action_mask"])].tolist()]
        if sum(r["action_mask"]) > 0 and not any(m):
            continue  # filtered
        corrected.append({**r, "action_mask": m})
    assert sum(1 for i, r in enumerate(rows) if bool((new_mask[i] < mask[i]).any())) > 3
    expected = reference.rescore_plan(corrected, ["reinforce_plus_plus_baseline"], {})["scored"]
    scored = by_id(read_output(out, "scored"))
    assert set(scored) == set(expected)
    for key, row in scored.items():
        assert math.isclose(row["score"], expected[key][0], rel_tol=1e-5, abs_tol=1e-6), key
