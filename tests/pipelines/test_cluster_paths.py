"""A local path with a runner whose workers may be other machines (Flink with a JobManager
elsewhere, Spark with a cluster master, Dask with a scheduler elsewhere, a portable job service
elsewhere, Dataflow) is refused before any work, in one line with exit 2, unless
`--shared-filesystem` says every worker mounts it (docs/runners.md, "What a cluster changes")."""

import pytest
import yaml
from batched import run_many

from rescore.errors import ConfigError
from rescore.pipelines.config import parse_args

FLINK = ["--runner=FlinkRunner", "--flink_master=jobmanager.example:8081", "--flink_version=1.19"]
SPARK = ["--runner=SparkRunner", "--spark_master_url=spark://spark-master.example:7077"]


def test_remote_cluster_with_local_paths_is_refused_in_one_line_before_any_work(tmp_path):
    out = tmp_path / "out"
    runs = [
        ["--input", "gs://b/in/*.parquet", "--output", str(out), "--strategy", "grpo", *FLINK],
        ["--input", str(tmp_path / "in" / "*.parquet"), "--output", "s3://b/out", "--strategy", "grpo", *SPARK],
        ["--input", "gs://b/in/*.parquet", "--output", str(out), "--strategy", "grpo",
         "--runner=PortableRunner", "--job_endpoint=flink-jobserver.example:8099"],
    ]
    results = run_many(tmp_path / "err", runs)
    expected = [
        f"rescore: error: --output '{out}' is a local path, which FlinkRunner's workers"
        " (--flink_master=jobmanager.example:8081) may not reach: use gs://, s3:// or hdfs://,"
        " or pass --shared-filesystem if every worker mounts it at the same path",
        f"rescore: error: --input '{tmp_path / 'in' / '*.parquet'}' is a local path, which SparkRunner's workers"
        " (--spark_master_url=spark://spark-master.example:7077) may not reach: use gs://, s3:// or hdfs://,"
        " or pass --shared-filesystem if every worker mounts it at the same path",
        f"rescore: error: --output '{out}' is a local path, which PortableRunner's workers"
        " (--job_endpoint=flink-jobserver.example:8099) may not reach: use gs://, s3:// or hdfs://,"
        " or pass --shared-filesystem if every worker mounts it at the same path",
    ]
    for (code, err), line in zip(results, expected, strict=True):
        assert (code, err.splitlines()) == (2, [line])
    assert not out.exists()  # nothing was created: the refusal comes before any work


def test_shared_filesystem_lets_a_cluster_take_local_paths(tmp_path):
    base = ["--input", "/mnt/shared/in/*.parquet", "--output", "/mnt/shared/out", "--strategy", "grpo"]
    for runner in (FLINK, SPARK):
        with pytest.raises(ConfigError, match="may not reach"):
            parse_args([*base, *runner])
        assert parse_args([*base, *runner, "--shared-filesystem"]).output == "/mnt/shared/out"
    config = tmp_path / "flink.yaml"
    config.write_text(yaml.safe_dump({"shared_filesystem": True, "pipeline_options": {
        "runner": "FlinkRunner", "flink_master": "jobmanager.example:8081"}}))
    assert parse_args(["--config", str(config), *base]).output == "/mnt/shared/out"
    config.write_text(yaml.safe_dump({"shared_filesystem": "yes"}))
    with pytest.raises(ConfigError, match="shared_filesystem"):
        parse_args(["--config", str(config), *base])
    # Dataflow's workers never mount the launcher's disk: the flag does not open that
    dataflow = ["--runner=DataflowRunner", "--project=p", "--region=us-central1", "--temp_location=gs://b/tmp"]
    with pytest.raises(ConfigError, match="DataflowRunner's workers cannot reach"):
        parse_args([*base, *dataflow, "--shared-filesystem"])


@pytest.mark.parametrize("runner", [
    ["--runner=FlinkRunner"],  # [auto]: Beam's embedded Flink, in the job server on this machine
    ["--runner=FlinkRunner", "--flink_master=[local]"],
    ["--runner=FlinkRunner", "--flink_master=localhost:8081"],
    ["--runner=FlinkRunner", "--flink_master=http://127.0.0.1:8081"],
    ["--runner=SparkRunner"],  # local[4]
    ["--runner=SparkRunner", "--spark_master_url=local[*]"],
    ["--runner=PortableRunner", "--job_endpoint=embed"],
    ["--runner=PortableRunner", "--job_endpoint=[::1]:8099"],
    ["--runner=DirectRunner"],
    [],
])
def test_workers_on_this_machine_take_local_paths(runner, tmp_path):
    cfg = parse_args(["--input", "in/*.parquet", "--output", str(tmp_path / "out"), "--strategy", "grpo", *runner])
    assert cfg.output == str(tmp_path / "out")


def test_remote_cluster_with_object_store_paths_is_not_refused():
    cfg = parse_args(["--input", "gs://b/in/*.parquet", "--output", "s3://b/out", "--strategy", "grpo", *FLINK])
    assert cfg.inputs == ["gs://b/in/*.parquet"] and "--flink_master=jobmanager.example:8081" in cfg.beam_args
    assert parse_args(["--input", "hdfs://nn/in/*.parquet", "--output", "hdfs://nn/out", "--strategy", "grpo",
                       *SPARK]).output == "hdfs://nn/out"
    # a SQL buffer is read by the launcher and staged under the output: only the output counts
    with pytest.raises(ConfigError, match="--output 'out' is a local path"):
        parse_args(["--input", "sqlite:///buffer.db", "--input-table", "exp", "--output", "out", "--strategy", "grpo",
                    *FLINK])


def test_dask_scheduler_elsewhere_is_a_remote_cluster():
    pytest.importorskip("dask", reason="DaskRunner's module needs dask (apache-beam[dask])")
    base = ["--input", "in/*.parquet", "--output", "out", "--strategy", "grpo", "--runner=DaskRunner"]
    assert parse_args(base).output == "out"  # no address: a local Dask cluster
    with pytest.raises(ConfigError, match=r"DaskRunner's workers \(--dask_client_address=sched.example:8786\)"):
        parse_args([*base, "--dask_client_address=sched.example:8786"])
    assert parse_args([*base, "--dask_client_address=sched.example:8786", "--shared-filesystem"]).output == "out"

