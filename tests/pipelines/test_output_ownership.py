"""Adversarial runs of the real CLI (issue 13, items 3-9): concurrent runs into one output,
inputs rewritten mid-run, symlinked and foreign output directories, failing --overwrite runs,
odd files in globs, bad config values, and exactly one stderr line for every failure.

Every failure is checked on a subprocess's real stderr (pytest's log capture would hide Beam's
ERROR log and tracebacks).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batched import run_many
from conftest import RUNNER
from data import random_rows, read_output, write_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KEYS = [(k, "ascending") for k in ("batch", "task", "run", "step")]
FAULT = "RESCORE_TEST_INJECT_FAULT"


def _cmd(*args):
    return [sys.executable, "-m", "rescore", *args, RUNNER]


def _env(fault=None):
    env = {k: v for k, v in os.environ.items() if k != FAULT}
    if fault:
        env[FAULT] = fault
    return env


def run_here(*args):
    """A run in this process, where only its outcome matters (no stderr, exit status of a
    process or signal to check): the exit code `rescore` would exit with."""
    from rescore.pipelines.rescore import main

    return main([*args, RUNNER])


def cli_many(tmp_path, *runs, timeout=180):
    """Several CLI runs in one subprocess (batched.py: imports once, each run with its own fd 2):
    [(exit code, non-empty stderr lines)]. A run is an argv list or (argv, fault): the fault is
    armed for that run only."""
    jobs = [(run, None) if isinstance(run, list) else run for run in runs]
    results = run_many(tmp_path, [([*argv, RUNNER], {FAULT: fault}) for argv, fault in jobs], cwd=ROOT, timeout=timeout)
    return [(code, [line for line in err.splitlines() if line.strip()]) for code, err in results]


def start(*args, fault=None):
    return subprocess.Popen(
        _cmd(*args), cwd=ROOT, env=_env(fault), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def finish(proc, timeout=120):
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, [line for line in err.splitlines() if line.strip()]


def wait_for(path, timeout=120):
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def one_error(lines):
    assert len(lines) == 1, lines
    assert lines[0].startswith("rescore: error: "), lines
    return lines[0]


def snapshot(directory):
    """{name: sha256} of every file under `directory` (what must stay intact)."""
    out = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return out


def sorted_scored(out):
    return read_output(out).sort_by(KEYS)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    base = tmp_path_factory.mktemp("trust")
    rows = random_rows(seed=13, batches=4)
    glob = write_parquet(rows, str(base / "in"), files=3, row_group_size=6)
    clean = str(base / "clean")
    assert run_here("--input", glob, "--output", clean, "--strategy", "grpo", "--quiet") == 0
    return {"glob": glob, "rows": len(rows), "clean": clean, "base": base}


@pytest.fixture(scope="module")
def refused(data, tmp_path_factory):
    """Runs refused before anything runs, each set up in a directory of its own, run in one child
    process (batched.py; each with its own stderr): {name: (exit code, stderr lines, what the
    test checks afterwards)}."""
    base = tmp_path_factory.mktemp("refused")
    setups, runs = {}, []

    inp = base / "in"  # an output that is an input directory through a symlink
    glob = write_parquet(random_rows(seed=5), str(inp), files=2)
    link = base / "link"
    link.symlink_to(inp, target_is_directory=True)
    setups["symlink"] = {"input": inp, "before": snapshot(inp)}
    runs.append(["--input", glob, "--output", str(link), "--strategy", "grpo"])

    target = base / "report.txt"  # an output naming an existing file
    target.write_text("keep me")
    setups["file"] = {"target": target}
    runs.append(["--input", data["glob"], "--output", str(target), "--strategy", "grpo"])

    out = str(base / "foreign-filtered")  # a filtered-*.parquet Rescore did not write
    shutil.copytree(data["clean"], out)
    pq.write_table(pa.table({"x": [1]}), os.path.join(out, "filtered-00000-of-00002.parquet"))
    setups["foreign_filtered"] = {"out": out, "before": snapshot(out)}
    runs.append(["--input", data["glob"], "--output", out, "--strategy", "grpo", "--keep-filtered", "--overwrite"])

    out = str(base / "string-false")  # overwrite: "false" in a config file
    shutil.copytree(data["clean"], out)
    config = base / "run.yaml"
    config.write_text(f"input: {data['glob']}\noutput: {out}\nstrategy: opmd\noverwrite: \"false\"\n")
    setups["string_false"] = {"out": out, "before": snapshot(out)}
    runs.append(["--config", str(config)])

    results = cli_many(base / "stderr", *runs)
    return {name: (code, lines, setup) for (name, setup), (code, lines) in zip(setups.items(), results)}


# --- item 3: one run at a time per output ------------------------------------------------------


def test_a_second_run_into_the_same_output_is_refused_naming_the_holder(data, tmp_path):
    out, pause = str(tmp_path / "out"), tmp_path / "pause"
    pause.mkdir()
    first = start("--input", data["glob"], "--output", out, "--strategy", "grpo", "--quiet", fault=f"pause_readback:{pause}")
    try:
        wait_for(pause / "paused")
        (code, lines), (code2, lines2) = cli_many(
            tmp_path,
            ["--input", data["glob"], "--output", out, "--strategy", "opmd", "--quiet"],
            ["--input", data["glob"], "--output", out, "--strategy", "opmd", "--wait-for-lock", "0.5"],
        )
        line = one_error(lines)
        assert code == 2
        assert f"pid {first.pid} on host {socket.gethostname()}, started 20" in line and "--wait-for-lock" in line
        assert code2 == 2 and "after waiting 0.5 s" in one_error(lines2)
        assert not os.path.exists(os.path.join(out, "_SUCCESS"))
    finally:
        (pause / "resume").touch()
        code, lines = finish(first)
    assert code == 0, lines
    assert sorted_scored(out).equals(sorted_scored(data["clean"]))  # only the first run's rows
    assert not os.path.exists(os.path.join(out, "_rescore.lock"))  # released


def test_wait_for_lock_runs_after_the_holder_finishes(data, tmp_path):
    out, pause = str(tmp_path / "out"), tmp_path / "pause"
    pause.mkdir()
    first = start("--input", data["glob"], "--output", out, "--strategy", "opmd", "--quiet", fault=f"pause_readback:{pause}")
    wait_for(pause / "paused")
    second = start("--input", data["glob"], "--output", out, "--strategy", "grpo", "--quiet", "--overwrite", "--wait-for-lock", "120")
    time.sleep(3)
    assert second.poll() is None, finish(second)  # still waiting
    (pause / "resume").touch()
    assert finish(first)[0] == 0
    code, lines = finish(second)
    assert code == 0, lines
    assert json.load(open(os.path.join(out, "metrics.json")))["strategy"] == "grpo"
    assert sorted_scored(out).equals(sorted_scored(data["clean"]))


def test_a_killed_runs_lock_and_leftovers_do_not_block_and_foreign_files_stay(data, tmp_path):
    out, pause = tmp_path / "out", tmp_path / "pause"
    out.mkdir()
    pause.mkdir()
    (out / "notes.txt").write_text("mine")
    first = start("--input", data["glob"], "--output", str(out), "--strategy", "grpo", "--shard-rows", "10",
                  fault=f"pause_readback:{pause}")
    wait_for(pause / "paused")
    time.sleep(0.5)  # let other units stage their files
    os.killpg(first.pid, signal.SIGKILL)
    first.wait(timeout=30)
    lock = out / "_rescore.lock"
    assert str(first.pid) in lock.read_text()  # left behind, naming a dead process
    assert not (out / "_SUCCESS").exists()
    assert run_here("--input", data["glob"], "--output", str(out), "--strategy", "grpo", "--quiet") == 0
    assert sorted_scored(str(out)).equals(sorted_scored(data["clean"]))
    assert not lock.exists() and not (out / "_staging").exists()
    assert (out / "notes.txt").read_text() == "mine"


# --- item 4: inputs that change under a run ----------------------------------------------------


def test_an_input_rewritten_between_the_two_reads_fails_and_publishes_nothing(data, tmp_path):
    inp = tmp_path / "in"
    glob = write_parquet(random_rows(seed=13, batches=4), str(inp), files=3, row_group_size=6)
    out, pause = str(tmp_path / "out"), tmp_path / "pause"
    pause.mkdir()
    proc = start("--input", glob, "--output", out, "--strategy", "grpo", fault=f"pause_readback:{pause}")
    wait_for(pause / "paused")
    victim = str(inp / "part-1.parquet")
    table = pq.read_table(victim)  # same rows, same row count, rewards reversed
    table = table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(table["reward"].to_pylist()[::-1]))
    pq.write_table(table, victim, row_group_size=6)
    (pause / "resume").touch()
    code, lines = finish(proc)
    line = one_error(lines)
    assert code == 1 and victim in line and "changed while the run was reading it" in line
    assert not os.path.exists(os.path.join(out, "_SUCCESS"))
    assert not [n for n in os.listdir(out) if n.startswith(("scored-", "rejected-"))]


def test_an_input_changed_after_every_read_still_fails_before_publishing(data, tmp_path):
    inp = tmp_path / "in"
    glob = write_parquet(random_rows(seed=13, batches=4), str(inp), files=3, row_group_size=6)
    out, pause = tmp_path / "out", tmp_path / "pause"
    pause.mkdir()
    proc = start("--input", glob, "--output", str(out), "--strategy", "grpo", fault=f"pause_finalize:{pause}")
    wait_for(pause / "paused")
    victim = inp / "part-2.parquet"
    os.utime(victim)  # even a touch: the scores were computed from a file that is no longer there
    (pause / "resume").touch()
    code, lines = finish(proc)
    line = one_error(lines)
    assert code == 1 and str(victim) in line and "changed while the run was reading it" in line
    assert not (out / "_SUCCESS").exists() and not [n for n in os.listdir(out) if n.startswith(("scored-", "rejected-"))]


def test_a_rewrite_that_keeps_size_and_mtime_is_caught_by_ctime(tmp_path):
    from rescore.transforms.files.fingerprint import InputChanged, take, verify

    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.table({"reward": [0.0, 1.0]}), path)
    planned = take(path)
    st = os.stat(path)
    pq.write_table(pa.table({"reward": [1.0, 0.0]}), path)  # same size and footer
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back
    assert os.path.getsize(path) == st.st_size
    with pytest.raises(InputChanged, match="changed while the run was reading it"):
        verify(path, planned)


# --- item 5: never delete what is not ours; never lose the last good output -------------------


def test_output_that_is_an_input_directory_through_a_symlink_is_refused(refused):
    code, lines, setup = refused["symlink"]
    assert code == 2 and "holds input file" in one_error(lines)
    assert snapshot(setup["input"]) == setup["before"]


def test_output_naming_an_existing_file_fails_before_anything_runs(refused):
    code, lines, setup = refused["file"]
    assert code == 2 and "is a file, not a directory" in one_error(lines)
    assert setup["target"].read_text() == "keep me"


def test_foreign_files_in_the_output_are_never_deleted(data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    pq.write_table(pa.table({"x": [1]}), out / "mine.parquet")
    before = snapshot(out)
    assert run_here("--input", data["glob"], "--output", str(out), "--strategy", "grpo", "--quiet") == 0
    after = snapshot(out)
    assert {k: after[k] for k in before} == before
    assert sorted_scored(str(out)).num_rows == data["rows"]
    # Replacing the run replaces only Rescore's files.
    assert run_here("--input", data["glob"], "--output", str(out), "--strategy", "opmd", "--quiet", "--overwrite") == 0
    after = snapshot(out)
    assert {k: after[k] for k in before} == before

    # A file with one of Rescore's names that Rescore did not write: refused, kept; in a fresh
    # directory and in one that holds a Rescore run.
    clash = tmp_path / "clash"
    clash.mkdir()
    pq.write_table(pa.table({"x": [1]}), clash / "scored-00000-of-00001.parquet")
    (clash / "metrics.json").write_text("{}")
    pq.write_table(pa.table({"x": [1]}), out / "scored-99999-of-99999.parquet")
    before, before_out = snapshot(clash), snapshot(out)
    results = cli_many(
        tmp_path,
        ["--input", data["glob"], "--output", str(clash), "--strategy", "grpo"],
        ["--input", data["glob"], "--output", str(clash), "--strategy", "grpo", "--overwrite"],
        ["--input", data["glob"], "--output", str(out), "--strategy", "grpo", "--overwrite"],
    )
    for code, lines in results:
        assert code == 2 and "which Rescore did not write" in one_error(lines)
    assert snapshot(clash) == before and snapshot(out) == before_out


def test_a_foreign_filtered_file_in_a_rescore_output_is_refused(refused):
    """A filtered-*.parquet Rescore did not write is a stray like a scored-*: refused, kept."""
    code, lines, setup = refused["foreign_filtered"]
    assert code == 2 and "holds 'filtered-00000-of-00002.parquet', which Rescore did not write" in one_error(lines)
    assert snapshot(setup["out"]) == setup["before"]


def test_a_one_shot_run_into_an_incremental_table_is_refused(data, tmp_path):
    """With or without --overwrite: replacing a Delta table by a one-shot run is not what it means."""
    table = str(tmp_path / "inc")
    assert run_here("--input", data["glob"], "--output", table, "--strategy", "grpo", "--incremental", "--quiet") == 0
    before = snapshot(table)
    results = cli_many(
        tmp_path,
        ["--input", data["glob"], "--output", table, "--strategy", "grpo"],
        ["--input", data["glob"], "--output", table, "--strategy", "grpo", "--overwrite"],
    )
    for code, lines in results:
        line = one_error(lines)
        assert code == 2 and "is an incremental table (_delta_log): write one-shot runs to a directory of their own" in line
    assert snapshot(table) == before


def test_overwriting_an_output_from_before_the_ledger_removes_its_report_and_filtered_files(data, tmp_path):
    out = str(tmp_path / "leg")
    shutil.copytree(data["clean"], out)
    os.remove(os.path.join(out, "_rescore_files.json"))  # an output from before the ledger
    from rescore.pipelines.rescore import main

    assert main(["report", out]) == 0
    assert os.path.exists(os.path.join(out, "report.html"))
    scored = sorted(n for n in os.listdir(out) if n.startswith("scored-"))[0]  # as a --keep-filtered run left it
    shutil.copy(os.path.join(out, scored), os.path.join(out, "filtered-00000-of-00001.parquet"))
    assert run_here("--input", data["glob"], "--output", out, "--strategy", "rloo", "--overwrite", "--quiet") == 0
    left = sorted(os.listdir(out))
    assert not [n for n in left if n.startswith(("report", "filtered-"))], left  # nothing of the grpo run
    assert json.load(open(os.path.join(out, "metrics.json")))["strategy"] == "rloo"


def test_a_failing_overwrite_run_keeps_the_previous_output(data, tmp_path):
    out = str(tmp_path / "out")
    shutil.copytree(data["clean"], out)
    before = snapshot(out)
    rows = random_rows(seed=13, batches=4)
    rows[0]["reward"] = float("nan")
    bad = write_parquet(rows, str(tmp_path / "bad"), files=2)
    (code, lines), (code2, lines2) = cli_many(
        tmp_path,
        (["--input", data["glob"], "--output", out, "--strategy", "opmd", "--overwrite"], f"fail_once:{tmp_path / 'marker'}"),
        ["--input", bad, "--output", out, "--strategy", "opmd", "--overwrite", "--max-reject-fraction", "0"],
    )
    assert code == 1 and "injected fault" in one_error(lines)
    line = one_error(lines2)
    assert code2 == 1 and "_failed" in line and "left as it was" in line
    assert read_output(os.path.join(out, "_failed"), "rejected").num_rows == 1
    after = snapshot(out)
    assert {k: v for k, v in after.items() if not k.startswith(("_staging", "_failed"))} == before
    assert sorted_scored(out).equals(sorted_scored(data["clean"]))

    # A later good run replaces it whole: nothing of the old run (another file layout) survives.
    assert run_here("--input", data["glob"], "--output", out, "--strategy", "grpo", "--overwrite", "--quiet",
                    "--shard-rows", "4") == 0
    names = sorted(os.listdir(out))
    assert len([n for n in names if n.startswith("scored-")]) > 3
    assert "_failed" not in names and "_staging" not in names
    assert sorted_scored(out).equals(sorted_scored(data["clean"]))


# --- item 6: odd files in globs ----------------------------------------------------------------


def test_odd_files_in_a_glob_stop_the_run_or_are_skipped_and_never_block(data, tmp_path):
    inp = tmp_path / "in"
    rows = [r for r in random_rows(seed=6) if len(r["tokens"]) > r["prompt_length"]]
    rows[0]["tokens"][-1] = None  # item 7: a null element is a null_value rejection
    write_parquet(rows, str(inp), files=1)
    os.mkfifo(inp / "pipe.parquet")
    (inp / "gone.parquet").symlink_to(tmp_path / "nowhere.parquet")
    (inp / "dir.parquet").mkdir()
    glob = str(inp / "*.parquet")
    out = str(tmp_path / "out")
    only_pipe = tmp_path / "pipe-only"
    only_pipe.mkdir()
    os.mkfifo(only_pipe / "p.parquet")
    results = cli_many(
        tmp_path,
        ["--input", glob, "--output", out, "--strategy", "grpo"],
        ["--input", str(inp / "gone.parquet"), "--output", out, "--strategy", "grpo"],
        ["--input", str(only_pipe), "--output", out, "--strategy", "grpo"],
        ["--input", "/dev/zero", "--output", out, "--strategy", "grpo"],
        ["--input", str(only_pipe), "--output", out, "--strategy", "grpo", "--skip-bad-files"],
        timeout=60,
    )
    expected = [
        f"{inp / 'dir.parquet'}: a directory, not a Parquet file",
        f"{inp / 'gone.parquet'}: a dangling symlink, not a Parquet file",
        f"{only_pipe / 'p.parquet'}: a FIFO (named pipe), not a Parquet file",
        "/dev/zero: a device, not a Parquet file",
        "no readable input files: all 1 were skipped",
    ]
    for (code, lines), message in zip(results, expected):
        assert code == 2 and message in one_error(lines)
    assert not os.path.exists(out)
    (inp / "dir.parquet").rmdir()

    assert run_here("--input", glob, "--output", out, "--strategy", "grpo", "--skip-bad-files", "--quiet") == 0
    skipped = json.load(open(os.path.join(out, "metrics.json")))["skipped_files"]
    assert [s["path"] for s in skipped] == [str(inp / "gone.parquet"), str(inp / "pipe.parquet")]
    assert "FIFO" in skipped[1]["reason"]
    rejected = read_output(out, "rejected")
    assert rejected.num_rows == 1 and rejected["reject_reason"][0].as_py() == "null_value: tokens has a null element"
    assert read_output(out).num_rows == len(rows) - 1


# --- item 7: row checks ------------------------------------------------------------------------


def test_null_list_elements_are_null_value_rejections(tmp_path):
    from rescore.schemas.validation import check_rows

    table = pa.table({
        "batch": [0, 0, 0, 0], "task": [1, 1, 1, 1], "run": [0, 1, 2, 3], "reward": [1.0, 0.0, 0.5, 0.2],
        "tokens": pa.array([[1, 2, None], [1, 2, 3], [1, 2, 3], [1, 2, 3]], pa.list_(pa.int64())),
        "prompt_length": [1, 1, 1, 1],
        "logprobs": pa.array([[-0.1, -0.2], [None, -0.1], [-0.1, -0.1], [-0.1, -0.1]], pa.list_(pa.float32())),
    })
    used = check_rows(table, needs=("logprobs",))
    assert used.ok.tolist() == [False, False, True, True]
    assert used.reasons[0] == "null_value: tokens has a null element"
    assert used.reasons[1].startswith("null_value: logprobs has a null element")
    unused = check_rows(table)  # logprobs the strategy does not read are passed through
    assert unused.ok.tolist() == [False, True, True, True]


def test_values_past_int64_or_float64_fail_naming_file_and_column(tmp_path):
    cases = [
        ("batch", [0, 2**63], pa.uint64(), "column 'batch' (uint64) holds 9223372036854775808"),
        ("run", [0, 2**64 - 1], pa.uint64(), "column 'run' (uint64) holds 18446744073709551615"),
        ("reward", [1, -(2**60)], pa.int64(), "column 'reward' holds the integer -1152921504606846976"),
    ]
    runs = []
    for i, (column, values, type_, _) in enumerate(cases):
        cols = {"batch": pa.array([0, 0], pa.int64()), "task": [1, 1], "run": pa.array([0, 1], pa.int64()), "reward": [0.0, 1.0]}
        cols[column] = pa.array(values, type_)
        path = tmp_path / f"in{i}" / "big.parquet"
        path.parent.mkdir()
        pq.write_table(pa.table(cols), path, write_statistics=i != 1)  # no statistics: the column is read
        runs.append(["--input", str(path), "--output", str(tmp_path / "out"), "--strategy", "grpo"])
    for (code, lines), run, (_, _, _, message) in zip(cli_many(tmp_path, *runs), runs, cases):
        line = one_error(lines)
        assert code == 2 and run[1] in line and message in line


# --- item 8: typed config values ---------------------------------------------------------------


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


# --- item 9: one line on stderr ----------------------------------------------------------------


def test_a_pipeline_failure_is_one_line_and_debug_shows_the_traceback(data, tmp_path):
    out = str(tmp_path / "out")
    (code, lines), (code2, lines2) = cli_many(
        tmp_path,
        (["--input", data["glob"], "--output", out, "--strategy", "grpo"], f"fail_once:{tmp_path / 'm1'}"),
        (["--input", data["glob"], "--output", out, "--strategy", "grpo", "--log-level", "DEBUG"], f"fail_once:{tmp_path / 'm2'}"),
    )
    assert code == 1 and "pipeline failed: injected fault in ScoreGroups" in one_error(lines)
    code, lines = code2, lines2
    assert code == 1 and any("Traceback" in line for line in lines)
    assert lines[-1].startswith("rescore: error: pipeline failed: injected fault")


def test_a_failure_in_worker_processes_is_one_line(data, tmp_path):
    """Beam's worker processes write their tracebacks to the stderr they inherit; the console
    script (a process of its own: batched.py calls main(), not it) drops them after a failure."""
    code, lines = finish(start("--input", data["glob"], "--output", str(tmp_path / "out"), "--strategy", "grpo",
                               "--direct_running_mode=multi_processing", "--direct_num_workers=2",
                               fault=f"fail_once:{tmp_path / 'marker'}"))
    assert code == 1 and "injected fault in ScoreGroups" in one_error(lines)


def test_ctrl_c_prints_the_interrupted_line(data, tmp_path):
    out = str(tmp_path / "out")
    shutil.copytree(data["clean"], out)
    before = snapshot(out)
    pause = tmp_path / "pause"
    pause.mkdir()
    proc = start("--input", data["glob"], "--output", out, "--strategy", "opmd", "--overwrite",
                 fault=f"pause_readback:{pause}")
    wait_for(pause / "paused")
    proc.send_signal(signal.SIGINT)
    code, lines = finish(proc, timeout=60)
    assert code == 1 and lines == [
        "rescore: interrupted; this run published nothing (an earlier finished run in the output is left as it was)"
    ], lines
    after = snapshot(out)
    assert {k: v for k, v in after.items() if not k.startswith(("_staging", "_rescore.lock"))} == before
    # The lock went with the process: the next run can take it at once.
    from rescore.transforms.files.lock import acquire

    acquire(out).release()


# --- item 3 on GCS: create-if-absent with generation preconditions (a fake bucket) --------------


class _FakeGcs:
    """The few google.cloud.storage calls the lock makes, with GCS's generation preconditions."""

    def __init__(self):
        import datetime

        self.objects = {}  # name -> (generation, bytes, updated)
        self.next_generation = 1
        self.datetime = datetime

    def bucket(self, _name):
        return self

    def blob(self, name):
        return _FakeBlob(self, name)

    def get_blob(self, name):
        if name not in self.objects:
            return None
        blob = _FakeBlob(self, name)
        blob.generation, _, blob.updated = self.objects[name]
        return blob


