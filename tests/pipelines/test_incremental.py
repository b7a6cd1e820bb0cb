"""Scheduled incremental rescoring (issue 15): the batch is the unit of work, superseding is
one Delta commit, files are known by canonical location + content, runs never mix.

After every scenario the table's current rows must equal a one-shot run over the inputs
present at that moment (same ids, scores within 1e-6), with no duplicate ids."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batched import ForkedRuns, run_many
from data import SCHEMA_INT_TASK, random_rows

pytest.importorskip("deltalake", reason="incremental runs write a Delta Lake table (the [test] extra installs deltalake)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = "--runner=FnApiRunner"
STRATEGY = ["--strategy", "reward_variance,grpo,duplicate_informative", "--set", "std_cal_level=batch"]
ID = ("batch", "task", "run", "step")


# --- helpers ------------------------------------------------------------------------------


def experience(seed, **kwargs):
    """random_rows whose every batch keeps an informative group (a reward_variance filter that
    empties a batch is issue 13's, not this file's)."""
    while True:
        rows = random_rows(seed, **kwargs)
        groups = {}
        for r in rows:
            groups.setdefault((r["batch"], r["task"]), set()).add(r["reward"])
        if all(any(len(v) > 1 for (b, _), v in groups.items() if b == batch) for batch in {b for b, _ in groups}):
            return rows
        seed += 1000


def write(rows, path, row_group_size=5):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA_INT_TASK), path, row_group_size=row_group_size)


def one_shot(inputs, out):
    from rescore.pipelines.load import load_scored
    from rescore.pipelines.cli import run

    argv = [a for p in inputs for a in ("--input", p)]
    run([*argv, "--output", out, RUNNER, "--quiet", *STRATEGY])
    return load_scored(out)


def incremental(inputs, out, *extra, capsys=None):
    """In-process `rescore --incremental`: (exit code, stderr)."""
    from rescore.pipelines.cli import main

    argv = [a for p in inputs for a in ("--input", p)]
    code = main([*argv, "--output", out, "--incremental", RUNNER, *STRATEGY, *extra])
    return code, (capsys.readouterr().err if capsys else "")


def subprocess_incremental(inputs, out, *extra, env=None):
    argv = [a for p in inputs for a in ("--input", p)]
    return subprocess.Popen(
        [sys.executable, "-m", "rescore", *argv, "--output", out, "--incremental", RUNNER, *STRATEGY, *extra],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )


def keyed(table):
    cols = [c for c in (*ID, "copy_index") if c in table.column_names]
    rows = table.select([*cols, "score", "advantages"]).to_pylist()
    out = {}
    for r in rows:
        key = tuple(r[c] for c in cols)
        assert key not in out, f"duplicate id {key}"
        out[key] = r
    return out


def assert_same_rows(current, expected):
    got, want = keyed(current), keyed(expected)
    assert set(got) == set(want), (sorted(set(got) ^ set(want))[:5], len(got), len(want))
    for key, w in want.items():
        g = got[key]
        if w["score"] is None:
            assert g["score"] is None, key
            continue
        assert abs(g["score"] - w["score"]) <= 1e-6, (key, g["score"], w["score"])
        np.testing.assert_allclose(g["advantages"] or [], w["advantages"] or [], atol=1e-6)


def current(out):
    from rescore.pipelines.load import load_scored

    return load_scored(out)


@pytest.fixture
def days(tmp_path):
    """Four batches; every (batch, task) group is split across day 1 and day 2 (runs by parity),
    and day 2 also brings a new batch."""
    rows = experience(11, batches=4, max_tasks=5, max_runs=6)
    first = [r for r in rows if r["batch"] < 3 and r["run"] % 2 == 0]
    second = [r for r in rows if r["batch"] < 3 and r["run"] % 2 == 1] + [r for r in rows if r["batch"] == 3]
    inp = tmp_path / "in"
    return inp, first, second


# --- the scenarios ------------------------------------------------------------------------


def test_group_split_across_two_arrivals_is_scored_whole(tmp_path, days, capsys):
    inp, first, second = days
    out = str(tmp_path / "table")
    write(first, str(inp / "day1.parquet"))
    code, err = incremental([str(inp / "*.parquet")], out, "--run-name", "run=day1", capsys=capsys)
    assert code == 0, err
    assert "committed table version 0" in err
    assert_same_rows(current(out), one_shot([str(inp / "day1.parquet")], str(tmp_path / "ref1")))

    write(second, str(inp / "day2.parquet"))
    code, err = incremental([str(inp / "*.parquet")], out, "--run-name", "run=day2", capsys=capsys)
    assert code == 0, err
    whole = one_shot([str(inp / "*.parquet")], str(tmp_path / "ref2"))
    assert_same_rows(current(out), whole)
    # The groups really were split: day 1 alone scores them differently.
    alone = keyed(one_shot([str(inp / "day1.parquet")], str(tmp_path / "ref3")))
    both = keyed(whole)
    assert any(k in both and both[k]["score"] != v["score"] for k, v in alone.items())

    doc = json.load(open(os.path.join(out, "_rescore", "runs", "run=day2", "metrics.json")))
    assert doc["incremental"]["new_files"] == 1 and doc["incremental"]["batches_rescored"] == 4
    assert doc["incremental"]["source_files"] == 2  # day 1's file was read again for its batches
    assert not [n for n in os.listdir(os.path.join(out, "_rescore", "runs", "run=day2")) if n.startswith("scored-")]

    # Nothing new: exit 0, one clear line, the table untouched.
    code, err = incremental([str(inp / "*.parquet")], out, capsys=capsys)
    assert code == 0 and err.strip().startswith("rescore: nothing new to score: all 2 input files are already scored")
    assert "table version 1" in err
    assert_same_rows(current(out), whole)


@pytest.mark.slow
def test_several_days_of_arriving_changing_and_deleted_files(tmp_path, capsys):
    """Row groups that span batches (statistics are ranges), groups split over up to three
    files, string task ids; after each day the table equals a one-shot run over what is there."""
    rows = experience(21, batches=6, max_tasks=4, max_runs=7, string_tasks=True)
    inp, out = tmp_path / "in", str(tmp_path / "table")
    parts = {k: [r for r in rows if r["run"] % 3 == k] for k in range(3)}
    schema = SCHEMA_INT_TASK.set(SCHEMA_INT_TASK.get_field_index("task"), pa.field("task", pa.string()))

    def put(name, chunk):
        os.makedirs(inp, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(chunk, schema=schema), str(inp / name), row_group_size=7)

    def day(n):
        code, err = incremental([str(inp)], out, "--run-name", f"day{n}", capsys=capsys)
        assert code == 0, err
        assert_same_rows(current(out), one_shot([str(inp)], str(tmp_path / f"ref{n}")))

    put("a.parquet", parts[0])
    put("b.parquet", [r for r in parts[1] if r["batch"] < 3])
    day(1)
    put("c.parquet", parts[2] + [r for r in parts[1] if r["batch"] >= 3])
    put("a.parquet", [dict(r, reward=-r["reward"]) for r in parts[0]])
    day(2)
    os.remove(inp / "b.parquet")
    put("d.parquet", [r for r in parts[1] if r["batch"] < 2])
    day(3)
    code, err = incremental([str(inp)], out, capsys=capsys)
    assert code == 0 and "nothing new to score" in err
    from rescore.transforms.files.delta_table import load_state

    assert [r["run"] for r in load_state(out).runs] == ["day1", "day2", "day3"]


@pytest.mark.slow
def test_default_run_names_are_utc_times_and_unique(tmp_path, capsys):
    from rescore.pipelines.incremental import run_name
    from rescore.transforms.files.delta_table import load_state

    rows = experience(8, batches=2, max_tasks=3)
    inp, out = tmp_path / "in", str(tmp_path / "table")
    write([r for r in rows if r["batch"] == 0], str(inp / "a.parquet"))
    assert incremental([str(inp)], out, capsys=capsys)[0] == 0
    write([r for r in rows if r["batch"] == 1], str(inp / "b.parquet"))
    import rescore.pipelines.incremental as inc

    first = load_state(out).runs[0]["run"]
    assert len(first) == len("run=20261122T030000") and first[12] == "T"
    original = inc.run_name
    try:
        inc.run_name = lambda: first  # the same second again
        assert incremental([str(inp)], out, capsys=capsys)[0] == 0
    finally:
        inc.run_name = original
    assert [r["run"] for r in load_state(out).runs] == [first, f"{first}-1"]
    assert run_name().startswith("run=")


@pytest.mark.slow
def test_untouched_batches_are_not_reread(tmp_path, capsys):
    rows = experience(3, batches=3, max_tasks=4)
    inp, out = tmp_path / "in", str(tmp_path / "table")
    write([r for r in rows if r["batch"] == 0], str(inp / "b0.parquet"))
    write([r for r in rows if r["batch"] == 1], str(inp / "b1.parquet"))
    assert incremental([str(inp)], out, capsys=capsys)[0] == 0
    write([r for r in rows if r["batch"] == 2], str(inp / "b2.parquet"))
    code, err = incremental([str(inp)], out, "--run-name", "second", capsys=capsys)
    assert code == 0, err
    doc = json.load(open(os.path.join(out, "_rescore", "runs", "second", "metrics.json")))
    assert doc["incremental"]["source_files"] == 1 and doc["incremental"]["batches_rescored"] == 1
    assert doc["totals"]["rows_read"] == sum(r["batch"] == 2 for r in rows)
    assert_same_rows(current(out), one_shot([str(inp)], str(tmp_path / "ref")))


@pytest.mark.slow
def test_changed_file_supersedes_and_deleted_file_is_removed(tmp_path, days, capsys):
    inp, first, second = days
    out = str(tmp_path / "table")
    write(first, str(inp / "a.parquet"))
    write(second, str(inp / "b.parquet"))
    assert incremental([str(inp / "*.parquet")], out, capsys=capsys)[0] == 0

    # Rewrite a.parquet: other rewards, same size class; its rows (and every group it shares
    # with b.parquet) are replaced in one commit.
    changed = [dict(r, reward=(r["reward"] * -1.5 + 0.25)) for r in first]
    write(changed, str(inp / "a.parquet"))
    code, err = incremental([str(inp / "*.parquet")], out, capsys=capsys)
    assert code == 0, err
    assert "0 new, 1 changed, 0 deleted" in err
    assert_same_rows(current(out), one_shot([str(inp / "*.parquet")], str(tmp_path / "ref1")))

    # Delete b.parquet: its rows go, and the batches it shared with a.parquet are rescored
    # from a.parquet alone; batch 3 (only in b) disappears.
    os.remove(inp / "b.parquet")
    code, err = incremental([str(inp / "*.parquet")], out, capsys=capsys)
    assert code == 0, err
    now = current(out)
    assert 3 not in set(now["batch"].to_pylist())
    assert_same_rows(now, one_shot([str(inp / "*.parquet")], str(tmp_path / "ref2")))

    # A file rewritten with the same bytes count and mtime but other content is still seen
    # (the footer digest).
    st = os.stat(inp / "a.parquet")
    write([dict(r, reward=r["reward"] + 1.0) for r in changed], str(inp / "a.parquet"))
    os.utime(inp / "a.parquet", ns=(st.st_atime_ns, st.st_mtime_ns))
    code, err = incremental([str(inp / "*.parquet")], out, capsys=capsys)
    assert code == 0 and "nothing new" not in err, err
    assert_same_rows(current(out), one_shot([str(inp / "*.parquet")], str(tmp_path / "ref3")))


@pytest.mark.slow
def test_deleting_every_file_of_a_batch_removes_its_rows_without_scoring(tmp_path, capsys):
    rows = experience(5, batches=2, max_tasks=3)
    inp, out = tmp_path / "in", str(tmp_path / "table")
    write([r for r in rows if r["batch"] == 0], str(inp / "b0.parquet"))
    write([r for r in rows if r["batch"] == 1], str(inp / "b1.parquet"))
    assert incremental([str(inp)], out, capsys=capsys)[0] == 0
    os.remove(inp / "b1.parquet")
    code, err = incremental([str(inp)], out, capsys=capsys)
    assert code == 0, err
    assert "1 deleted" in err
    assert set(current(out)["batch"].to_pylist()) == {0}
    assert_same_rows(current(out), one_shot([str(inp)], str(tmp_path / "ref")))


@pytest.mark.slow
def test_the_same_file_under_three_spellings_is_scored_once(tmp_path, days, capsys, monkeypatch):
    inp, first, second = days
    write(first + second, str(inp / "all.parquet"))
    os.symlink(inp, tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    out = str(tmp_path / "table")
    spellings = ["in/*.parquet", "./in/all.parquet", str(inp / "*.parquet"), str(tmp_path / "link" / "all.parquet")]
    code, err = incremental(spellings, out, capsys=capsys)
    assert code == 0, err
    assert_same_rows(current(out), one_shot([str(inp / "all.parquet")], str(tmp_path / "ref")))
    for spelling in spellings:
        code, err = incremental([spelling], out, capsys=capsys)
        assert code == 0 and "nothing new to score: all 1 input files" in err, (spelling, err)


@pytest.mark.slow
def test_sigkill_at_every_step_then_rerun(tmp_path, days, capsys):
    """A reader sees the previous version until the commit and the new one after it; every
    rerun after a kill goes through (the kernel released the dead run's lock; its work is removed).
    Each run is a process of its own, forked from one that imported Rescore once (batched.py)."""
    inp, first, second = days
    out = str(tmp_path / "table")
    write(first, str(inp / "day1.parquet"))
    assert incremental([str(inp / "*.parquet")], out, capsys=capsys)[0] == 0
    before = one_shot([str(inp / "day1.parquet")], str(tmp_path / "ref1"))
    write(second, str(inp / "day2.parquet"))
    after = one_shot([str(inp / "*.parquet")], str(tmp_path / "ref2"))
    argv = ["--input", str(inp / "*.parquet"), "--output", out, "--incremental", RUNNER, *STRATEGY]

    with ForkedRuns(tmp_path / "runs-stderr", preload=("rescore.pipelines.incremental", "deltalake")) as runs:
        for step in ("locked", "planned", "before_commit"):
            code, err = runs.run(argv, {"RESCORE_TEST_INJECT_FAULT": f"kill_at:{step}"})
            assert code == -signal.SIGKILL, (step, err)
            assert_same_rows(current(out), before)

        # Killed while the pipeline is writing its staged files.
        pid = runs.start(argv, {"RESCORE_TEST_INJECT_FAULT": "slow_write:30"})
        deadline = time.monotonic() + 240
        runs_dir = os.path.join(out, "_rescore", "runs")
        while time.monotonic() < deadline:
            staged = [os.path.join(d, f) for d, _, fs in os.walk(runs_dir) for f in fs if "_staging" in d]
            if staged:
                break
            time.sleep(0.2)
        assert staged, "the pipeline never staged a file"
        os.kill(pid, signal.SIGKILL)
        runs.wait(timeout=60)
        assert_same_rows(current(out), before)

        # Killed right after the commit: the new version is complete, the next run finds nothing new.
        assert runs.run(argv, {"RESCORE_TEST_INJECT_FAULT": "kill_at:after_commit"})[0] == -signal.SIGKILL
        assert_same_rows(current(out), after)

        code, err = runs.run(argv)
        assert code == 0
        assert err.strip().startswith("rescore: nothing new to score"), err
    assert_same_rows(current(out), after)
    # Work of the killed runs is gone; only committed runs keep their metrics.
    from rescore.transforms.files.delta_table import load_state

    assert sorted(os.listdir(runs_dir)) == sorted(r["run"] for r in load_state(out).runs)


@pytest.mark.slow
def test_orphan_files_of_a_killed_commit_are_invisible(tmp_path, days, capsys):
    """delta-rs writes data files, then the log entry atomically; a kill in between leaves
    files no version references (and a temporary log file), which readers never see."""
    inp, first, second = days
    out = str(tmp_path / "table")
    write(first + second, str(inp / "a.parquet"))
    assert incremental([str(inp / "*.parquet")], out, capsys=capsys)[0] == 0
    rows = current(out)
    pq.write_table(rows, os.path.join(out, "part-00000-orphan-c000.snappy.parquet"))
    open(os.path.join(out, "_delta_log", "_commit_0123.json.tmp"), "w").write('{"add": ')
    assert current(out).num_rows == rows.num_rows
    import duckdb
    import polars as pl

    assert pl.read_delta(out).height == rows.num_rows
    from deltalake import DeltaTable

    files = DeltaTable(out).file_uris()
    assert duckdb.sql(f"SELECT count(*) FROM read_parquet({files}, union_by_name = true)").fetchall()[0][0] == rows.num_rows


@pytest.mark.slow
def test_two_overlapping_runs(tmp_path, days, capsys):
    import rescore.pipelines.job  # noqa: F401  (imported before the race: Beam and torch take seconds)

    inp, first, second = days
    out = str(tmp_path / "table")
    write(first + second, str(inp / "a.parquet"))
    slow = subprocess_incremental([str(inp / "*.parquet")], out, env={"RESCORE_TEST_INJECT_FAULT": "slow_write:8"})
    runs = os.path.join(out, "_rescore", "runs")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not any("_staging" in d for d, _, fs in os.walk(runs) if fs):
        time.sleep(0.1)
    code, err = incremental([str(inp / "*.parquet")], out, "--quiet", capsys=capsys)  # while the first one writes
    # The output lock every run takes (transforms/files/lock.py) refuses it: exit 2, naming the holder.
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"rescore: error: {out} is being written by another run (pid {slow.pid} on ")
    assert slow.wait(timeout=300) == 0, slow.stderr.read()
    assert_same_rows(current(out), one_shot([str(inp / "*.parquet")], str(tmp_path / "ref")))


@pytest.mark.slow
def test_a_commit_against_a_stale_version_fails_cleanly(tmp_path, days, capsys):
    """Where the lock cannot exclude (object stores), the Delta commit does: it is made against
    the version the run started from and never retried."""
    from rescore.transforms.files import delta_table as inc

    inp, first, second = days
    out = str(tmp_path / "table")
    write(first, str(inp / "a.parquet"))
    assert incremental([str(inp / "*.parquet")], out, capsys=capsys)[0] == 0
    stale = inc.load_state(out)
    write(second, str(inp / "b.parquet"))
    assert incremental([str(inp / "*.parquet")], out, capsys=capsys)[0] == 0
    winner = current(out)
    with pytest.raises(inc.ConflictError, match="another run committed to .* while this one ran"):
        inc.commit(out, stale, stale, {0}, winner.slice(0, 0).to_reader(), rebuild=False)
    assert_same_rows(current(out), winner)


# --- bookkeeping, names and one-line failures ------------------------------------------------


def test_canonical_location(tmp_path, monkeypatch):
    from rescore.transforms.files.selection import canonical

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.parquet").write_bytes(b"x")
    os.symlink(tmp_path / "in", tmp_path / "link")
    monkeypatch.chdir(tmp_path)
    real = os.path.realpath(tmp_path / "in" / "a.parquet")
    for spelling in ("in/a.parquet", "./in/a.parquet", "in/../in/a.parquet", str(tmp_path / "link" / "a.parquet")):
        assert canonical(spelling) == real
    assert canonical("GS://Bucket/exp//day1/./a.parquet") == "gs://bucket/exp/day1/a.parquet"
    assert canonical("gs://bucket/exp/x/../day1/a.parquet") == "gs://bucket/exp/day1/a.parquet"


def test_touched_batches_from_statistics_or_the_column(tmp_path):
    from rescore.transforms.files.selection import file_batches, row_group_may_hold

    rows = [{"batch": b, "task": 1, "run": r, "step": 0, "reward": 0.0, "tokens": [], "prompt_length": 0,
             "logprobs": [], "action_mask": [], "note": None} for b in (4, 4, 9, 9, 12, 15) for r in range(2)]
    path = str(tmp_path / "f.parquet")
    write(rows, path, row_group_size=4)  # row groups: {4}, {9}, {12, 15}
    assert file_batches(path) == [4, 9, 12, 15]
    assert row_group_may_hold(path, {9}) == [0, 4, 0]
    assert row_group_may_hold(path, {13}) == [0, 0, 4]  # statistics are a range: 13 may be in [12, 15]
    assert row_group_may_hold(path, {5, 20}) == [0, 0, 0]


def _cli(argv, cwd=ROOT):
    proc = subprocess.run([sys.executable, "-m", "rescore", *argv], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    return proc.returncode, proc.stderr


@pytest.mark.parametrize("name", ["../escape", "a/b", "/abs/run", "..", ".hidden", "x" * 129, "bad name"])
def test_run_name_is_one_path_component(tmp_path, name, capsys):
    rows = experience(1, batches=1, max_tasks=2)
    write(rows, str(tmp_path / "in" / "a.parquet"))
    code, err = incremental([str(tmp_path / "in")], str(tmp_path / "t"), "--run-name", name, capsys=capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("rescore: error: --run-name") and "one path component" in err
    assert not os.path.exists(tmp_path / "t")


@pytest.mark.slow
def test_malformed_bookkeeping_is_one_line_exit_2(tmp_path):
    from deltalake import CommitProperties, write_deltalake

    rows = experience(1, batches=1, max_tasks=2)
    write(rows, str(tmp_path / "in" / "a.parquet"))
    out = str(tmp_path / "t")
    bad = {"version": 2, "config_hash": "x", "strategy": "grpo", "inputs": [], "runs": [],
           "files": {"/x.parquet": {"size": "big", "mtime": 1.0, "footer": "", "run": "r", "batches": []}}}
    write_deltalake(out, pa.table({"batch": pa.array([0], pa.int64())}),
                    commit_properties=CommitProperties(custom_metadata={"rescore.state": json.dumps(bad)}))
    argv = ["--input", str(tmp_path / "in"), "--output", out, "--incremental", RUNNER, "--strategy", "grpo"]
    # A Delta table Rescore did not write, and the manifest layout of earlier versions.
    other = str(tmp_path / "other")
    write_deltalake(other, pa.table({"batch": pa.array([0], pa.int64())}))
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    (legacy / "_manifest.json").write_text('{"version": 1, "files": {}}')
    runs = run_many(tmp_path, [argv, [*argv[:3], other, *argv[4:]], [*argv[:3], str(legacy), *argv[4:]]])

    code, err = runs[0]
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "malformed Rescore bookkeeping" in err and "/x.parquet" in err
    assert not os.path.exists(os.path.join(out, "_rescore.lock"))  # released
    assert not os.path.exists(os.path.join(out, "_rescore", "lock"))  # one lock: the output's
    code, err = runs[1]
    assert code == 2 and "Delta table that Rescore did not write" in err and len(err.strip().splitlines()) == 1
    code, err = runs[2]
    assert code == 2 and "earlier Rescore" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_changed_strategy_needs_overwrite_which_rescores_everything(tmp_path, days, capsys):
    inp, first, second = days
    out = str(tmp_path / "table")
    write(first, str(inp / "a.parquet"))
    write(second, str(inp / "b.parquet"))
    assert incremental([str(inp / "*.parquet")], out, capsys=capsys)[0] == 0
    from rescore.pipelines.cli import main

    argv = ["--input", str(inp / "*.parquet"), "--output", out, "--incremental", RUNNER, "--strategy", "grpo"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "pass --overwrite" in err and len(err.strip().splitlines()) == 1
    assert main([*argv, "--overwrite", "--quiet"]) == 0
    from rescore.pipelines.load import load_scored
    from rescore.pipelines.cli import run

    run(["--input", str(inp / "*.parquet"), "--output", str(tmp_path / "ref"), RUNNER, "--quiet", "--strategy", "grpo"])
    assert_same_rows(current(out), load_scored(str(tmp_path / "ref")))
    assert "copy_index" not in current(out).column_names


# --- reading it --------------------------------------------------------------------------------


@pytest.mark.slow
def test_load_scored_show_and_the_documented_readers(tmp_path, days, capsys):
    import duckdb
    import polars as pl
    from deltalake import DeltaTable

    from rescore.pipelines.load import OutputError, load_scored
    from rescore.pipelines.cli import main

    inp, first, second = days
    write(first, str(inp / "a.parquet"))
    out = str(tmp_path / "table")
    assert incremental([str(inp / "*.parquet")], out, capsys=capsys)[0] == 0
    write(second, str(inp / "b.parquet"))
    assert incremental([str(inp / "*.parquet")], out, capsys=capsys)[0] == 0
    table = load_scored(out)
    assert isinstance(table, pa.Table)
    expected = keyed(table)

    # polars, DuckDB and pyarrow as docs/output.md shows them.
    df = pl.read_delta(out)
    assert df.height == table.num_rows and set(df.columns) == set(table.column_names)
    import pyarrow.dataset as ds

    dt = DeltaTable(out)
    files = dt.file_uris()
    got = duckdb.sql(f"SELECT batch, count(*) AS n FROM read_parquet({files}, union_by_name = true) GROUP BY batch ORDER BY batch").fetchall()
    want = sorted((b, table["batch"].to_pylist().count(b)) for b in set(table["batch"].to_pylist()))
    assert got == want
    via_pyarrow = ds.dataset(files, schema=pa.schema(dt.schema().to_arrow()), format="parquet").to_table()
    assert set(keyed(via_pyarrow)) == set(expected)

    # One-shot directories load the same way.
    ref = str(tmp_path / "ref")
    one = one_shot([str(inp / "*.parquet")], ref)
    assert_same_rows(table, one)

    # rescore show: a table, a one-shot run, pending input, and a path that is neither.
    assert main(["show", out]) == 0
    text = capsys.readouterr().out
    assert "incremental Delta Lake table, version 1" in text
    assert f"rows            {table.num_rows:,}" in text and "runs            2" in text
    assert "pending input   0 new, 0 changed, 0 deleted" in text
    write(first[:3], str(inp / "c.parquet"))
    os.remove(inp / "a.parquet")
    assert main(["show", out, "--batches"]) == 0
    text = capsys.readouterr().out
    assert "pending input   1 new, 0 changed, 1 deleted" in text and "c.parquet" in text
    assert "  batch            rows" in text
    assert main(["show", ref]) == 0
    assert "one-shot run" in capsys.readouterr().out
    assert main(["show", str(tmp_path / "nowhere")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("rescore: error:") and len(err.strip().splitlines()) == 1
    shutil.rmtree(os.path.join(ref, "_SUCCESS"), ignore_errors=True)
    os.remove(os.path.join(ref, "_SUCCESS"))
    with pytest.raises(OutputError, match="not a finished Rescore output"):
        load_scored(ref)


# --- review fixes (fix-inc) -----------------------------------------------------------------


@pytest.mark.slow
def test_an_input_rewritten_during_the_run_is_never_committed(tmp_path, days):
    """The read units of an incremental run carry the fingerprint taken when the run planned:
    a file rewritten between the two reads fails the run (exit 1, one line), nothing committed."""
    inp, first, second = days
    write(first + second, str(inp / "a.parquet"))
    negated = [{**r, "reward": -r["reward"]} for r in first + second]
    write(negated, str(tmp_path / "neg.parquet"))
    pause = tmp_path / "pause"
    pause.mkdir()
    out = str(tmp_path / "table")
    proc = subprocess_incremental([str(inp / "*.parquet")], out, "--quiet",
                                  env={"RESCORE_TEST_INJECT_FAULT": f"pause_readback:{pause}"})
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not (pause / "paused").exists() and proc.poll() is None:
        time.sleep(0.1)
    assert (pause / "paused").exists(), proc.stderr.read()
    shutil.copyfile(tmp_path / "neg.parquet", inp / "a.parquet")
    (pause / "resume").touch()
    code = proc.wait(timeout=300)
    err = proc.stderr.read()
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("rescore: error:") and "changed while the run was reading it" in err
    assert not os.path.isdir(os.path.join(out, "_delta_log")) or not os.listdir(os.path.join(out, "_delta_log"))


MODEL_FLAGS = [
    ["--strategy", "grpo", "--reward-model", "models/reward"],
    ["--strategy", "on_policy_distill", "--teacher-model", "models/teacher"],
]


@pytest.fixture(scope="module")
def refused(tmp_path_factory):
    """The command lines refused before anything runs below, in one child process (batched.py;
    each with its own stderr): {model flag, or "--run-name": (exit code, stderr, output path)}."""
    base = tmp_path_factory.mktemp("refused")
    write(experience(1, batches=1, max_tasks=2), str(base / "in" / "a.parquet"))
    runs = {extra[2]: ["--input", str(base / "in"), "--output", str(base / f"t{i}"), "--incremental", RUNNER, *extra]
            for i, extra in enumerate(MODEL_FLAGS)}
    runs["--run-name"] = ["--input", str(base / "in"), "--output", str(base / "t"), RUNNER, *STRATEGY, "--run-name", "x"]
    results = run_many(base / "stderr", list(runs.values()))
    return {key: (code, err, argv[3]) for (key, argv), (code, err) in zip(runs.items(), results)}


@pytest.mark.slow
@pytest.mark.parametrize("extra", MODEL_FLAGS)
def test_model_flags_are_refused_with_incremental(refused, extra):
    """The model stage does not run in incremental runs: exit 2, one line, before anything runs
    (no output directory, no lock left behind)."""
    code, err, out = refused[extra[2]]
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"rescore: error: {extra[2]} cannot be used with --incremental"), err
    assert not os.path.exists(out)


@pytest.mark.slow
def test_run_name_without_incremental_is_refused(refused):
    code, err, out = refused["--run-name"]
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("rescore: error: --run-name names an --incremental run"), err
    assert not os.path.exists(out)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["my table", "t#1"])
def test_output_path_with_a_space_or_a_hash(tmp_path, name):
    """A table whose path holds a space or '#': load_scored and `rescore show` read it, and a
    second identical run finds nothing new (delta-rs percent-encodes such paths)."""
    from rescore.pipelines.load import load_scored

    write(experience(3, batches=2, max_tasks=3), str(tmp_path / "in" / "a.parquet"))
    out = str(tmp_path / "sp" / name)
    argv = ["--input", str(tmp_path / "in" / "*.parquet"), "--output", out, "--incremental", RUNNER, *STRATEGY]
    from rescore.pipelines.cli import main

    assert main([*argv, "--quiet"]) == 0
    assert load_scored(out).num_rows == pq.read_table(str(tmp_path / "in" / "a.parquet")).num_rows
    with ForkedRuns(tmp_path / "runs-stderr", preload=("rescore.pipelines.incremental", "deltalake")) as runs:
        code, err = runs.run(["show", out])
        assert code == 0 and err == "", err
        assert "incremental Delta Lake table, version 0" in runs.stdout()
        code, err = runs.run(argv)
        assert code == 0 and "nothing new to score" in err, err


@pytest.mark.slow
def test_keep_filtered_and_audit_columns_are_recorded(tmp_path):
    """--incremental --keep-filtered: metrics.json records keep_filtered and audit_columns, the
    summary says where the filtered rows are (the run's work directory, not the table)."""
    write(experience(5, batches=2, max_tasks=4, max_runs=4), str(tmp_path / "in" / "a.parquet"))
    out = str(tmp_path / "t")
    code, err = _cli(["--input", str(tmp_path / "in" / "*.parquet"), "--output", out, "--incremental", RUNNER,
                      "--strategy", "reward_variance,grpo", "--keep-filtered", "--audit-columns"])
    assert code == 0, err
    [work] = [os.path.join(out, "_rescore", "runs", d) for d in os.listdir(os.path.join(out, "_rescore", "runs"))]
    doc = json.load(open(os.path.join(work, "metrics.json")))
    assert doc["keep_filtered"] is True and doc["audit_columns"] is True
    assert "not written" not in err
    filtered = [f for f in os.listdir(work) if f.startswith("filtered-")]
    assert doc["totals"]["rows_filtered"] > 0 and filtered
    assert f"filtered rows kept in {work}/filtered-*.parquet" in err, err
    assert "filter_reason" not in current(out).schema.names


@pytest.mark.slow
def test_show_malformed_metrics_and_a_closed_pipe(tmp_path):
    """`rescore show`: a malformed metrics.json is one line, exit 2; a reader that closed the
    pipe (`| head`) ends it quietly, exit 0, no traceback."""
    write(experience(2, batches=2, max_tasks=3), str(tmp_path / "in" / "a.parquet"))
    one, table = str(tmp_path / "one"), str(tmp_path / "t")
    from rescore.pipelines.cli import main

    assert main(["--input", str(tmp_path / "in"), "--output", one, RUNNER, *STRATEGY, "--quiet"]) == 0
    with open(os.path.join(one, "metrics.json"), "w") as f:
        f.write("{bad")
    code, err = _cli(["show", one])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("rescore: error:") and "metrics.json" in err

    assert main(["--input", str(tmp_path / "in"), "--output", table, "--incremental", RUNNER, *STRATEGY, "--quiet"]) == 0
    r, w = os.pipe()
    os.close(r)  # the reader is gone before show writes
    proc = subprocess.run([sys.executable, "-m", "rescore", "show", table, "--batches"], cwd=ROOT, stdout=w,
                          stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300)
    os.close(w)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
