"""The command line end to end, as a user runs it: exit codes, files, one-line errors."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batched import run_many
from data import random_rows, write_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cli(*args, cwd=ROOT):
    proc = subprocess.run(
        [sys.executable, "-m", "rescore", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli")
    write_parquet(random_rows(seed=21), str(d / "in"), files=2, row_group_size=6)
    return d


@pytest.mark.slow
def test_run_writes_outputs_and_a_summary(data_dir):
    out = data_dir / "out"
    (code, err), (code2, err2) = run_many(data_dir, [
        ["--input", str(data_dir / "in" / "*.parquet"), "--output", str(out), "--strategy", "correct_bias",
         "--set", "rank_penalty=0.3", "--runner=FnApiRunner"],
        ["--input", str(data_dir / "in"), "--output", str(out), "--strategy", "grpo"],
    ])  # one child process (batched.py), each run with its own stderr
    assert code == 0, err
    assert (out / "_SUCCESS").exists()
    doc = json.loads((out / "metrics.json").read_text())
    assert doc["strategy"] == "correct_bias" and doc["params"]["correct_bias"]["rank_penalty"] == 0.3
    assert "rows read" in err and "correct_bias done" in err and "rows/s" in err

    assert code2 == 2 and err2.strip().endswith("pass --overwrite to replace it")


BAD_CONFIGS = [
        (["--strategy", "nope"], "unknown strategy 'nope'; `rescore strategies` lists all "),
        (["--strategy", "grpoo"], "unknown strategy 'grpoo' (did you mean 'grpo', 'rloo' or 'gdpo'?); `rescore strategies` lists all "),
        (["--strategy", "grpo", "--set", "gamma=1"], "unknown parameter 'gamma' for strategy 'grpo'; valid parameters:"),
        (["--strategy", "grpo", "--set", "std_cal_level=global"], "parameter 'std_cal_level' must be one of group, batch"),
        (["--strategy", "grpo", "--set", "epsilon"], "--set expects KEY=VALUE"),
        (["--strategy", "grpo", "--runnr=x"], "unknown option --runnr (did you mean --runner?)"),
        (["--strategy", "grpo", "--buckets", "0"], "--buckets must be a positive integer"),
        ([], "no strategy: pass --strategy NAME or --algorithm NAME (`rescore strategies` lists all "),
        # a misspelt flag is named as such, before the strategy it was meant to give is missed
        (["--stratgy", "grpo"], "unknown option --stratgy (did you mean --strategy?)"),
        (["--strategy", "grpo,reward_variance"], "strategies run in the order filter, advantage, duplicate"),
        (["--strategy", "grpo,opmd"], "at most one advantage strategy per run"),
        (["--strategy", "reward_variance,duplicate_informative", "--set", "variance_threshold=1"],
         "write it as reward_variance.variance_threshold"),
        (["--strategy", "grpo", "--set", "opmd.tau=2"], "names strategy 'opmd', which this run does not use"),
        (["--algorithm", "ppo"], "algorithm 'ppo' cannot be rescored offline: its advantages come from a learned critic"),
        (["--algorithm", "dpo"], "algorithm 'dpo' cannot be rescored offline"),
        (["--algorithm", "on_policy_distill"], "missing column 'teacher_logprobs', which the chosen strategy needs"),
        (["--algorithm", "grpoo"], "unknown algorithm 'grpoo' (did you mean 'grpo'?)"),
        (["--algorithm", "grpo", "--strategy", "grpo"], "pass --strategy or --algorithm, not both"),
        (["--strategy", "mix_chord"], "missing column 'expert', which the chosen strategy needs"),
        (["--strategy", "grpo", "--io-threads", "-1"], "--io-threads must be 0 (one per core) or a positive integer, got -1"),
]


@pytest.fixture(scope="module")
def bad_config_runs(data_dir, tmp_path_factory):
    """Every BAD_CONFIGS command line, in one child process (batched.py): {args: (code, stderr, output)}."""
    work = tmp_path_factory.mktemp("bad-configs")
    outs = [work / f"o{i}" for i in range(len(BAD_CONFIGS))]
    runs = run_many(work, [["--input", str(data_dir / "in"), "--output", str(o), *a] for o, (a, _) in zip(outs, BAD_CONFIGS)])
    return {tuple(a): (code, err, o) for (a, _), (code, err), o in zip(BAD_CONFIGS, runs, outs)}


@pytest.mark.parametrize("args, message", BAD_CONFIGS)
def test_bad_configuration_fails_with_one_line(bad_config_runs, args, message):
    code, err, out = bad_config_runs[tuple(args)]
    assert code == 2
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("rescore: error: ") and message in lines[0], err
    assert not out.exists()


@pytest.mark.slow
def test_missing_column_names_file_and_column(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"batch": [0], "task": [1], "run": [0]}), d / "norew.parquet")
    code, _, err = cli("--input", str(d / "*.parquet"), "--output", str(tmp_path / "o"), "--strategy", "grpo")
    assert code == 2
    assert err.strip() == f"rescore: error: {d / 'norew.parquet'}: missing required column 'reward'; the file's columns: batch, task, run"


@pytest.mark.slow
def test_wrong_type_and_missing_logprobs(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"batch": [0], "task": [1], "run": [0], "reward": ["1.0"]}), d / "s.parquet")
    d2 = tmp_path / "in2"
    d2.mkdir()
    pq.write_table(pa.table({"batch": [0], "task": [1], "run": [0], "reward": [1.0]}), d2 / "s.parquet")
    (code, err), (code2, err2) = run_many(tmp_path, [
        ["--input", str(d), "--output", str(tmp_path / "o"), "--strategy", "grpo"],
        ["--input", str(d2), "--output", str(tmp_path / "o"), "--strategy", "correct_bias"],
    ])  # one child process (batched.py), each run with its own stderr
    assert code == 2 and "column 'reward' has type string, expected a float" in err
    assert code2 == 2 and "missing column 'logprobs', which the chosen strategy needs" in err2


@pytest.mark.slow
def test_unreadable_and_unmatched_input(tmp_path):
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    (code, err), (code2, err2) = run_many(tmp_path, [
        ["--input", str(tmp_path / "none*.parquet"), "--output", str(tmp_path / "o"), "--strategy", "grpo"],
        ["--input", str(bad), "--output", str(tmp_path / "o"), "--strategy", "grpo"],
    ])  # one child process (batched.py), each run with its own stderr
    assert code == 2 and "no input files match" in err
    assert code2 == 2 and f"{bad}: not a readable Parquet file" in err2


@pytest.mark.slow
def test_config_file_with_flag_overrides(data_dir, tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text(
        "strategy: grpo\nparams: {std_cal_level: batch, epsilon: 0.001}\n"
        f"input: {data_dir / 'in'}\noutput: {tmp_path / 'o'}\npipeline_options: {{runner: FnApiRunner}}\n"
    )
    typo = tmp_path / "typo.yaml"
    typo.write_text("strategy: grpo\nbukets: 3\n")
    (code, err), (code2, err2) = run_many(tmp_path, [["--config", str(cfg), "--set", "epsilon=0.01", "--quiet"],
                                                     ["--config", str(typo)]], cwd=ROOT)  # batched.py
    assert code == 0, err
    assert err.strip() == ""
    doc = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert doc["params"]["grpo"]["std_cal_level"] == "batch" and doc["params"]["grpo"]["epsilon"] == 0.01

    assert code2 == 2 and "unknown key 'bukets'" in err2


@pytest.mark.slow
def test_shipped_local_config_runs(data_dir, tmp_path):
    code, _, err = cli("--config", "run_configs/local.yaml", "--input", str(data_dir / "in"), "--output", str(tmp_path / "o"))
    assert code == 0, err


@pytest.mark.slow
def test_sample_command_and_console_script_agree(tmp_path):
    code = subprocess.run([sys.executable, "-m", "rescore", "sample", "--output", str(tmp_path / "s"),
                           "--batches", "2", "--tasks", "3"], cwd=ROOT, capture_output=True, text=True).returncode
    assert code == 0
    t = pq.read_table(str(tmp_path / "s"))
    assert t.num_rows == 2 * 3 * 8
    assert set(t.column_names) >= {"batch", "task", "run", "reward", "tokens", "prompt_length", "logprobs", "action_mask"}


def test_yaml_strategy_list_with_nested_params(tmp_path):
    from rescore.pipelines.config import parse_args
    from rescore.transforms.strategies import build_chain

    cfg = tmp_path / "polaris.yaml"
    cfg.write_text(
        "input: in/*.parquet\noutput: out\n"
        "strategy: [reward_variance, grpo, duplicate_informative]\n"
        "params:\n  grpo: {std_cal_level: batch}\n  duplicate_informative: {seed: 3}\n"
    )
    rc = parse_args(["--config", str(cfg), "--set", "reward_variance.variance_threshold=0.1"])
    plan = build_chain(rc.strategies, rc.params)
    assert [s.name for s in plan.stages] == ["reward_variance", "grpo", "duplicate_informative"]
    assert plan.params["grpo"]["std_cal_level"] == "batch"
    assert plan.params["duplicate_informative"]["seed"] == 3
    assert plan.params["reward_variance"]["variance_threshold"] == 0.1
    # A flag replaces the YAML's choice of strategy; an algorithm replaces it too.
    assert parse_args(["--config", str(cfg), "--strategy", "opmd"]).strategies == ["opmd"]
    rc = parse_args(["--config", str(cfg), "--algorithm", "rloo"])
    assert rc.strategies == ["rloo"] and rc.algorithm == "rloo"
    assert parse_args(["--input", "x", "--output", "y", "--strategy", "reward_variance", "--strategy", "grpo"]).strategies == [
        "reward_variance", "grpo"]


@pytest.mark.slow
def test_console_entry_exits_fast_with_the_right_code_and_flushed_output(data_dir, tmp_path):
    """The `rescore` script (pipelines.cli) leaves via os._exit: exit codes and stderr must survive it."""
    entry = [sys.executable, "-c", "from pipelines.cli import main; main()"]
    out = tmp_path / "o"
    proc = subprocess.run([*entry, "--input", str(data_dir / "in"), "--output", str(out), "--strategy", "grpo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "rows read" in proc.stderr and "grpo done" in proc.stderr
    assert (out / "_SUCCESS").exists() and json.loads((out / "metrics.json").read_text())["totals"]["rows_read"] > 0
    proc = subprocess.run([*entry, "--input", str(data_dir / "in"), "--output", str(out), "--strategy", "grpoo"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.startswith("rescore: error: unknown strategy 'grpoo'"), proc.stderr