class _FakeBlob:
    def __init__(self, store, name):
        self.store, self.name, self.generation, self.updated = store, name, None, None

    def _check(self, match):
        from google.api_core import exceptions

        current = self.store.objects.get(self.name, (0,))[0]
        if match is not None and current != match:
            raise exceptions.PreconditionFailed("generation mismatch")

    def upload_from_string(self, data, if_generation_match=None):
        self._check(if_generation_match)
        self.generation = self.store.next_generation
        self.store.next_generation += 1
        now = self.store.datetime.datetime.now(self.store.datetime.timezone.utc)
        self.store.objects[self.name] = (self.generation, data.encode(), now)

    def download_as_bytes(self, if_generation_match=None):
        self._check(if_generation_match)
        return self.store.objects[self.name][1]

    def delete(self, if_generation_match=None):
        from google.api_core import exceptions

        if self.name not in self.store.objects:
            raise exceptions.NotFound("gone")
        self._check(if_generation_match)
        del self.store.objects[self.name]


def test_gcs_lock_is_exclusive_and_a_stale_one_is_taken_over():
    pytest.importorskip("google.api_core", reason="the GCS lock needs google-cloud-storage (the gcp extra)")
    import datetime

    from rescore.transforms.files.lock import GcsLock, LockBusy

    store, path = _FakeGcs(), "gs://bucket/out/_rescore.lock"
    first = GcsLock(path, store).acquire("gs://bucket/out", 0)
    with pytest.raises(LockBusy, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
        GcsLock(path, store).acquire("gs://bucket/out", 0)
    # No heartbeat for 11 minutes: taken over; the old holder's release leaves the new lock alone.
    gen, data, _ = store.objects["out/_rescore.lock"]
    old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=11)
    store.objects["out/_rescore.lock"] = (gen, data, old)
    second = GcsLock(path, store).acquire("gs://bucket/out", 0)
    first.release()
    assert store.objects["out/_rescore.lock"][0] == second.generation
    second.release()
    assert "out/_rescore.lock" not in store.objects
    # A holder that is a dead process on this host: taken over at once.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    info = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "2026-01-01T00:00:00Z"}
    _FakeBlob(store, "out/_rescore.lock").upload_from_string(json.dumps(info), if_generation_match=0)
    GcsLock(path, store).acquire("gs://bucket/out", 0).release()
