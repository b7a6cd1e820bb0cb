"""Run configs (YAML, --config): every value must have its type (a string "false" for a boolean is
refused in one line and the finished run kept), good values still work, and the shipped configs
are found by name from any directory."""

from __future__ import annotations

import shutil

import pytest
from cli_runs import cli_many, data, one_error, snapshot  # noqa: F401  (data: fixture)


@pytest.fixture(scope="module")
def refused(data, tmp_path_factory):
    """A run refused before anything runs, set up in a directory of its own and run in a child
    process (cli_runs.py: its own stderr): {name: (exit code, stderr lines, what the test checks
    afterwards)}."""
    base = tmp_path_factory.mktemp("refused")
    out = str(base / "string-false")  # overwrite: "false" in a config file
    shutil.copytree(data["clean"], out)
    config = base / "run.yaml"
    config.write_text(f"input: {data['glob']}\noutput: {out}\nstrategy: opmd\noverwrite: \"false\"\n")
    setup = {"out": out, "before": snapshot(out)}
    [(code, lines)] = cli_many(base / "stderr", ["--config", str(config)])
    return {"string_false": (code, lines, setup)}


@pytest.mark.slow
def test_a_string_false_for_overwrite_is_refused_and_the_run_kept(refused):
    code, lines, setup = refused["string_false"]
    line = one_error(lines)
    assert code == 2 and "'overwrite' must be true or false, got 'false' (a string)" in line
    assert snapshot(setup["out"]) == setup["before"]


@pytest.mark.parametrize("yaml_text, key", [
    ("skip_bad_files: 1", "skip_bad_files"),
    ("incremental: \"yes\"", "incremental"),
    ("buckets: \"8\"", "buckets"),
    ("shard_rows: 10.0", "shard_rows"),
    ("io_threads: true", "io_threads"),
    ("max_reject_fraction: \"0.5\"", "max_reject_fraction"),
    ("max_group_rows: [1]", "max_group_rows"),
    ("wait_for_lock: \"10\"", "wait_for_lock"),
    ("keep_filtered: \"false\"", "keep_filtered"),
    ("audit_columns: 0", "audit_columns"),
    ("input_table: 5", "input_table"),
    ("output_db: true", "output_db"),
    ("device: 1", "device"),
    ("output: 7", "output"),
    ("input: [1, 2]", "input"),
])
def test_config_values_must_have_their_type(tmp_path, yaml_text, key):
    from rescore.pipelines.config import parse_args
    from rescore.transforms.strategies import ConfigError

    config = tmp_path / "run.yaml"
    base = "input: x.parquet\noutput: out\nstrategy: grpo\n"
    config.write_text(base.replace(f"{key}:", "_drop:") if key in ("input", "output") else base)
    text = config.read_text()
    text = "\n".join(line for line in text.splitlines() if not line.startswith("_drop:")) + "\n" + yaml_text + "\n"
    config.write_text(text)
    with pytest.raises(ConfigError, match=f"'{key}' must be"):
        parse_args(["--config", str(config)])


def test_good_config_values_still_work(tmp_path):
    from rescore.pipelines.config import parse_args

    config = tmp_path / "run.yaml"
    config.write_text(
        "input: x.parquet\noutput: out\nstrategy: grpo\noverwrite: true\nmax_reject_fraction: 1\n"
        "wait_for_lock: 2.5\nbuckets: 8\n"
    )
    cfg = parse_args(["--config", str(config)])
    assert cfg.overwrite is True and cfg.max_reject_fraction == 1.0 and cfg.wait_for_lock == 2.5 and cfg.buckets == 8


@pytest.mark.slow
def test_shipped_configs_are_found_from_any_directory(sample, tmp_path, monkeypatch):
    from rescore.errors import ConfigError
    from rescore.pipelines.config import parse_args, shipped_configs

    monkeypatch.chdir(tmp_path)  # no run_configs/ here
    assert set(shipped_configs()) >= {"local", "local_multiprocess", "portable", "flink", "dataflow", "dataflow_gpu"}
    for given in ("local", "local.yaml", "run_configs/local_multiprocess.yaml"):
        cfg = parse_args(["--config", given, "--input", sample, "--output", "out"])
        assert cfg.strategies == ["grpo"] or cfg.strategies == ("grpo",), given
    assert "--direct_running_mode=multi_processing" in " ".join(
        parse_args(["--config", "local_multiprocess", "--input", sample, "--output", "out"]).beam_args)
    with pytest.raises(ConfigError, match=r"cannot read config nope.yaml: .*\(shipped configs: dataflow, "):
        parse_args(["--config", "nope.yaml", "--input", sample, "--output", "out"])
