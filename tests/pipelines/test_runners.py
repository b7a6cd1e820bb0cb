"""Every runner path this offline machine can run, the shipped run configs, scheduled
incremental runs and the Flex Template parameters."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    GoogleCloudOptions,
    PipelineOptions,
    PortableOptions,
    StandardOptions,
    WorkerOptions,
)
from conftest import needs_gcp
from data import SCHEMA_MULTI_STEP, multi_step_rows, read_output, write_parquet

from rescore.pipelines.config import parse_args

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIGS = os.path.join(ROOT, "run_configs")
KEYS = [(k, "ascending") for k in ("batch", "task", "run", "step")]
STRATEGY = ["--strategy", "reward_variance,grpo,duplicate_informative", "--set", "std_cal_level=batch"]


def config(name):
    return os.path.join(CONFIGS, name)


def options_of(name, *extra):
    cfg = parse_args(["--config", config(name), "--input", "gs://b/in/*.parquet", "--output", "gs://b/out", *extra])
    return cfg, PipelineOptions(cfg.beam_args)


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(CONFIGS) if n.endswith(".yaml")))
def test_every_run_config_parses_into_pipeline_options(name):
    if name.startswith("dataflow"):
        needs_gcp()
    cfg, options = options_of(name)
    assert options.view_as(StandardOptions).runner
    assert cfg.strategies and cfg.buckets > 0
    options.get_all_options()  # every option known to Beam (unknown ones raised in parse_args)


def test_run_config_specifics():
    _, local = options_of("local.yaml")
    assert local.view_as(StandardOptions).runner == "FnApiRunner"  # never the Prism download
    _, multi = options_of("local_multiprocess.yaml")
    assert multi.get_all_options()["direct_running_mode"] == "multi_processing"
    _, portable = options_of("portable.yaml")
    assert portable.view_as(PortableOptions).job_endpoint == "embed"
    assert portable.view_as(PortableOptions).environment_type == "LOOPBACK"
    _, flink = options_of("flink.yaml")
    f = flink.view_as(FlinkRunnerOptions)
    assert flink.view_as(StandardOptions).runner == "FlinkRunner"
    assert f.flink_master.endswith(":8081") and f.flink_version in FlinkRunnerOptions.PUBLISHED_FLINK_VERSIONS
    assert f.parallelism > 0 and not f.flink_submit_uber_jar  # the assembled job server is no uber jar
    p = flink.view_as(PortableOptions)
    assert p.environment_type == "DOCKER" and p.environment_config.endswith("rescore/worker:0.1.0")
    needs_gcp()  # the Dataflow configs: everything above is checked without the extra
    for name in ("dataflow.yaml", "dataflow_gpu.yaml"):
        cfg, df = options_of(name)
        g, w = df.view_as(GoogleCloudOptions), df.view_as(WorkerOptions)
        assert df.view_as(StandardOptions).runner == "DataflowRunner"
        assert g.region and g.temp_location.startswith("gs://") and g.project
        assert w.sdk_container_image.endswith("rescore/worker:0.1.0") and w.max_num_workers >= w.num_workers
        assert "use_runner_v2" in df.get_all_options()["experiments"]
    assert options_of("dataflow_gpu.yaml")[0].device == "cuda"


@pytest.fixture(scope="module")
def experience(tmp_path_factory):
    d = tmp_path_factory.mktemp("runners")
    return write_parquet(multi_step_rows(12), str(d / "in"), files=3, row_group_size=8, schema=SCHEMA_MULTI_STEP)


@pytest.fixture(scope="module")
def in_process(experience, tmp_path_factory):
    from rescore.pipelines.cli import run

    out = str(tmp_path_factory.mktemp("inproc") / "out")
    run(["--config", config("local.yaml"), "--input", experience, "--output", out, *STRATEGY])
    return read_output(out).sort_by(KEYS)


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


@pytest.fixture
def worker_pool():
    """A Beam worker pool in its own process, started and stopped by the test."""
    port = _free_port()
    env = {**os.environ, "PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main", f"--service_port={port}"],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("localhost", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.1)
    yield f"localhost:{port}"
    proc.terminate()
    proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, extra",
    [
        ("local_multiprocess.yaml", []),
        ("portable.yaml", []),
        ("portable.yaml", ["--environment_type=EXTERNAL"]),
    ],
    ids=["multi-process", "portable-loopback", "portable-worker-pool"],
)
def test_runner_paths_give_identical_output(tmp_path, experience, in_process, name, extra, request):
    from rescore.pipelines.cli import run

    if extra:
        pool = request.getfixturevalue("worker_pool")
        extra = [*extra, f"--environment_config={pool}"]
    out = str(tmp_path / "out")
    doc = run(["--config", config(name), "--input", experience, "--output", out, *STRATEGY, *extra])
    assert doc["totals"]["rows_duplicated"] > 0
    assert read_output(out).sort_by(KEYS).equals(in_process)


@pytest.mark.slow
def test_dataflow_cpu_job_graph_offline(tmp_path, experience):
    needs_gcp()
    from rescore.pipelines.cli import run

    doc = run([
        "--config", config("dataflow.yaml"), "--input", experience, "--output", "gs://rescore-test-bucket/scored",
        "--project=rescore-test", "--temp_location=gs://rescore-test-bucket/tmp",
        "--staging_location=gs://rescore-test-bucket/staging", "--job_name=rescore-dry-run", "--no_auth", "--dry_run=True",
        *STRATEGY,
    ])
    names = [t.unique_name for t in doc["job"].proto_pipeline.components.transforms.values()]
    for step in ("ReadExperiences", "ScoreGroups/GroupByBucket", "PlanCopies/GroupByBatch", "WriteScored/GroupByUnit", "Finalize"):
        assert any(n.startswith(step) for n in names), step


# --- scheduled, incremental runs: tests/pipelines/test_incremental.py ------------------------------


# --- Flex Template --------------------------------------------------------------------------

SAMPLES = {
    "input": "gs://bucket/experience/*.parquet",
    "output": "gs://bucket/scored/day",
    "strategy": "reward_variance,grpo",
    "algorithm": "grpo",
    "set": "std_cal_level=batch",
    "buckets": "128",
    "shard_rows": "32768",
    "max_reject_fraction": "0.2",
    "device": "cuda",
}


def test_flex_template_parameters_are_cli_options():
    with open(os.path.join(ROOT, "flex_template", "metadata.json")) as f:
        metadata = json.load(f)
    names = [p["name"] for p in metadata["parameters"]]
    assert {"input", "output"} <= set(names)
    base = {"--input=gs://bucket/in/*.parquet", "--output=gs://bucket/out", "--strategy=grpo"}
    for name in names:
        assert name in SAMPLES, f"add a sample value for {name}"
        argv = [a for a in base if not a.startswith(f"--{name}=")]
        if name == "algorithm":
            argv = [a for a in argv if not a.startswith("--strategy=")]
        cfg = parse_args([*argv, f"--{name}={SAMPLES[name]}"])  # raises ConfigError if not an option
        assert cfg.inputs and cfg.output
    cfg = parse_args([f"--{n}={SAMPLES[n]}" for n in names if n not in ("algorithm",)])
    assert cfg.buckets == 128 and cfg.shard_rows == 32768 and cfg.max_reject_fraction == 0.2
    assert cfg.params == {"std_cal_level": "batch"} and cfg.device == "cuda"


def test_airflow_example_uses_real_cli_options():
    needs_gcp()  # the DAG runs on Dataflow
    import ast

    tree = ast.parse(open(os.path.join(ROOT, "examples", "airflow_dag.py")).read())
    assign = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "RESCORE_OPTIONS")
    options = ast.literal_eval(assign.value)
    options["config"] = config(os.path.basename(options["config"]))  # the image's copy of run_configs/
    argv = [f"--{k}" if v is True else f"--{k}={v}" for k, v in options.items()]
    cfg = parse_args([*argv, "--runner=DataflowRunner"])
    assert cfg.incremental and cfg.strategies == ["reward_variance", "grpo", "duplicate_informative"]
    assert cfg.max_reject_fraction == 0.2


def test_options_of_runner_modules_rescore_does_not_import_pass_through():
    """`--runner=some.module.Runner --its_option=...`: the runner's module is imported so its own
    options are Beam options; a runner whose module cannot import says why, in one line."""
    from rescore.errors import ConfigError

    cfg = parse_args(["--input", "in", "--output", "out", "--strategy", "grpo",
                      "--runner=custom_runner_for_options.CustomRunner", "--custom_cluster_address=host:1"])
    assert PipelineOptions(cfg.beam_args).get_all_options()["custom_cluster_address"] == "host:1"
    with pytest.raises(ConfigError, match="not a Rescore flag nor a Beam pipeline option$"):
        parse_args(["--input", "in", "--output", "out", "--strategy", "grpo", "--custom_cluster_adress=h"])
    try:
        import dask  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"runner DaskRunner's module did not import: .*No module named 'dask'"):
            parse_args(["--input", "in", "--output", "out", "--strategy", "grpo", "--runner=DaskRunner",
                        "--dask_client_address=localhost:8786"])
    else:
        cfg = parse_args(["--input", "in", "--output", "out", "--strategy", "grpo", "--runner=DaskRunner",
                          "--dask_client_address=localhost:8786"])
        assert PipelineOptions(cfg.beam_args).get_all_options()["dask_client_address"] == "localhost:8786"


def test_dataflow_refuses_local_paths_its_workers_cannot_reach():
    needs_gcp()
    from rescore.errors import ConfigError

    base = ["--strategy", "grpo", "--runner=DataflowRunner", "--project=p", "--region=us-central1",
            "--temp_location=gs://b/tmp"]
    with pytest.raises(ConfigError, match=r"--output 'out/' is a local path, which DataflowRunner's workers cannot reach"):
        parse_args(["--input", "gs://b/in/*.parquet", "--output", "out/", *base])
    with pytest.raises(ConfigError, match=r"--input 'data/\*.parquet' is a local path"):
        parse_args(["--input", "data/*.parquet", "--output", "gs://b/out", *base])
    assert parse_args(["--input", "gs://b/in/*.parquet", "--output", "gs://b/out", *base]).output == "gs://b/out"
    # a dry run builds the graph only (docs/runners.md checks a graph from local sample data)
    assert parse_args(["--input", "data/*.parquet", "--output", "gs://b/out", *base, "--dry_run=True"])
