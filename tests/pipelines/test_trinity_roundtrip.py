"""Round trip through the real trinity-rft 0.6.0 code: Trinity writes the explorer's buffer with
its own serialisation and SQL storage, Rescore scores it into a new buffer, Trinity's own SQL
reader (the trainer's path, SQLExperienceStorage.read) loads that; ids, tensors and advantages
are compared with the experiences Trinity wrote and an independent GRPO/RLOO computation.

Needs `pip install --no-deps trinity-rft==0.6.0` (see tests/trinity_real.py); skipped with the
reason where it is not installed.
"""

import numpy as np
import pytest
import torch

import trinity_real
from conftest import RUNNER

trinity = trinity_real.load()
pytestmark = pytest.mark.skipif(trinity is None, reason=trinity_real.why or "trinity-rft not importable")


def make_experiences(seed=0, batches=2, tasks=4, runs=5):
    rng = np.random.default_rng(seed)
    exps = []
    for b in range(batches):
        for t in range(tasks):
            constant = t == 0  # one group whose rewards are all equal: advantages exactly 0
            for r in range(runs):
                prompt, response = int(rng.integers(2, 6)), int(rng.integers(3, 9))
                kwargs = dict(
                    eid=trinity.EID(batch=b, task=t, run=r, step=0),
                    tokens=rng.integers(0, 30000, prompt + response).tolist(),
                    prompt_length=prompt,
                    logprobs=(-rng.exponential(0.5, response)).astype(np.float32).tolist(),
                    reward=1.0 if constant else float(rng.integers(0, 2) + 0.5 * rng.random()),
                    info={"model_version": b, "difficulty": np.float64(rng.random()), "source": "math"},
                    metrics={"len": float(response)},
                    response_text=f"answer {b}/{t}/{r}",
                    prompt_text=f"question {t}",
                )
                if r % 2:  # multi-turn style: an explicit mask with environment tokens
                    mask = rng.random(response) > 0.3
                    mask[0] = True
                    kwargs["action_mask"] = mask.tolist()
                    kwargs["messages"] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
                exps.append(trinity.Experience(**kwargs))
    return exps


def reference(exps, strategy, eps=1e-6):
    """score per (batch, task, run): GRPO (unbiased std; all-equal groups 0) or RLOO."""
    groups = {}
    for e in exps:
        groups.setdefault((e.eid.batch, str(e.eid.task)), []).append(float(e.reward))
    out = {}
    for e in exps:
        g = np.array(groups[(e.eid.batch, str(e.eid.task))])
        r = float(e.reward)
        if strategy == "grpo":
            std = 0.0 if np.all(g == g[0]) else g.std(ddof=1)
            score = (r - g.mean()) / (std + eps)
        else:  # rloo: r_i - mean of the others
            score = r - (g.sum() - r) / (len(g) - 1)
        out[(e.eid.batch, str(e.eid.task), e.eid.run)] = score
    return out


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["grpo", "rloo"])
def test_trinity_writes_rescore_rescores_trinity_reads(tmp_path, strategy):
    from rescore.pipelines.cli import run

    exps = make_experiences()
    src, dst = f"sqlite:///{tmp_path}/explorer.db", f"sqlite:///{tmp_path}/trainer.db"
    trinity.write(src, "explorer_buffer", exps)
    doc = run(["--input", src, "--input-table", "explorer_buffer", "--output", str(tmp_path / "out"),
               "--strategy", strategy, "--output-db", dst, "--output-table", "rescored", "--shard-rows", "7",
               "--quiet", RUNNER])
    assert doc["totals"]["rows_read"] == len(exps) == doc["buffer"]["rows"]

    back = trinity.read(dst, "rescored", len(exps))  # what the trainer gets
    assert len(back) == len(exps)
    written = {e.eid.suffix: e for e in exps}
    assert {e.eid.suffix for e in back} == set(written)
    expected = reference(exps, strategy)
    for e in back:
        src_e = written[e.eid.suffix]
        assert (e.eid.batch, e.eid.task, e.eid.run, e.eid.step) == (src_e.eid.batch, str(src_e.eid.task), src_e.eid.run, 0)
        for name in ("tokens", "logprobs", "action_mask"):
            a, b = getattr(e, name), getattr(src_e, name)
            assert a.dtype == b.dtype and torch.equal(a, b), name
        assert e.prompt_length == src_e.prompt_length and e.reward == src_e.reward
        assert e.info["difficulty"] == src_e.info["difficulty"] and e.messages == src_e.messages
        assert e.response_text == src_e.response_text and e.metrics == src_e.metrics
        score = expected[(e.eid.batch, e.eid.task, e.eid.run)]
        want = torch.tensor(score, dtype=torch.float32) * src_e.action_mask.to(torch.float32)
        assert e.advantages.dtype == torch.float32 and e.advantages.shape == src_e.action_mask.shape
        torch.testing.assert_close(e.advantages, want, atol=2e-6, rtol=1e-6)
        assert torch.equal(e.returns, e.advantages)
    assert all(float(e.advantages.abs().max()) == 0.0 for e in back if e.eid.task == "0")


def test_rescore_blob_is_what_trinity_deserialises(tmp_path):
    """Bytes written by this package (sample buffer) load with Experience.deserialize."""
    from rescore.pipelines.sample import make_experience
    from rescore.pipelines.doors.trinity_sql import write_trinity_sqlite

    table = make_experience(batches=1, tasks=2, runs=3)
    write_trinity_sqlite(table, str(tmp_path / "s.db"), "experience")
    got = trinity.read(f"sqlite:///{tmp_path}/s.db", "experience", table.num_rows)
    rows = {(r["task"], r["run"]): r for r in table.to_pylist()}
    for e in got:
        row = rows[(int(e.eid.task), e.eid.run)]
        assert e.tokens.tolist() == row["tokens"] and e.prompt_length == row["prompt_length"]
        assert e.action_mask.tolist() == row["action_mask"] and e.reward == row["reward"]
        np.testing.assert_array_equal(e.logprobs.numpy(), np.asarray(row["logprobs"], np.float32))


@pytest.mark.slow
def test_unset_batch_and_string_tasks_group_as_trinity_does(tmp_path):
    """EID() leaves batch "" (one batch for all such rows, as Trinity's tid '/task' groups them)."""
    from rescore.pipelines.cli import run

    rewards = {"alpha": [1.0, 0.0, 0.0], "beta": [0.5, 0.25]}
    exps = [trinity.Experience(eid=trinity.EID(task=t, run=r), tokens=[1, 2, 3, 4], prompt_length=2,
                               logprobs=[-0.5, -0.25], reward=x)
            for t, xs in rewards.items() for r, x in enumerate(xs)]
    src, dst = f"sqlite:///{tmp_path}/e.db", f"sqlite:///{tmp_path}/t.db"
    trinity.write(src, "unset_in", exps)
    run(["--input", src, "--input-table", "unset_in", "--output", str(tmp_path / "o"), "--strategy", "grpo",
         "--output-db", dst, "--output-table", "unset_out", "--quiet", RUNNER])
    back = trinity.read(dst, "unset_out", len(exps))
    for e in back:
        g = np.array(rewards[e.eid.task])
        want = (e.reward - g.mean()) / (g.std(ddof=1) + 1e-6)
        torch.testing.assert_close(e.advantages, torch.full((2,), want, dtype=torch.float32), atol=2e-6, rtol=1e-6)
        assert e.eid.batch == ""  # the blob's eid comes back as Trinity wrote it
