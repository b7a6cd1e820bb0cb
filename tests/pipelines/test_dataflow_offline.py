"""The whole Dataflow job request, built offline, and its pipeline run on the local runner.

`rescore` runs with Beam's DataflowRunner exactly as a user would (`--no-wait`), with the Dataflow
client's GCS upload (`stage_file`) and job submission (`submit_job_description`) faked and every
socket refused: the test holds what would have been uploaded and sent. The job request's worker
pool, image, experiments and resource hints are checked, and the staged pipeline proto (the
`pipeline.pb` Dataflow's workers run) is run on Beam's FnApiRunner against the local paths of the
capture and compared byte for byte with an in-process run (docs/runners.md, Dataflow).
"""

import hashlib
import json
import os
import socket

import pytest
from data import SCHEMA_MULTI_STEP, multi_step_rows, write_parquet

apiclient = pytest.importorskip("apache_beam.runners.dataflow.internal.apiclient", reason="needs the [gcp] extra")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STRATEGY = ["--strategy", "reward_variance,grpo,duplicate_informative", "--set", "std_cal_level=batch"]
BUCKET = "gs://rescore-test-bucket"
IMAGE = "us-central1-docker.pkg.dev/PROJECT/rescore/worker:0.1.0"  # run_configs/dataflow*.yaml
HINT = "beam:resources:accelerator:v1"
GPU = b"type:nvidia-l4;count:1;install-nvidia-driver;machine_type:g2-standard-8"


class Captured:
    def __init__(self):
        self.staged = {}  # gs:// path -> bytes the launcher would have uploaded
        self.jobs = []  # the apiclient.Job whose proto would have been POSTed
        self.network = []  # any socket the run tried to open
        self.run_on_submit = False  # the fake service runs the staged pipeline.pb before it answers

    def run_locally(self):
        """What Dataflow's workers would run: the staged pipeline.pb, its Docker environments
        swapped for Beam's in-process one, on Beam's FnApiRunner."""
        from apache_beam.options.pipeline_options import PipelineOptions
        from apache_beam.runners.portability.fn_api_runner import FnApiRunner

        pipeline = self.pipeline()
        for env in pipeline.components.environments.values():
            env.urn, env.payload = "beam:env:embedded_python:v1", b""
        FnApiRunner().run_via_runner_api(pipeline, PipelineOptions([])).wait_until_finish()

    @property
    def request(self):
        from google.cloud.dataflow_v1beta3 import types

        return json.loads(types.Job.to_json(self.jobs[0].proto, use_integers_for_enums=False))

    def staged_file(self, name):
        (data,) = [v for k, v in self.staged.items() if k.endswith("/" + name)]
        return data

    def pipeline(self):
        from apache_beam.portability.api import beam_runner_api_pb2

        return beam_runner_api_pb2.Pipeline.FromString(self.staged_file("pipeline.pb"))


