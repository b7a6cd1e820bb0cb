"""Device handling (--device auto|cpu|cuda), the Dataflow GPU job graph, and the worker image."""

import os
import re
import tomllib

import numpy as np
import pytest
import torch
from conftest import RUNNER
from data import SCHEMA_MULTI_STEP, multi_step_rows, read_output, write_parquet

from rescore.transforms.strategies import GroupedRows, chain_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="no CUDA device"))]
COMPOSITIONS = [
    ("grpo", {"std_cal_level": "batch"}),
    ("correct_bias", {}),
    ("reward_variance,grpo,duplicate_informative", {"std_threshold": 0.1}),
    ("step_wise_grpo", {"enable_step_norm": True}),
    ("opmd", {"opmd_baseline": "logavgexp", "tau": 0.3}),
    ("rloo", {}),
    ("reinforce_plus_plus_baseline", {}),
    ("mix_chord", {}),
]


def random_grouped(device, seed=0, groups=300):
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 9, groups)
    n = int(sizes.sum())
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    run = np.concatenate([np.sort(rng.integers(0, 4, s)) for s in sizes])
    step = np.concatenate([np.arange(s) for s in sizes])

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    return GroupedRows(
        reward=t(rng.choice([0.0, 1.0, 0.5], n) + rng.normal(0, 0.1, n) * (rng.random(n) < 0.5)),
        offsets=t(offsets),
        batch=t(np.repeat(rng.integers(0, 3, groups), sizes)),
        run=t(run),
        step=t(step),
        action_tokens=t(rng.integers(0, 300, n)),
        mean_logprob=t(-rng.random(n)),
        expert=t(rng.random(n) < 0.2),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("strategy, params", COMPOSITIONS)
def test_scores_on_a_device_match_the_cpu(device, strategy, params):
    plan = chain_of(strategy, params)
    cpu_rows, dev_rows = random_grouped("cpu"), random_grouped(device)
    stats = None
    if plan.batch_level:
        b, v, w = plan.batch_values(cpu_rows)
        table = {}
        for batch in np.unique(b.numpy()):
            at = b.numpy() == batch
            order = np.lexsort((w.numpy()[at], v.numpy()[at]))
            table[int(batch)] = plan.batch_stats(v.numpy()[at][order], w.numpy()[at][order])
        stats = torch.tensor([table[int(x)] for x in cpu_rows.batch.tolist()], dtype=torch.float64)
    want = plan.score(cpu_rows, stats)
    got = plan.score(dev_rows, None if stats is None else stats.to(device))
    assert got.keep.device.type == torch.device(device).type
    assert torch.equal(got.keep.cpu(), want.keep)
    if want.score is not None:
        # float64 throughout; CUDA reductions may add in another order (documented tolerance).
        assert torch.allclose(got.score.cpu(), want.score, rtol=1e-9, atol=1e-12)
    if want.informative is not None:
        assert torch.equal(got.informative.cpu(), want.informative)


@pytest.mark.parametrize("device", DEVICES)
def test_token_broadcast_on_a_device(device):
    import pyarrow as pa

    from rescore.transforms.rows.tokens import score_columns

    rng = np.random.default_rng(1)
    lengths = rng.integers(0, 50, 200)
    mask = pa.array([list(rng.integers(0, 2, n).astype(np.int8)) for n in lengths], pa.list_(pa.int8()))
    table = pa.table({"action_mask": mask})
    value = rng.normal(size=200)
    adv, ret, score = score_columns(table, value, value, device=torch.device(device))
    expected = np.concatenate([np.float32(v) * np.asarray(m, np.float32) for v, m in zip(value, mask.to_pylist())])
    assert np.array_equal(adv.combine_chunks().flatten().to_numpy(), expected)
    assert ret.equals(adv)


@pytest.mark.slow
def test_device_cpu_and_auto_give_identical_output(tmp_path, rescore):
    glob = write_parquet(multi_step_rows(3), str(tmp_path / "in"), files=2, row_group_size=9, schema=SCHEMA_MULTI_STEP)
    outs = []
    for device in ("cpu", "auto"):
        _, out = rescore(glob, "--strategy", "reward_variance,step_wise_grpo,duplicate_informative", "--device", device,
                         output=str(tmp_path / device))
        outs.append(read_output(out))
    assert outs[0].equals(outs[1])


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
def test_device_cuda_fails_cleanly_without_a_gpu(tmp_path, capsys):
    from rescore.pipelines.cli import main

    glob = write_parquet(multi_step_rows(3), str(tmp_path / "in"), files=1, schema=SCHEMA_MULTI_STEP)
    code = main(["--input", glob, "--output", str(tmp_path / "o"), "--strategy", "grpo", "--device", "cuda", RUNNER])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "Traceback" not in err
    assert err.startswith("rescore: error: --device cuda: no CUDA device is available here;")
    assert not os.path.exists(tmp_path / "o")


@pytest.mark.slow
def test_dataflow_gpu_job_graph_offline(tmp_path):
    pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs the [gcp] extra")
    from apache_beam.portability.api import beam_runner_api_pb2

    from rescore.pipelines.cli import run

    glob = write_parquet(multi_step_rows(3), str(tmp_path / "in"), files=1, schema=SCHEMA_MULTI_STEP)
    image = "us-central1-docker.pkg.dev/rescore-test/rescore/worker:0.1.0"
    doc = run([
        "--config", os.path.join(ROOT, "run_configs", "dataflow_gpu.yaml"),
        "--input", glob, "--output", "gs://rescore-test-bucket/scored",
        "--project=rescore-test", "--temp_location=gs://rescore-test-bucket/tmp",
        "--staging_location=gs://rescore-test-bucket/staging", f"--sdk_container_image={image}",
        "--job_name=rescore-dry-run", "--no_auth", "--dry_run=True",
    ])
    assert doc["dry_run"] and doc["device"] == "cuda"
    pipeline = doc["job"].proto_pipeline
    envs = pipeline.components.environments
    hint = b"type:nvidia-l4;count:1;install-nvidia-driver;machine_type:g2-standard-8"
    steps = {}
    for transform in pipeline.components.transforms.values():
        name = transform.unique_name
        if transform.environment_id and ("ScoreGroups/Score/" in name or "WriteScored/ReadBackAndWrite/" in name):
            steps[name] = envs[transform.environment_id].resource_hints.get("beam:resources:accelerator:v1")
    assert any("_ScoreBucket" in n for n in steps) and any("_WriteUnit" in n for n in steps), steps
    assert set(steps.values()) == {hint}, steps
    # The reading step has no GPU work and no hint.
    read = [t for t in pipeline.components.transforms.values() if "ReadAndValidate/" in t.unique_name and t.environment_id]
    assert read and all(not envs[t.environment_id].resource_hints for t in read)
    for env in envs.values():
        assert env.urn == "beam:env:docker:v1"
        assert beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image == image
    options = doc["job"].options.get_all_options()
    assert "use_runner_v2" in options["experiments"] and "no_use_multiple_sdk_containers" in options["experiments"]
    # Right fitting (resource hints) and the worker_accelerator service option do not mix (Dataflow docs).
    assert not any("worker_accelerator" in o for o in options.get("dataflow_service_options") or [])


def test_dockerfile_matches_the_package():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    dockerfile = open(os.path.join(ROOT, "Dockerfile")).read()
    base = re.search(r"^FROM apache/beam_python(\d+\.\d+)_sdk:(\S+)", dockerfile, re.M)
    assert base, "the image must build on the Beam Python SDK image"
    python, beam = base.groups()
    assert f">={python}" in project["requires-python"]
    beam_pin = next(d for d in project["dependencies"] if d.startswith("apache-beam"))
    assert re.fullmatch(beam_pin.split("==")[1].replace(".", r"\.").replace("*", r"\d+"), beam), (beam_pin, beam)
    torch_pin = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert f'"{torch_pin}"' in dockerfile
    entrypoint = re.findall(r"^ENTRYPOINT (.+)$", dockerfile, re.M)
    assert entrypoint[-1].strip() == '["/opt/apache/beam/boot"]'
