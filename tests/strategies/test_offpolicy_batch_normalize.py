"""rollout_is_batch_normalize through the whole job against verl 0.9.1's own
compute_rollout_correction_and_rejection_mask with rollout_is_batch_normalize=True, called on
each batch: the written is_weights (scaled to batch mean 1 over the input's action tokens, or
over its rows at sequence level), the corrected masks and the advantages."""

from __future__ import annotations

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


def _rows(seed: int) -> list[dict]:
    rows = random_rows(seed, batches=2, max_tasks=6)
    rng = random.Random(seed)
    for r in rows:
        sd = 0.6 if rng.random() < 0.4 else 0.05
        r["logprobs_original"] = [min(0.0, float(f"{lp + rng.gauss(0, sd):.6g}")) for lp in r["logprobs"]]  # log-probs: <= 0
    return rows


def _padded(rows: list[dict]):
    t = max([len(r["logprobs"]) for r in rows] + [1])
    pad = lambda xs: [float(v) for v in xs] + [0.0] * (t - len(xs))  # noqa: E731
    f32 = lambda key: torch.tensor([pad(r[key]) for r in rows], dtype=torch.float32).double()  # noqa: E731
    return f32("logprobs"), f32("logprobs_original"), torch.tensor([pad(r["action_mask"]) for r in rows], dtype=torch.float64)


def _key(r):
    return (r["batch"], r["task"], r["run"], 0)


@pytest.mark.parametrize(
    "level,strategy,extra",
    [
        ("token", "decoupled_token_is", {}),
        pytest.param("sequence", "decoupled_seq_is_rs", {}, marks=pytest.mark.slow),
    ],
)
def test_batch_normalized_weights_equal_verl(tmp_path, rescore, level, strategy, extra):
    try:
        verl = refs_offpolicy.verl()
    except RefsUnavailable as e:
        pytest.skip(str(e))
    rows = _rows(21)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=8, schema=SCHEMA)
    doc, out = rescore(
        glob, "--strategy", f"{strategy},grpo", "--set", "rollout_is_batch_normalize=true", "--keep-filtered",
        "--buckets", "3", "--shard-rows", "16",
    )
    cfg = {"decoupled_token_is": dict(rollout_is="token", rollout_is_threshold=2.0),
           "decoupled_seq_is_rs": dict(rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="seq_sum_k1", rollout_rs_threshold="0.5_2.0")}[strategy]
    want, factors = {}, []
    for b in sorted({r["batch"] for r in rows}):
        members = [r for r in rows if r["batch"] == b]
        lp, bp, mask = _padded(members)
        weights, new_mask, metrics = verl.compute_rollout_correction_and_rejection_mask(lp, bp, mask, rollout_is_batch_normalize=True, **cfg)
        plain, _, _ = verl.compute_rollout_correction_and_rejection_mask(lp, bp, mask, **cfg)
        factors.append(metrics["rollout_corr/rollout_is_batch_norm_factor"])
        w = weights.batch["rollout_is_weights"] * mask
        assert not torch.allclose(w, plain.batch["rollout_is_weights"] * mask)  # the normalisation changes them
        for i, r in enumerate(members):
            want[_key(r)] = (w[i, : len(r["logprobs"])], new_mask[i, : len(r["logprobs"])].double())
    assert all(abs(f - 1.0) > 1e-3 for f in factors)
    scored = by_id(read_output(out, "scored"))
    filtered = by_id(read_output(out, "filtered"))
    emptied = {k for k, (_, m) in want.items() if m.sum() == 0 and sum(next(r for r in rows if _key(r) == k)["action_mask"]) > 0}
    assert set(filtered) == emptied and set(scored) == set(want) - emptied
    expected = reference.rescore_plan([r for r in rows if _key(r) not in emptied], ["grpo"], {})["scored"]
    for key, row in scored.items():
        w, m = want[key]
        torch.testing.assert_close(torch.tensor(row["is_weights"], dtype=torch.float64), w.float().double(), rtol=1e-5, atol=1e-7)
        assert [int(v) for v in row["action_mask"]] == [int(v) for v in m.tolist()]
        assert math.isclose(row["score"], expected[key][0], rel_tol=1e-5, abs_tol=1e-6)


def test_batch_normalize_needs_verl_weights():
    from rescore.transforms.strategies import ConfigError, chain_of

    with pytest.raises(ConfigError, match="rollout_is_batch_normalize scales verl's rollout_is weights; set rollout_is"):
        chain_of("trl_token_mask,grpo", {"rollout_is_batch_normalize": True})
    assert chain_of("decoupled_token_is,grpo", {"rollout_is_batch_normalize": True}).batch_level
    assert not chain_of("decoupled_token_is,grpo").batch_level