@pytest.fixture
def offline(monkeypatch):
    """Fake the two calls that reach Google (upload, submit), refuse every socket, and let
    DataflowRunner take the local paths of this machine (the user-facing refusal is tested in
    test_runners.py and below)."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions
    from google.cloud.dataflow_v1beta3 import types

    cap = Captured()

    def stage_file(self, gcs_or_local_path, file_name, stream, mime_type=None, total_size=None):
        assert gcs_or_local_path.startswith(BUCKET + "/staging/"), gcs_or_local_path
        cap.staged[f"{gcs_or_local_path.rstrip('/')}/{file_name}"] = stream.read()

    def submit_job_description(self, job):
        cap.jobs.append(job)
        state = types.JobState.JOB_STATE_PENDING
        if cap.run_on_submit:
            cap.run_locally()
            state = types.JobState.JOB_STATE_DONE
        return types.Job(id="2026-11-25_00_00_00-offline", name=job.proto.name, current_state=state)

    def no_network(*args, **kwargs):
        cap.network.append(args[:2])
        raise AssertionError(f"the offline Dataflow test tried the network: {args[:2]}")

    monkeypatch.setattr(apiclient.DataflowApplicationClient, "stage_file", stage_file)
    monkeypatch.setattr(apiclient.DataflowApplicationClient, "submit_job_description", submit_job_description)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    # Option validation reads each bucket's soft-delete policy (a warning only) through GCS.
    monkeypatch.setattr(GoogleCloudOptions, "_warn_if_soft_delete_policy_enabled", lambda self, *a: None)
    # (the one parser of runner arguments, beam_args.pipeline_args, holds the check)
    from rescore.pipelines import beam_args

    monkeypatch.setattr(beam_args, "_check_paths_reach_workers", lambda *a, **k: None)
    return cap


@pytest.fixture(scope="module")
def experience(tmp_path_factory):
    d = tmp_path_factory.mktemp("dataflow_offline")
    return write_parquet(multi_step_rows(12), str(d / "in"), files=3, row_group_size=8, schema=SCHEMA_MULTI_STEP)


def submit(cap, config_name, inputs, output, *extra):
    from rescore.pipelines.cli import run

    doc = run([
        "--config", os.path.join(ROOT, "run_configs", config_name), "--input", inputs, "--output", output,
        "--project=rescore-test", f"--temp_location={BUCKET}/tmp", f"--staging_location={BUCKET}/staging",
        "--job_name=rescore-offline", "--no_auth", "--no-wait", *extra,
    ])
    assert cap.network == [] and len(cap.jobs) == 1
    return doc


def _experiments(request):
    return set(request["environment"]["experiments"])


def test_dataflow_job_request_cpu(offline, experience, tmp_path):
    out = str(tmp_path / "out")
    doc = submit(offline, "dataflow.yaml", experience, out, *STRATEGY)
    # --no-wait: the launcher returns once the job is created and runs nothing itself.
    assert doc["submitted"] is True and doc["job_id"] == "2026-11-25_00_00_00-offline"
    assert not os.path.exists(os.path.join(out, "_SUCCESS")) and not os.path.exists(os.path.join(out, "metrics.json"))
    req = offline.request
    assert req["name"] == "rescore-offline" and req["type"] == "JOB_TYPE_BATCH"
    assert req["environment"]["version"]["job_type"] == "FNAPI_BATCH"
    (pool,) = req["environment"]["workerPools"]
    assert pool["machineType"] == "n2-highmem-8" and pool["numWorkers"] == 2 and pool["diskSizeGb"] == 50
    assert pool["autoscalingSettings"] == {"algorithm": "AUTOSCALING_ALGORITHM_BASIC", "maxNumWorkers": 20}  # THROUGHPUT_BASED
    assert [i["containerImage"] for i in pool["sdkHarnessContainerImages"]] == [IMAGE]
    assert "use_runner_v2" in _experiments(req)
    assert not any("worker_accelerator" in e for e in _experiments(req))
    # sdk_location: container — nothing but the pipeline and Beam's small session files is uploaded.
    names = sorted(k.rsplit("/", 1)[1] for k in offline.staged)
    assert names == ["pickled_main_session", "pipeline.pb", "submission_environment_dependencies.txt"]
    options = req["environment"]["sdkPipelineOptions"]["options"]
    assert options["pipelineUrl"].startswith(BUCKET + "/staging/") and options["pipelineUrl"] in offline.staged
    assert options["pipelineProtoHash"] == hashlib.sha256(offline.staged_file("pipeline.pb")).hexdigest()
    assert options["sdk_location"] == "container" and options["sdk_container_image"] == IMAGE
    # The staged proto is the one the job request names, with the project's image and no hint.
    pipeline = offline.pipeline()
    assert all(not env.resource_hints for env in pipeline.components.environments.values())
    names = [t.unique_name for t in pipeline.components.transforms.values()]
    for step in ("ReadExperiences", "ScoreGroups/GroupByBucket", "PlanCopies/GroupByBatch", "WriteScored/GroupByUnit", "Finalize"):
        assert any(n.startswith(step) for n in names), step


def test_dataflow_job_request_gpu_hints_exactly_the_gpu_steps(offline, tmp_path):
    from apache_beam.portability.api import beam_runner_api_pb2

    glob = write_parquet(multi_step_rows(3), str(tmp_path / "in"), files=1, schema=SCHEMA_MULTI_STEP)
    doc = submit(offline, "dataflow_gpu.yaml", glob, str(tmp_path / "out"))
    assert doc["submitted"] and doc["device"] == "cuda"
    req = offline.request
    (pool,) = req["environment"]["workerPools"]
    # The default pool is the CPU workers; the GPU machine type rides in the hint (right fitting).
    assert pool["machineType"] == "n2-standard-8" and pool["numWorkers"] == 2 and pool["diskSizeGb"] == 100
    assert pool["autoscalingSettings"]["maxNumWorkers"] == 8
    images = pool["sdkHarnessContainerImages"]
    assert {i["containerImage"] for i in images} == {IMAGE}
    assert {"use_runner_v2", "no_use_multiple_sdk_containers"} <= _experiments(req)
    assert not any("worker_accelerator" in e for e in _experiments(req))
    assert req["environment"]["sdkPipelineOptions"]["options"]["sdk_container_image"] == IMAGE
    pipeline = offline.pipeline()
    envs = pipeline.components.environments
    hinted, plain = set(), set()
    for t in pipeline.components.transforms.values():
        if t.subtransforms or not t.environment_id:
            continue  # composites and runner-executed primitives (GroupByKey, Impulse) carry no environment
        (hinted if envs[t.environment_id].resource_hints.get(HINT) else plain).add(t.unique_name)
        if t.unique_name in hinted:
            assert envs[t.environment_id].resource_hints[HINT] == GPU
    assert hinted and all(n.startswith(("ScoreGroups/Score/", "WriteScored/ReadBackAndWrite/")) for n in hinted), hinted
    assert any("_ScoreBucket" in n for n in hinted) and any("_WriteUnit" in n for n in hinted), hinted
    assert not any(n.startswith(("ScoreGroups/Score/", "WriteScored/ReadBackAndWrite/")) for n in plain), plain
    assert any(n.startswith("ReadExperiences") for n in plain) and any(n.startswith("Finalize") for n in plain)
    # One image entry per environment: the hinted one and the plain one, the same image.
    assert sorted(i["environmentId"] for i in images) == sorted(envs) and len(envs) == 2
    for env in envs.values():
        assert env.urn == "beam:env:docker:v1"
        assert beam_runner_api_pb2.DockerPayload.FromString(env.payload).container_image == IMAGE


def test_dataflow_still_refuses_local_paths_without_the_test_seam(experience, tmp_path, capsys):
    from rescore.pipelines.cli import main

    out = str(tmp_path / "out")
    code = main(["--config", os.path.join(ROOT, "run_configs", "dataflow.yaml"), "--input", experience,
                 "--output", out, "--project=p", f"--temp_location={BUCKET}/tmp", "--no-wait"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and not os.path.exists(out)
    assert err[0] == f"rescore: error: --output {out!r} is a local path, which DataflowRunner's workers cannot reach: use gs://BUCKET/..."


def test_flex_template_launcher_submits_and_returns(offline, experience, tmp_path, monkeypatch):
    """The image's FLEX_TEMPLATE_PYTHON_PY_FILE is pipelines/flex_template.py; run as the
    launcher runs it (template parameters as --name=value), it submits and returns (--no-wait)."""
    import runpy
    import sys

    dockerfile = open(os.path.join(ROOT, "Dockerfile")).read()
    assert "ENV FLEX_TEMPLATE_PYTHON_PY_FILE=/opt/rescore/pipelines/flex_template.py" in dockerfile
    assert "COPY pipelines ./pipelines" in dockerfile and "WORKDIR /opt/rescore" in dockerfile
    with open(os.path.join(ROOT, "flex_template", "metadata.json")) as f:
        metadata = json.load(f)
    assert metadata["streaming"] is False
    assert {p["name"] for p in metadata["parameters"] if not p["isOptional"]} == {"input", "output"}
    # The template's regexes accept what the CLI accepts where the two can be compared.
    import re

    from rescore.pipelines.config import _parser

    actions = {a.dest: a for a in _parser()._actions}
    regexes = {p["name"]: re.compile(p["regexes"][0]) for p in metadata["parameters"] if p.get("regexes")}
    assert {c for c in actions["device"].choices if regexes["device"].fullmatch(c)} == set(actions["device"].choices)
    assert not regexes["device"].fullmatch("gpu") and not regexes["buckets"].fullmatch("0")
    assert regexes["input"].fullmatch("gs://b/x/*.parquet") and not regexes["output"].fullmatch("/local/out")
    out = str(tmp_path / "out")
    monkeypatch.setattr(sys, "argv", [
        "flex_template.py", f"--input={experience}", f"--output={out}", "--strategy=grpo", "--buckets=128",
        f"--config={os.path.join(ROOT, 'run_configs', 'dataflow.yaml')}", "--project=rescore-test",
        f"--temp_location={BUCKET}/tmp", f"--staging_location={BUCKET}/staging", "--job_name=rescore-template", "--no_auth",
    ])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(os.path.join(ROOT, "pipelines", "flex_template.py"), run_name="__main__")
    assert exit_.value.code == 0 and offline.network == [] and len(offline.jobs) == 1
    assert offline.request["name"] == "rescore-template"
    assert not os.path.exists(os.path.join(out, "_SUCCESS"))


def test_dataflow_pipeline_proto_on_the_local_runner_gives_the_in_process_output(offline, experience, tmp_path):
    """A waiting `rescore` (no --no-wait) against a fake service that runs the staged pipeline.pb
    on the local runner (the workers' part: read, score, write, Finalize) and answers DONE; the
    launcher then does its own part (reads metrics.json, checks _SUCCESS, returns the summary)."""
    from rescore.pipelines.cli import run

    offline.run_on_submit = True
    out = str(tmp_path / "dataflow")
    doc = run([
        "--config", os.path.join(ROOT, "run_configs", "dataflow.yaml"), "--input", experience, "--output", out,
        "--project=rescore-test", f"--temp_location={BUCKET}/tmp", f"--staging_location={BUCKET}/staging",
        "--job_name=rescore-offline", "--no_auth", "--quiet", *STRATEGY,
    ])
    assert offline.network == [] and len(offline.jobs) == 1
    local = str(tmp_path / "in_process")
    want = run(["--config", os.path.join(ROOT, "run_configs", "local.yaml"), "--input", experience, "--output", local,
                "--quiet", *STRATEGY])
    assert doc["totals"] == want["totals"] and doc["totals"]["rows_duplicated"] > 0
    assert doc["config_hash"] == want["config_hash"] and doc["buckets"] == 512
    scored = sorted(n for n in os.listdir(local) if n.startswith("scored-"))
    assert scored and sorted(n for n in os.listdir(out) if n.startswith("scored-")) == scored
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    for name in scored:
        with open(os.path.join(out, name), "rb") as a, open(os.path.join(local, name), "rb") as b:
            assert a.read() == b.read(), name



def test_dataflow_job_request_model_accelerator_hints_only_the_model_stage(offline, tmp_path):
    """--model-accelerator: the model stage's reading and inference steps run on GPU workers; with
    the CPU config nothing else is hinted, with the GPU config the scoring and writing steps too."""
    pytest.importorskip("transformers", reason="the model stage needs the [models] extra (transformers)")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rescore.pipelines.sample_models import write_tiny_models

    models = write_tiny_models(str(tmp_path / "models"), vocab=64, context=32, seed=3)
    rows = [dict(batch=0, task=t, run=r, reward=float((t + r) % 2), tokens=[1, 2, 3, 4 + r, 5 + t], prompt_length=2,
                 logprobs=[-0.5, -1.0, -1.5], action_mask=[1, 1, 1]) for t in range(2) for r in range(4)]
    os.makedirs(tmp_path / "in")
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "in" / "part-0.parquet"))
    glob = str(tmp_path / "in" / "*.parquet")
    spec = "type:nvidia-l4;count:1;install-nvidia-driver;machine_type:g2-standard-8"
    model = ["--strategy", "on_policy_distill", "--teacher-model", models["teacher"]]

    def hinted(config_name, *extra):
        offline.jobs.clear()
        offline.staged.clear()
        assert submit(offline, config_name, glob, str(tmp_path / config_name), *model, *extra)["submitted"]
        pipeline = offline.pipeline()
        envs = pipeline.components.environments
        steps = {}
        for t in pipeline.components.transforms.values():
            if t.environment_id and not t.subtransforms:
                steps[t.unique_name] = envs[t.environment_id].resource_hints.get(HINT)
        assert any(n.startswith("ReadExperiences") and v is None for n, v in steps.items())
        return {n: v for n, v in steps.items() if v}

    cpu = hinted("dataflow.yaml", f"--model-accelerator={spec}")
    assert any(n.startswith("ComputeModelColumns/RunInference[teacher_logprobs]") for n in cpu), cpu
    assert any(n.startswith("ComputeModelColumns/ReadModelInputs") for n in cpu), cpu
    assert all(n.startswith(("ComputeModelColumns/ReadModelInputs", "ComputeModelColumns/RunInference")) for n in cpu), cpu
    assert set(cpu.values()) == {spec.encode()}
    (pool,) = offline.request["environment"]["workerPools"]
    assert pool["machineType"] == "n2-highmem-8"  # the CPU pool; the GPU machine type is in the hint
    gpu = hinted("dataflow_gpu.yaml")
    assert {n for n in gpu if n.startswith("ComputeModelColumns/")} == set(cpu)
    assert all(n.startswith(("ComputeModelColumns/", "ScoreGroups/Score/", "WriteScored/ReadBackAndWrite/")) for n in gpu), gpu
    assert any(n.startswith("ScoreGroups/Score/") for n in gpu) and any(n.startswith("WriteScored/ReadBackAndWrite/") for n in gpu)
