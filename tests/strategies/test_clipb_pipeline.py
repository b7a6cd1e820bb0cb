"""clipb through the whole job against Trinity-RFT 0.6.0's own ClipBAdvantageFn, called on each
batch (Trinity's batch is the rows of one `batch` value): the written advantages, the clipped
action_mask (the input's kept as action_mask_original), for several mu."""

from __future__ import annotations

import json
import random

import numpy as np
import pyarrow as pa
import pytest
import torch
from data import SCHEMA_INT_TASK, by_id, read_output, write_parquet
from refs import ref  # noqa: F401  (the fixture)

SCHEMA = SCHEMA_INT_TASK.append(pa.field("entropy", pa.list_(pa.float32())))


def _rows(seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for batch in range(2):
        for t in range(rng.randint(4, 7)):
            n = rng.choice([1, 2, 3, 5])
            for run in rng.sample(range(50), n):
                length = rng.randint(0, 20)
                logprobs, entropy = [], []
                for _ in range(length):
                    logits = [rng.gauss(0, 2.5) for _ in range(6)]
                    z = sum(np.exp(logits))
                    p = [float(np.exp(v) / z) for v in logits]
                    logprobs.append(float(np.log(p[rng.randrange(6)])))
                    entropy.append(-sum(v * np.log(v) for v in p))
                rows.append(
                    {
                        "batch": batch, "task": t * 7 + 3, "run": run, "step": 0,
                        "reward": rng.choice([0.0, 1.0, rng.uniform(-2, 3)]),
                        "tokens": [rng.randint(0, 1000) for _ in range(2 + length)], "prompt_length": 2,
                        "logprobs": logprobs, "action_mask": [rng.random() > 0.2 for _ in range(length)],
                        "note": f"r{batch}-{t}-{run}", "entropy": entropy,
                    }
                )
    rng.shuffle(rows)
    return rows


def _trinity(ref, rows: list[dict], mu: float) -> dict:
    """Trinity's (advantages, response_mask) per row id, each batch in one call."""
    out = {}
    for b in sorted({r["batch"] for r in rows}):
        members = [r for r in rows if r["batch"] == b]
        t = max(max(len(r["logprobs"]) for r in members), 1)
        pad = lambda xs: [float(v) for v in xs] + [0.0] * (t - len(xs))  # noqa: E731
        rewards = torch.zeros(len(members), t)
        for i, r in enumerate(members):
            rewards[i, t - 1] = r["reward"]  # Trinity sums the token rewards
        exps = ref.DataProto(
            {
                "token_level_rewards": rewards,
                "response_mask": torch.tensor([pad(r["action_mask"]) for r in members], dtype=torch.float32),
                "rollout_log_probs": torch.tensor([pad(r["logprobs"]) for r in members], dtype=torch.float32),
                "entropys": torch.tensor([pad(r["entropy"]) for r in members], dtype=torch.float32),
            },
            {"uid": np.array([str(r["task"]) for r in members], dtype=object)},
        )
        done, _ = ref.trinity.ClipBAdvantageFn(mu=mu)(exps)
        for i, r in enumerate(members):
            n = len(r["logprobs"])
            out[(r["batch"], r["task"], r["run"], 0)] = (
                done.batch["advantages"][i, :n].double().numpy(), done.batch["response_mask"][i, :n].numpy(),
            )
    return out


@pytest.mark.parametrize("mu", [1.0, pytest.param(0.3, marks=pytest.mark.slow)])
def test_clipb_through_the_job_equals_trinity(tmp_path, rescore, ref, mu):
    rows = _rows(3)
    glob = write_parquet(rows, str(tmp_path / "in"), files=3, row_group_size=5, schema=SCHEMA)
    doc, out = rescore(glob, "--strategy", "clipb", f"--set=mu={json.dumps(mu)}", "--buckets", "3", "--shard-rows", "8")
    want = _trinity(ref, rows, mu)
    scored = by_id(read_output(out, "scored"))
    assert set(scored) == set(want)
    clipped = 0
    for key, row in scored.items():
        adv, mask = want[key]
        source = next(r for r in rows if (r["batch"], r["task"], r["run"], 0) == key)
        assert row["action_mask_original"] == source["action_mask"]
        assert [int(v) for v in row["action_mask"]] == [int(v) for v in mask], key
        np.testing.assert_allclose(row["advantages"], adv * mask, rtol=1e-5, atol=1e-6, err_msg=str(key))
        clipped += int(sum(source["action_mask"]) - sum(row["action_mask"]))
    assert clipped > 0  # tokens were clipped: the comparison is not over unchanged masks
    # positive-advantage tokens are never clipped
    assert all(all(m == o for m, o in zip(row["action_mask"], row["action_mask_original"])) for row in scored.values() if row["score"] > 0)
