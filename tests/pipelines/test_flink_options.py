"""Flink's own pipeline options by name (pipelines/flink_options.py): the options Beam's Java
Flink runner reads that Beam's Python SDK does not define are accepted with --runner FlinkRunner,
their values checked against the Java type; a misspelling gets "did you mean"; with another
runner, or with a bad value, one line and exit 2 before any work. Each refusal on a real stderr."""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
from apache_beam.options.pipeline_options import PipelineOptions, _BeamArgumentParser

from batched import forked_run as _forked
from rescore.pipelines.beam_args import _check_beam_args
from rescore.pipelines.config_files import pipeline_option_flags
from rescore.pipelines.flink_options import BOOL, FLINK_OPTIONS, INT, split_flink_options

FLINK = ["--runner=FlinkRunner", "--flink_master=localhost:8081"]
ROOT = Path(__file__).resolve().parents[2]


def _flink_local():
    """tools/flink_local.py (not part of the package), as the cluster tests load it."""
    from test_flink_cluster import flink_local

    return flink_local


def _python_options() -> set[str]:
    parser = _BeamArgumentParser(allow_abbrev=False)
    for cls in {str(c): c for c in PipelineOptions.__subclasses__()}.values():
        cls._add_argparse_args(parser)
    return {o[2:] for a in parser._actions for o in a.option_strings if o.startswith("--")}


def test_the_table_holds_only_options_python_does_not_define():
    # a name Beam's Python parser knows is checked there (and typed there); listing it here too
    # would let a value through that Beam would refuse
    assert not set(FLINK_OPTIONS) & _python_options()


def test_the_table_is_the_job_servers_flink_pipeline_options():
    """Every getter of the Java FlinkPipelineOptions in the job server jar Rescore runs, less
    those Python defines, is in the table (read from the class file: no JVM needed)."""
    jar = _flink_local().job_server_jar().parent / "lib"
    runner = next(iter(jar.glob("beam-runners-flink-*.jar")), None) if jar.is_dir() else None
    if runner is None:
        pytest.skip("Beam's Flink job server is not fetched (python tools/flink_local.py fetch)")
    with zipfile.ZipFile(runner) as z:
        data = z.read("org/apache/beam/runners/flink/FlinkPipelineOptions.class")
    import re

    getters = {m.decode() for m in re.findall(rb"(?:get|is)([A-Z][A-Za-z]+)", data)}
    names = {re.sub(r"(?<!^)([A-Z])", r"_\1", g).lower() for g in getters}
    java_options = {n for n in names if n not in ("flink_master", "parallelism", "max_parallelism", "files_to_stage",
                                                  "job_name", "streaming", "options_id", "class", "user_agent")}
    missing = {n for n in java_options if n not in FLINK_OPTIONS and n not in _python_options()}
    # what remains are the interface's own helpers and constants, not options
    assert not missing - {"flink_conf_dir_default", "defaults", "state_backend_factory_class"}, missing


@pytest.mark.parametrize("arg,problem", [
    ("--max_bundle_size=abc", "--max_bundle_size takes a whole number, got 'abc'"),
    ("--object_reuse=yes", "--object_reuse takes true or false, got 'yes'"),
    ("--execution_mode_for_batch=FAST",
     "--execution_mode_for_batch takes one of PIPELINED, PIPELINED_FORCED, BATCH, BATCH_FORCED, got 'FAST'"),
    ("--checkpointing_mode", "--checkpointing_mode needs a value (EXACTLY_ONCE, AT_LEAST_ONCE)"),
])
def test_a_bad_value_is_refused_with_what_the_option_takes(arg, problem):
    with pytest.raises(ValueError) as e:
        split_flink_options([*FLINK, arg], "FlinkRunner")
    assert str(e.value) == problem


def test_good_values_of_every_kind_pass_in_every_spelling():
    args = [*FLINK, "--max_bundle_size=1000", "--max_bundle_time_mills", "500", "--object_reuse",
            "--operator_chaining", "false", "--execution_mode_for_batch=BATCH_FORCED", "--state_backend=rocksdb"]
    flink, rest = split_flink_options(args, "FlinkRunner")
    assert flink == ["--max_bundle_size=1000", "--max_bundle_time_mills=500", "--object_reuse",
                     "--operator_chaining=false", "--execution_mode_for_batch=BATCH_FORCED", "--state_backend=rocksdb"]
    assert rest == FLINK
    _check_beam_args(args)  # no ConfigError
    assert {k for k, v in FLINK_OPTIONS.items() if v in (BOOL, INT)} >= {"max_bundle_size", "object_reuse"}


def test_yaml_false_reaches_the_java_runner_for_a_flink_option():
    # operator_chaining is true by default in Java: dropping `false` (as for a Python flag) would ignore it
    assert pipeline_option_flags({"operator_chaining": False, "object_reuse": True, "save_main_session": False}) == [
        "--operator_chaining=false", "--object_reuse"]


