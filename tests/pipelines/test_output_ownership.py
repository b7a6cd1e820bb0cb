"""Never delete what is not ours; never lose the last good output: an output that is an input
directory through a symlink or names an existing file, foreign files (and files with Rescore's
names that Rescore did not write) in the output, a one-shot run into an incremental table,
--overwrite over an output from before the ledger, and a failing --overwrite run.

Every refusal is checked on a subprocess's real stderr (cli_runs.py; pytest's log capture would
hide Beam's ERROR log and tracebacks).
"""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_runs import cli_many, data, one_error, run_here, snapshot, sorted_scored  # noqa: F401  (data: fixture)
from data import random_rows, read_output, write_parquet


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

    results = cli_many(base / "stderr", *runs)
    return {name: (code, lines, setup) for (name, setup), (code, lines) in zip(setups.items(), results)}


def test_output_that_is_an_input_directory_through_a_symlink_is_refused(refused):
    code, lines, setup = refused["symlink"]
    assert code == 2 and "holds input file" in one_error(lines)
    assert snapshot(setup["input"]) == setup["before"]


def test_output_naming_an_existing_file_fails_before_anything_runs(refused):
    code, lines, setup = refused["file"]
    assert code == 2 and "is a file, not a directory" in one_error(lines)
    assert setup["target"].read_text() == "keep me"


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_overwriting_an_output_from_before_the_ledger_removes_its_report_and_filtered_files(data, tmp_path):
    out = str(tmp_path / "leg")
    shutil.copytree(data["clean"], out)
    os.remove(os.path.join(out, "_rescore_files.json"))  # an output from before the ledger
    from rescore.pipelines.cli import main

    assert main(["report", out]) == 0
    assert os.path.exists(os.path.join(out, "report.html"))
    scored = sorted(n for n in os.listdir(out) if n.startswith("scored-"))[0]  # as a --keep-filtered run left it
    shutil.copy(os.path.join(out, scored), os.path.join(out, "filtered-00000-of-00001.parquet"))
    assert run_here("--input", data["glob"], "--output", out, "--strategy", "rloo", "--overwrite", "--quiet") == 0
    left = sorted(os.listdir(out))
    assert not [n for n in left if n.startswith(("report", "filtered-"))], left  # nothing of the grpo run
    assert json.load(open(os.path.join(out, "metrics.json")))["strategy"] == "rloo"


@pytest.mark.slow
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
