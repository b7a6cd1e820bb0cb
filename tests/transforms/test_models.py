"""The model stage (--teacher-model, --logprob-model, --reward-model, --reward-fn) against a
direct transformers forward pass over the same tokens, with tiny random-weight models built
here (nothing downloaded)."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from data import read_output
from reference import rescore as reference_rescore

transformers = pytest.importorskip("transformers", reason="the model stage needs the [models] extra (transformers)")

from rescore.pipelines.sample_models import write_tiny_models  # noqa: E402
from rescore.transforms import inference  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VOCAB, CONTEXT = 64, 32
RUNNER = "--runner=FnApiRunner"
SCHEMA = pa.schema(
    [
        ("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64()), ("reward", pa.float32()),
        ("tokens", pa.list_(pa.int32())), ("prompt_length", pa.int64()), ("logprobs", pa.list_(pa.float32())),
        ("action_mask", pa.list_(pa.int8())),
    ]
)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return write_tiny_models(str(tmp_path_factory.mktemp("models")), vocab=VOCAB, context=CONTEXT, seed=3)


def _rows(seed=0, *, too_long=True, prompt_zero=True):
    """Three batches x three tasks x four runs of random rows, plus the edge cases."""
    rng = np.random.default_rng(seed)
    rows = []
    for b in range(3):
        for t in range(3):
            for r in range(4):
                p, n = int(rng.integers(1, 8)), int(rng.integers(0, 12))
                mask = [int(x) for x in rng.integers(0, 2, n)] if r % 2 else [1] * n
                rows.append(dict(batch=b, task=t, run=r, reward=float(rng.integers(0, 2)), tokens=rng.integers(0, VOCAB, p + n).tolist(),
                                 prompt_length=p, logprobs=(-rng.exponential(1.0, n)).tolist(), action_mask=mask))
    # Edge cases: a prompt only (no response), a row longer than the context, no prompt.
    rows.append(dict(batch=0, task=9, run=0, reward=1.0, tokens=[5, 6, 7], prompt_length=3, logprobs=[], action_mask=[]))
    if too_long:
        rows.append(dict(batch=0, task=9, run=1, reward=0.0, tokens=list(range(CONTEXT + 3)), prompt_length=4,
                         logprobs=[-1.0] * (CONTEXT - 1), action_mask=[1] * (CONTEXT - 1)))
    if prompt_zero:
        rows.append(dict(batch=1, task=9, run=0, reward=0.0, tokens=[1, 2, 3], prompt_length=0, logprobs=[-1.0] * 3,
                         action_mask=[1, 1, 1]))
    return rows


def _write(rows, directory, files=2, row_group_size=8):
    os.makedirs(directory, exist_ok=True)
    per = -(-len(rows) // files)
    for i in range(files):
        pq.write_table(pa.Table.from_pylist(rows[i * per : (i + 1) * per], schema=SCHEMA),
                       os.path.join(directory, f"part-{i}.parquet"), row_group_size=row_group_size)
    return os.path.join(directory, "*.parquet")


def _direct_logprobs(model, tokens, prompt_length):
    """The reference: one unpadded forward pass of the row alone."""
    ids = torch.tensor([tokens], dtype=torch.long)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return np.array([logp[t - 1, tokens[t]].item() for t in range(prompt_length, len(tokens))], dtype=np.float64)


def _direct_reward(model, tokens):
    with torch.no_grad():
        return float(model(input_ids=torch.tensor([tokens], dtype=torch.long)).logits[0, 0])


def _load(kind, path):
    cls = transformers.AutoModelForSequenceClassification if kind == "reward" else transformers.AutoModelForCausalLM
    return cls.from_pretrained(path, dtype=torch.float32).eval()


def _key(r):
    return (r["batch"], r["task"], r["run"])


# --- the math, without Beam ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("which", ["teacher", "student"], ids=["llama", "gpt2"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_response_logprobs_equal_a_direct_forward_pass(models, which, side):
    model = _load("lm", models[which])
    rows = [r for r in _rows(1, too_long=False, prompt_zero=False)][:20]
    rows.append(dict(tokens=[], prompt_length=0))  # length 0: nothing to score
    got = inference.response_logprobs(model, [np.array(r["tokens"]) for r in rows], [r["prompt_length"] for r in rows],
                                      pad_id=0, side=side)
    assert any(len(r["tokens"]) - r["prompt_length"] == 0 for r in rows[:-1])
    for r, values in zip(rows, got):
        assert values.dtype == np.float32 and len(values) == len(r["tokens"]) - r["prompt_length"]
        if len(values):
            np.testing.assert_allclose(values, _direct_logprobs(model, r["tokens"], r["prompt_length"]), atol=1e-5, rtol=0)
            assert (values < 0).all()


@pytest.mark.slow
def test_padding_side_and_batch_company_do_not_change_a_row(models):
    model = _load("lm", models["teacher"])
    row = np.arange(3, 15)
    alone = inference.response_logprobs(model, [row], [4])[0]
    for side in ("left", "right"):
        with_long_neighbour = inference.response_logprobs(model, [np.arange(30), row], [2, 4], side=side)[1]
        np.testing.assert_allclose(with_long_neighbour, alone, atol=1e-5, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("pad_id", [0, None], ids=["batched", "no-pad-token"])
def test_reward_scores_equal_a_direct_forward_pass(models, pad_id):
    model = _load("reward", models["reward"])
    rows = [np.array(r["tokens"][: CONTEXT]) for r in _rows(2)[:15] if r["tokens"]]
    got = inference.reward_scores(model, rows, pad_id=pad_id)
    want = [_direct_reward(model, r.tolist()) for r in rows]
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert np.std(want) > 0  # the rows are told apart


@pytest.mark.slow
def test_reward_fn_signature_and_failures(tmp_path, monkeypatch):
    (tmp_path / "verifiers.py").write_text(
        "def by_tokens(response_tokens, reward):\n    return reward + len(response_tokens)\n"
        "def bad_arg(answer):\n    return 1.0\n"
        "def flaky(response_tokens):\n    if not response_tokens: raise ValueError('empty response')\n    return 'yes'\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = inference.load_reward_fn("verifiers:by_tokens")
    assert fn.args == ("response_tokens", "reward") and not fn.needs_text
    assert inference.call_reward_fn(fn, {"response_tokens": [1, 2], "reward": 0.5}) == (2.5, None)
    flaky = inference.load_reward_fn("verifiers:flaky")
    assert inference.call_reward_fn(flaky, {"response_tokens": []}) == (
        None, "model_reward: reward_fn verifiers:flaky raised ValueError: empty response")
    assert inference.call_reward_fn(flaky, {"response_tokens": [1]})[1] == "model_reward: reward_fn verifiers:flaky returned str, not a number"
    for spec, message in [("verifiers:bad_arg", "unknown parameter 'answer'"), ("verifiers", "expects module:function"),
                          ("no_such_module_xyz:f", "cannot import no_such_module_xyz"), ("verifiers:nope", "has no function 'nope'")]:
        with pytest.raises(inference.ModelConfigError, match=message):
            inference.load_reward_fn(spec)


# --- the pipeline, end to end ----------------------------------------------------------------


@pytest.mark.slow
def test_teacher_logprobs_and_on_policy_distill_end_to_end(models, tmp_path, rescore):
    rows = _rows(4)
    glob = _write(rows, str(tmp_path / "in"))
    doc, out = rescore(glob, "--strategy", "on_policy_distill", "--set", "kl_coef=0.5", "--teacher-model", models["teacher"],
                       "--model-batch-size", "5")
    teacher = _load("lm", models["teacher"])
    scored = {_key(r): r for r in read_output(out).to_pylist()}
    rejected = {_key(r): r for r in read_output(out, "rejected").to_pylist()}
    assert rejected[(0, 9, 1)]["reject_reason"] == f"model_context: {CONTEXT + 3} tokens, more than the model's context of {CONTEXT}"
    assert rejected[(1, 9, 0)]["reject_reason"].startswith("model_input: prompt_length 0")
    assert len(scored) == len(rows) - 2 and doc["totals"]["reject_reasons"] == {"model_context": 1, "model_input": 1}
    assert doc["models"]["teacher_model"] == models["teacher"] and doc["models"]["context"] == CONTEXT
    from rescore.pipelines.job import config_hash

    assert doc["config_hash"] != config_hash("on_policy_distill", {"kl_coef": 0.5}, None)  # the teacher is part of it
    for r in rows:
        if _key(r) in rejected:
            continue
        got = scored[_key(r)]
        want = _direct_logprobs(teacher, r["tokens"], r["prompt_length"])
        np.testing.assert_allclose(got["teacher_logprobs"], want, atol=1e-5, rtol=0)
        student = np.array(r["logprobs"], dtype=np.float32).astype(np.float64)
        advantages = 0.5 * (want - student) * np.array(r["action_mask"])
        np.testing.assert_allclose(got["advantages"], advantages, atol=2e-5, rtol=0)
        assert got["tokens"] == r["tokens"] and got["logprobs"] == pytest.approx(r["logprobs"])
    assert scored[(0, 9, 0)]["teacher_logprobs"] == [] and scored[(0, 9, 0)]["advantages"] == []


@pytest.mark.slow
def test_reward_model_replaces_reward_before_grouping(models, tmp_path, rescore):
    rows = _rows(5, too_long=False)
    glob = _write(rows, str(tmp_path / "in"), files=3)
    _, out = rescore(glob, "--strategy", "grpo", "--reward-model", models["reward"], "--model-batch-tokens", "40")
    rm = _load("reward", models["reward"])
    scored = {_key(r): r for r in read_output(out).to_pylist()}
    new_rows = [dict(r, reward=float(np.float32(_direct_reward(rm, r["tokens"])))) for r in rows]
    want = reference_rescore(new_rows, "grpo")["scored"]
    assert len(scored) == len(rows) == len(want)
    for r in new_rows:
        got = scored[_key(r)]
        assert got["reward"] == pytest.approx(r["reward"], abs=1e-5)
        assert got["reward_original"] == next(o["reward"] for o in rows if _key(o) == _key(r))
        assert got["score"] == pytest.approx(want[_key(r) + (0,)][0], abs=1e-4)
    assert pq.read_schema(sorted(p for p in (tmp_path / "out").iterdir() if p.name.startswith("scored-"))[0]).field("reward").type == pa.float32()


@pytest.mark.slow
def test_reward_fn_over_decoded_text_and_logprob_model(models, tmp_path, rescore, monkeypatch):
    (tmp_path / "my_verifier.py").write_text(
        "def count_w1(prompt, response, task):\n"
        "    if task == 2 and not response: raise ValueError('nothing to check')\n"
        "    return float(response.split().count('w1')) + (0.5 if prompt.startswith('w') else 0.0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = _rows(6, too_long=False, prompt_zero=False)
    glob = _write(rows, str(tmp_path / "in"))
    doc, out = rescore(glob, "--strategy", "grpo", "--reward-fn", "my_verifier:count_w1", "--tokenizer", models["tokenizer"],
                       "--logprob-model", models["student"], "--model-padding-side", "left")
    student = _load("lm", models["student"])
    scored = {_key(r): r for r in read_output(out).to_pylist()}
    rejected = {_key(r): r["reject_reason"] for r in (read_output(out, "rejected") or pa.table({})).to_pylist()}
    for r in rows:
        response = r["tokens"][r["prompt_length"]:]
        if r["task"] == 2 and not response:
            assert rejected[_key(r)] == "model_reward: reward_fn my_verifier:count_w1 raised ValueError: nothing to check"
            continue
        got = scored[_key(r)]
        assert got["reward"] == response.count(1) + 0.5 and got["reward_original"] == r["reward"]
        np.testing.assert_allclose(got["logprobs"], _direct_logprobs(student, r["tokens"], r["prompt_length"]), atol=1e-5)
        assert got["logprobs_original"] == pytest.approx(r["logprobs"])
    assert set(doc["totals"]["reject_reasons"]) <= {"model_reward"}


@pytest.mark.slow
def test_one_model_copy_shared_across_processes(models, tmp_path, rescore, monkeypatch):
    """The GPU path's sharing (Beam large_model: one copy per machine, called through a proxy
    from every SDK process), forced on the CPU: the same values as a direct forward pass."""
    from rescore.transforms import models as stage

    monkeypatch.setattr(stage._Handler, "share_model_across_processes", lambda self: True)
    rows = _rows(10, too_long=False, prompt_zero=False)[:12]
    loads = stage._Model.loads
    _, out = rescore(_write(rows, str(tmp_path / "in"), files=1), "--strategy", "on_policy_distill",
                     "--teacher-model", models["teacher"])
    # One copy, held by Beam's model server (hosted by the first process that asks; the others
    # connect to it), and every call went through its proxy.
    assert stage._Model.loads == loads + 1
    teacher = _load("lm", models["teacher"])
    scored = {_key(r): r for r in read_output(out).to_pylist()}
    for r in rows:
        np.testing.assert_allclose(scored[_key(r)]["teacher_logprobs"], _direct_logprobs(teacher, r["tokens"], r["prompt_length"]),
                                   atol=1e-5, rtol=0)


# --- failures: one line, the right exit status ------------------------------------------------


def _cli(*args, block_transformers=False):
    code = "import sys\n"
    if block_transformers:
        code += "sys.modules['transformers'] = None\n"
    code += "from rescore.pipelines.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    return subprocess.run([sys.executable, "-c", code, *args, RUNNER], cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_flags_fail_with_one_line(models, tmp_path, capsys):
    glob = _write(_rows(7), str(tmp_path / "in"))
    no_tokens = str(tmp_path / "plain" / "a.parquet")
    os.makedirs(os.path.dirname(no_tokens))
    pq.write_table(pa.table({"batch": [0], "task": [0], "run": [0], "reward": [1.0]}), no_tokens)
    out = str(tmp_path / "out")
    cases = [
        (["--teacher-model", models["teacher"]], True, "the model flags need the transformers package: pip install 'rescore[models]'"),
        (["--teacher-model", str(tmp_path / "missing")], False, f"--teacher-model {tmp_path / 'missing'}: not a Hugging Face model directory"),
        (["--reward-model", models["reward"], "--reward-fn", "x:y"], False, "pass --reward-model or --reward-fn, not both"),
        (["--reward-fn", "os.path:join"], False, "unknown parameter 'a'"),
        (["--model-batch-size", "0", "--teacher-model", models["teacher"]], False, "--model-batch-size must be a positive integer"),
    ]
    cases += [
        (["--reward-model", models["reward"], "--input", no_tokens], False, "no input file has a 'tokens' column"),
        # Without a model flag, on_policy_distill still asks for the column in the input.
        (["--set", "kl_coef=1"], False, "missing column 'teacher_logprobs'"),
    ]
    for i, (extra, block, message) in enumerate(cases):
        strategy = "grpo" if "--reward-model" in extra or "--reward-fn" in extra else "on_policy_distill"
        argv = ["--output", out, "--strategy", strategy, *extra]
        argv = argv if "--input" in extra else ["--input", glob, *argv]
        if i in (0, 1):  # the real process's stderr: nothing else printed before or after the line
            proc = _cli(*argv, block_transformers=block)
            code, err = proc.returncode, proc.stderr
        else:
            from rescore.pipelines.cli import main

            code = main([*argv, RUNNER])
            err = capsys.readouterr().err
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("rescore: error: ") and message in lines[0], err
    assert "--teacher-model DIR" in lines[0]
    assert not os.path.exists(out)


@pytest.mark.slow
def test_model_runs_print_one_line_or_nothing_on_the_real_stderr(models, tmp_path):
    """`python -m rescore` with --teacher-model: no transformers progress bar ("Loading weights")
    and no Beam "Resource module is not available" warning around the one error line, and
    nothing at all on a --quiet success (the warning still shows at --log-level INFO/DEBUG)."""

    def cli(*args):
        env = dict(os.environ, PYTHONPATH=ROOT)
        return subprocess.run([sys.executable, "-m", "rescore", *args, RUNNER], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=300)

    rows = _rows(8, too_long=False, prompt_zero=False)
    good = _write(rows, str(tmp_path / "good"))
    rows[0]["reward"] = float("nan")
    bad = _write(rows, str(tmp_path / "bad"))
    flags = ["--strategy", "on_policy_distill", "--teacher-model", models["teacher"]]
    proc = cli("--input", bad, "--output", str(tmp_path / "m9"), *flags, "--max-reject-fraction", "0")
    lines = proc.stderr.splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("rescore: error: "), proc.stderr
    assert "bad_reward 1" in lines[0]
    proc = cli("--input", good, "--output", str(tmp_path / "quiet"), *flags, "--quiet")
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert os.path.exists(str(tmp_path / "quiet" / "_SUCCESS"))


# --- Dataflow job graph and the GPU ------------------------------------------------------------


@pytest.mark.slow
def test_dataflow_gpu_job_graph_hints_only_the_model_stage(models, tmp_path):
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs the [gcp] extra")
    from rescore.pipelines.cli import run

    glob = _write(_rows(8), str(tmp_path / "in"))
    spec = "type:nvidia-l4;count:1;install-nvidia-driver;machine_type:g2-standard-8"

    def job(config, *extra):
        doc = run([
            "--config", os.path.join(ROOT, "run_configs", config), "--input", glob,
            "--output", "gs://rescore-test-bucket/scored", "--project=rescore-test", "--temp_location=gs://rescore-test-bucket/tmp",
            "--staging_location=gs://rescore-test-bucket/staging", "--job_name=rescore-dry-run", "--no_auth", "--dry_run=True",
            "--strategy", "on_policy_distill", "--teacher-model", models["teacher"], *extra,
        ])
        components = doc["job"].proto_pipeline.components
        hinted = {}
        for t in components.transforms.values():
            env = components.environments.get(t.environment_id)
            if env is not None and not t.subtransforms:
                hint = env.resource_hints.get("beam:resources:accelerator:v1")
                if hint:
                    hinted[t.unique_name] = hint.decode()
        return components, hinted

    # The CPU config with --model-accelerator: the model stage's reading and inference steps only.
    components, hinted = job("dataflow.yaml", f"--model-accelerator={spec}")
    assert any(n.startswith("ComputeModelColumns/RunInference[teacher_logprobs]") for n in hinted), hinted
    assert any(n.startswith("ComputeModelColumns/ReadModelInputs") for n in hinted), hinted
    assert all(n.startswith(("ComputeModelColumns/ReadModelInputs", "ComputeModelColumns/RunInference")) for n in hinted), hinted
    assert set(hinted.values()) == {spec}
    # The GPU config: the model stage (models.accelerator) and the scoring/writing steps (accelerator).
    _, gpu = job("dataflow_gpu.yaml")
    assert {n for n in gpu if n.startswith("ComputeModelColumns/")} == set(hinted)
    assert all(n.startswith(("ComputeModelColumns/", "ScoreGroups/Score/", "WriteScored/ReadBackAndWrite/")) for n in gpu), gpu
    names = [t.unique_name for t in components.transforms.values()]
    for step in ("ComputeModelColumns/ReadModelInputs", "ComputeModelColumns/WriteModelColumns", "ReadExperiences",
                 "ScoreGroups/GroupByBucket", "WriteScored/GroupByUnit", "Finalize"):
        assert any(n.startswith(step) for n in names), step


@pytest.mark.slow
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none here)")
@pytest.mark.parametrize("dtype, atol", [("float32", 1e-4), ("bfloat16", 0.15), ("float16", 0.05)])
def test_cuda_logprobs_match_fp32_cpu(models, dtype, atol):
    cpu = _load("lm", models["teacher"])
    gpu = inference.load_causal_lm(models["teacher"], torch.device("cuda"), inference.torch_dtype(dtype, torch.device("cuda")))
    rows = [np.array(r["tokens"]) for r in _rows(9, too_long=False, prompt_zero=False)]
    prompts = [r["prompt_length"] for r in _rows(9, too_long=False, prompt_zero=False)]
    want = inference.response_logprobs(cpu, rows, prompts)
    got = inference.response_logprobs(gpu, rows, prompts)
    for w, g in zip(want, got):
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)


# --- the benchmark script runs (tiny sizes), so its README command cannot rot ------------------


@pytest.mark.slow
def test_model_stage_benchmark_runs_and_agrees_with_the_plain_loop():
    import json

    proc = subprocess.run(
        [sys.executable, "benchmarks/model_stage.py", "--rows", "12", "--hidden", "64", "--layers", "1", "--vocab", "500",
         "--repeats", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["device"] == "cpu" and result["rows"] == 12 and result["tokens"] > 12 * 96
    assert result["stage_model_loads"] == [1]  # one model copy for the stage's process
    assert result["max_abs_diff"] <= 1e-5 and result["stage_tokens_per_s"] > 0 and result["loop_tokens_per_s"] > 0