@pytest.mark.slow
def test_refusals_on_the_real_stderr(forked, tmp_path):
    base = ["--input", str(tmp_path / "in.parquet"), "--output", str(tmp_path / "o"), "--strategy", "grpo"]
    cases = [
        ([*base, *FLINK, "--shared-filesystem", "--max_bundel_size=10"],
         "rescore: error: unknown option --max_bundel_size (did you mean --max_bundle_size?): "
         "not a Rescore flag nor a Beam pipeline option"),
        ([*base, "--max_bundle_size=10"],
         "rescore: error: --max_bundle_size is an option of Beam's Flink runner: it needs --runner FlinkRunner "
         "(this run's runner: the default, in-process)"),
        ([*base, *FLINK, "--shared-filesystem", "--object_reuse=maybe"],
         "rescore: error: --object_reuse takes true or false, got 'maybe'"),
    ]
    for argv, line in cases:
        p = _forked(forked, *argv)
        assert p.returncode == 2 and p.stderr.strip().splitlines() == [line], p.stderr


def test_up_prints_flags_that_paste_into_a_shell(tmp_path):
    """Issue 43: the flags `tools/flink_local.py up` prints are shell-quoted: a shell splits them
    back into exactly the arguments, the JSON of --environment_config whole."""
    import json
    import shlex

    c = _flink_local().Cluster(tmp_path, {"rest_port": 8081, "slots_total": 4})
    printed = shlex.join(c.beam_args())
    split = subprocess.run(["bash", "-c", f'printf "%s\\n" {printed}'],  # the line as a shell reads it
                           capture_output=True, text=True, check=True).stdout.splitlines()
    assert split == c.beam_args()
    config = next(a for a in split if a.startswith("--environment_config="))
    assert json.loads(config.split("=", 1)[1]) == {"command": str(Path(tmp_path) / "sdk_worker")}


def test_booleans_go_to_beam_as_bare_flags_that_flip_the_java_default():
    """Beam's FlinkRunner parses a boolean the job server describes as a bare flag: store_true
    where Java's default is false, store_false where it is true (operator_chaining), and
    `--flag=value` is an argparse error at submission."""
    from rescore.pipelines.beam_args import _with_flink_options
    from rescore.pipelines.flink_options import as_beam_passes_them

    assert as_beam_passes_them(["--object_reuse", "--object_reuse=false", "--operator_chaining=false",
                                "--operator_chaining=true", "--max_bundle_size=5"]) == [
        "--object_reuse", "--operator_chaining", "--max_bundle_size=5"]
    assert _with_flink_options([*FLINK, "--object_reuse=true", "--max_bundle_size", "9"]) == [
        *FLINK, "--object_reuse", "--max_bundle_size=9"]


def test_the_local_cluster_runs_the_shipped_cluster_config():
    """tools/flink_local.py's flink-conf.yaml is run_configs/flink_cluster/flink-conf.yaml (the
    recovery keys) with this machine's keys over it, each key once."""
    tool = _flink_local()
    text = tool.cluster_conf({"heartbeat.timeout": "8000", "rest.port": "1234"})
    keys = dict(line.split(": ", 1) for line in text.splitlines())
    assert len(keys) == len(text.splitlines())
    assert keys["restart-strategy.type"] == "fixed-delay" and int(keys["restart-strategy.fixed-delay.attempts"]) >= 3
    assert keys["jobmanager.execution.failover-strategy"] == "region"
    assert keys["heartbeat.timeout"] == "8000" and keys["rest.port"] == "1234"
    shipped = (ROOT / "run_configs" / "flink_cluster" / "flink-conf.yaml").read_text()
    assert "heartbeat.timeout: 20000" in shipped  # the shipped value, which the local cluster overrides


def test_the_cost_settings_reach_every_jvm_and_the_workers():
    """The shipped cost settings (benchmarks/README.md, "Flink against in-process"): the cluster
    config's JVM flags go to the JobManager and TaskManagers the local cluster starts (as Flink's
    start scripts add env.java.opts.*), flink.yaml gives Beam's job server JVM the same and keeps
    a stage's SDK workers for the next stage."""
    tool = _flink_local()
    text = tool.cluster_conf({})
    assert tool.java_opts(text, "jobmanager") == ["-XX:TieredStopAtLevel=1"]
    assert tool.java_opts(text, "taskmanager") == ["-XX:TieredStopAtLevel=1"]
    both = tool.cluster_conf({"env.java.opts.all": "-Da=1 -Db='x y'", "env.java.opts.taskmanager": ""})
    assert tool.java_opts(both, "jobmanager") == ["-Da=1", "-Db=x y", "-XX:TieredStopAtLevel=1"]
    assert tool.java_opts(both, "taskmanager") == ["-Da=1", "-Db=x y"]
    from rescore.pipelines.config_files import load_yaml, pipeline_option_flags

    flags = pipeline_option_flags(load_yaml(str(ROOT / "run_configs" / "flink.yaml"))["pipeline_options"])
    assert "--job_server_jvm_properties=-XX:TieredStopAtLevel=1" in flags
    assert "--environment_cache_millis=10000" in flags


def test_local_paths_are_made_absolute_for_a_clusters_workers(tmp_path, monkeypatch):
    """A TaskManager's SDK worker runs in its own working directory: `data/*.parquet` must reach
    it as the launcher meant it. Other runners and paths with a scheme are left as given."""
    from rescore.pipelines.beam_args import _absolute_for_workers

    monkeypatch.chdir(tmp_path)
    inputs, output = _absolute_for_workers(FLINK, ["data/*.parquet", "s3://bucket/x/*.parquet"], "out/flink")
    assert inputs == [str(tmp_path / "data" / "*.parquet"), "s3://bucket/x/*.parquet"]
    assert output == str(tmp_path / "out" / "flink")
    assert _absolute_for_workers([], ["data/*.parquet"], "out/x") == (["data/*.parquet"], "out/x")
