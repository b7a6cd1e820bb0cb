"""--entropy, --sum-pi-squared (from --logprob-model's forward pass) and --ref-model
(ref_logprobs through the log-prob code path) against a direct transformers forward pass on tiny
random-weight models built here; and the whole chain --logprob-model + rollout_correction + grpo."""

import json
import os

import numpy as np
import pytest
import torch
from data import read_output

transformers = pytest.importorskip("transformers", reason="the model stage needs the [models] extra (transformers)")

from rescore.pipelines.sample_models import write_tiny_models  # noqa: E402
from rescore.transforms import inference  # noqa: E402

# The row helpers of the model-stage tests (same tiny vocabulary and context).
from test_models import CONTEXT, VOCAB, _key, _load, _rows, _write  # noqa: E402,F401


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return write_tiny_models(str(tmp_path_factory.mktemp("models")), vocab=VOCAB, context=CONTEXT, seed=5)


def _direct(model, tokens, prompt_length):
    """(logprobs, entropy, sum_pi_squared) of the response tokens from one unpadded pass."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens], dtype=torch.long)).logits[0].float()
    steps = range(prompt_length - 1, len(tokens) - 1)
    p = torch.softmax(logits, -1)
    logp = torch.log_softmax(logits, -1)
    lp = [logp[t, tokens[t + 1]].item() for t in steps]
    ent = [float(-(p[t] * logp[t]).sum()) for t in steps]
    s2 = [float((p[t] ** 2).sum()) for t in steps]
    return np.array(lp), np.array(ent), np.array(s2)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["teacher", "student"], ids=["llama", "gpt2"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_token_stats_equal_a_direct_forward_pass(models, which, side):
    model = _load("lm", models[which])
    rows = _rows(4, too_long=False, prompt_zero=False)[:20]
    got = inference.response_token_values(
        model, [np.array(r["tokens"]) for r in rows], [r["prompt_length"] for r in rows], side=side,
        stats=("entropy", "sum_pi_squared"),
    )
    seen = 0
    for r, values in zip(rows, got):
        lp, ent, s2 = _direct(model, r["tokens"], r["prompt_length"])
        assert all(values[k].dtype == np.float32 and len(values[k]) == len(lp) for k in ("logprobs", "entropy", "sum_pi_squared"))
        if len(lp):
            seen += 1
            np.testing.assert_allclose(values["logprobs"], lp, atol=1e-5, rtol=0)
            np.testing.assert_allclose(values["entropy"], ent, atol=1e-5, rtol=1e-5)
            np.testing.assert_allclose(values["sum_pi_squared"], s2, atol=1e-6, rtol=1e-5)
            assert (values["entropy"] > 0).all() and (values["entropy"] <= np.log(VOCAB) + 1e-4).all()
            assert ((values["sum_pi_squared"] >= 1.0 / VOCAB - 1e-6) & (values["sum_pi_squared"] <= 1.0)).all()
    assert seen > 5


@pytest.mark.slow
def test_logprob_model_token_stats_ref_model_and_correction_end_to_end(models, tmp_path, rescore):
    rows = _rows(6, too_long=False, prompt_zero=False)
    glob = _write(rows, str(tmp_path / "in"))
    doc, out = rescore(
        glob, "--strategy", "rollout_correction,grpo", f"--set=rollout_is={json.dumps('token')}",
        "--logprob-model", models["student"], "--entropy", "--sum-pi-squared", "--ref-model", models["teacher"],
    )
    scored = {_key(r): r for r in read_output(out, "scored").to_pylist()}
    assert len(scored) == len(rows)
    student, teacher = _load("lm", models["student"]), _load("lm", models["teacher"])
    for r in rows:
        got = scored[_key(r)]
        lp, ent, s2 = _direct(student, r["tokens"], r["prompt_length"])
        ref = _direct(teacher, r["tokens"], r["prompt_length"])[0]
        np.testing.assert_allclose(got["logprobs"], lp, atol=1e-5, rtol=0)
        np.testing.assert_allclose(got["entropy"], ent, atol=1e-5, rtol=1e-5)
        np.testing.assert_allclose(got["sum_pi_squared"], s2, atol=1e-6, rtol=1e-5)
        np.testing.assert_allclose(got["ref_logprobs"], ref, atol=1e-5, rtol=0)
        np.testing.assert_allclose(got["logprobs_original"], np.float32(r["logprobs"]), rtol=0, atol=0)
        # token TIS between the refreshed and the logged log-probs (verl's token weights)
        w = np.minimum(np.exp(np.clip(np.float32(got["logprobs"]).astype(np.float64) - np.float32(r["logprobs"]), -20, 20)), 2.0)
        np.testing.assert_allclose(got["is_weights"], w * np.array(r["action_mask"]), rtol=1e-5, atol=1e-6)
    assert doc["models"]["columns"] == ["logprobs", "entropy", "sum_pi_squared", "ref_logprobs"]


@pytest.mark.slow
def test_entropy_without_logprob_model_is_a_one_line_error(tmp_path, capsys):
    from rescore.pipelines.cli import main

    glob = _write(_rows(1, too_long=False, prompt_zero=False), str(tmp_path / "in"))
    assert main(["--input", glob, "--output", str(tmp_path / "out"), "--strategy", "grpo", "--entropy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rescore: error: --entropy comes from --logprob-model's forward pass: pass --logprob-model DIR too"]
    assert not os.path.exists(tmp_path / "out" / "_SUCCESS")


@pytest.mark.slow
def test_model_stage_benchmark_times_the_whole_chain():
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "benchmarks/model_stage.py", "--rows", "8", "--hidden", "32", "--layers", "1", "--vocab", "200",
         "--repeats", "1", "--chain", "decoupled_geo_rs,grpo"],
        cwd=root, capture_output=True, text=True, timeout=600, check=True,
    )
    chain = json.loads(proc.stdout.strip().splitlines()[-1])["chain"]
    assert chain["strategy"] == "decoupled_geo_rs,grpo" and chain["tokens_per_s"] > 0
    assert chain["rows_written"] + chain["rows_filtered"] == 8
