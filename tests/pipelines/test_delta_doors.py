"""The incremental Delta table as a door (issue 28): column types only widen, day by day equals
one shot; paths are paths; a damaged `_delta_log` is one line in every subcommand, never a
traceback and never a wrong row."""

import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from batched import run_many

pytest.importorskip("deltalake", reason="incremental runs write a Delta Lake table (the [test] extra installs deltalake)")

RUNNER = "--runner=FnApiRunner"
STRATEGY = ["--strategy", "grpo"]
ID = ["batch", "task", "run", "step"]


def day(batch_runs, *, reward, tokens=pa.int64(), mask=pa.bool_(), task=pa.int64(), seed=0):
    """Rows of (batch, run) pairs, all of task 1 (or '1'); rewards given as values of `reward`."""
    rng = np.random.default_rng(seed)
    rows = {"batch": [], "task": [], "run": [], "step": [], "reward": [], "tokens": [], "prompt_length": [],
            "action_mask": []}
    for b, r in batch_runs:
        n = int(rng.integers(1, 5))
        rows["batch"].append(b)
        rows["task"].append("1" if pa.types.is_string(task) else 1)
        rows["run"].append(r)
        rows["step"].append(0)
        value = float(rng.uniform(-30, 30))
        rows["reward"].append(value if pa.types.is_floating(reward) else int(value))
        rows["tokens"].append([int(v) for v in rng.integers(0, 100, n + 1)])
        rows["prompt_length"].append(1)
        m = [bool(v) for v in rng.integers(0, 2, n)]
        rows["action_mask"].append(m if pa.types.is_boolean(mask) else [int(v) for v in m])
    schema = pa.schema([("batch", pa.int64()), ("task", task), ("run", pa.int64()), ("step", pa.int64()),
                        ("reward", reward), ("tokens", pa.list_(tokens)), ("prompt_length", pa.int64()),
                        ("action_mask", pa.list_(mask))])
    return pa.table(rows, schema=schema)


def main(*argv):
    from rescore.pipelines.cli import main as rescore_main

    return rescore_main([*argv, RUNNER, *STRATEGY, "--quiet"])


def rows_of(table):
    cols = [c for c in table.column_names if not c.startswith("_")]
    return sorted((tuple(json.dumps(r[c], sort_keys=True) for c in ID), {c: r[c] for c in cols})
                  for r in table.select(cols).to_pylist())


def assert_same(got, want, *, exact_types=True):
    """Same ids, same values in every column (rewards, tokens, masks as numbers), same scores."""
    g, w = rows_of(got), rows_of(want)
    assert [k for k, _ in g] == [k for k, _ in w]
    for (key, a), (_, b) in zip(g, w):
        assert set(a) == set(b), key
        for c in b:
            if c in ("score", "advantages", "returns"):
                np.testing.assert_allclose(np.asarray(a[c] or [], float), np.asarray(b[c] or [], float), atol=1e-6, err_msg=str(key))
            else:
                assert json.dumps(a[c]) == json.dumps(b[c]), (key, c, a[c], b[c])
    if exact_types:
        for f in want.schema:
            assert got.schema.field(f.name).type == f.type, (f.name, got.schema.field(f.name).type, f.type)


# --- defect 2: the table widens, never narrows --------------------------------------------


@pytest.mark.slow
def test_day_by_day_widens_like_one_shot(tmp_path):
    """Day 1: integer rewards, list<int32> tokens, bool masks. Day 2 (part of a day-1 group, and
    a new batch): float rewards, list<int64> tokens, int8 masks. The table's types widen to
    double, list<int64>, list<int8> and every value equals a one-shot run over both files
    (-23.58 stays -23.58, not -23). Day 3 brings integer rewards again: nothing narrows."""
    from rescore.pipelines.load import load_scored

    inp = tmp_path / "in"
    inp.mkdir()
    pq.write_table(day([(0, 0), (0, 1), (1, 0), (1, 1)], reward=pa.int64(), tokens=pa.int32()), inp / "d1.parquet")
    table = str(tmp_path / "table")
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    assert load_scored(table).schema.field("reward").type == pa.int64()

    d2 = day([(0, 2), (2, 0), (2, 1), (2, 2)], reward=pa.float64(), mask=pa.int8(), seed=1)
    d2 = d2.set_column(4, "reward", pa.array([-23.58, 1.25, 0.5, 7.0]))
    pq.write_table(d2, inp / "d2.parquet")
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    got = load_scored(table)
    assert got.schema.field("reward").type == pa.float64()
    assert got.schema.field("tokens").type == pa.list_(pa.int64())
    assert got.schema.field("action_mask").type == pa.list_(pa.int8())
    assert -23.58 in got["reward"].to_pylist()

    once = str(tmp_path / "once")
    assert main("--input", str(inp), "--output", once) == 0
    assert_same(got, load_scored(once))

    pq.write_table(day([(3, 0), (3, 1)], reward=pa.int32(), tokens=pa.int16(), seed=2), inp / "d3.parquet")
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    once3 = str(tmp_path / "once3")
    assert main("--input", str(inp), "--output", once3) == 0
    got = load_scored(table)
    assert got.schema.field("reward").type == pa.float64()
    assert_same(got, load_scored(once3))
    modes = [_operation(table, v) for v in range(3)]
    assert modes[1] == ("Overwrite", None), modes  # day 2 widened: every row rewritten in one commit
    assert modes[2] == ("Overwrite", "batch = 3"), modes  # day 3 widens nothing: only its batch is replaced


def _operation(table, version):
    with open(os.path.join(table, "_delta_log", f"{version:020d}.json")) as f:
        info = json.loads(f.readline())["commitInfo"]
    params = info.get("operationParameters", {})
    return params.get("mode"), params.get("predicate")


def test_unsigned_columns_keep_their_values_in_the_table(tmp_path):
    """Delta has no unsigned integers: delta-rs would store a uint8 column as int8 (200 becomes
    -56 or fails the commit). The table stores it as int16, values intact."""
    from rescore.pipelines.load import load_scored

    inp = tmp_path / "in"
    inp.mkdir()
    t = day([(0, 0), (0, 1)], reward=pa.float64())
    t = t.append_column("level", pa.array([200, 255], pa.uint8()))
    pq.write_table(t, inp / "a.parquet")
    table = str(tmp_path / "t")
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    got = load_scored(table).sort_by("run")
    assert got["level"].to_pylist() == [200, 255] and got.schema.field("level").type == pa.int16()


@pytest.mark.slow
def test_a_type_that_cannot_widen_is_refused_before_any_work(tmp_path):
    """Task ids int on day 1, strings on day 2: exit 2 before the scoring, one line naming the
    file, the column and the table's type; the table is unchanged and no run's work is left."""
    from deltalake import DeltaTable

    inp = tmp_path / "in"
    inp.mkdir()
    pq.write_table(day([(0, 0), (0, 1)], reward=pa.float64()), inp / "d1.parquet")
    table = str(tmp_path / "table")
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    pq.write_table(day([(1, 0), (1, 1)], reward=pa.float64(), task=pa.string()), inp / "d2.parquet")
    argv = ["--input", str(inp), "--output", table, "--incremental", RUNNER, *STRATEGY]
    [(code, err)] = run_many(tmp_path, [argv])
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("rescore: error: ") and str(inp / "d2.parquet") in err, err
    assert "'task'" in err and "int64" in err and "string" in err, err
    assert DeltaTable(table).version() == 0
    runs = os.listdir(os.path.join(table, "_rescore", "runs"))
    assert len(runs) == 1  # the first run's; the refused one did no work


# --- defect 9: paths are paths -------------------------------------------------------------

ODD = "ü n#1 100%zz"


@pytest.mark.slow
def test_odd_paths_in_every_door(tmp_path):
    """Spaces, '#', '%' and Unicode in an input file's path, a one-shot output, an incremental
    table, `rescore show`, load_scored and the report; a table path holding a percent escape
    (`%41`, which delta-rs decodes) is refused before anything is written (exit 2, one line)."""
    from rescore.pipelines.load import load_scored

    inp = tmp_path / ODD / "in %41"
    inp.mkdir(parents=True)
    src = inp / "d#1 %41 ü.parquet"
    pq.write_table(day([(0, 0), (0, 1), (1, 0), (1, 1)], reward=pa.float64()), src)
    once, table = str(tmp_path / ODD / "once %41"), str(tmp_path / ODD / "table")
    bad = str(tmp_path / ODD / "t%41")
    report_dir = str(tmp_path / ODD / "report #%41")
    runs = run_many(tmp_path, [
        ["--input", str(src), "--output", once, RUNNER, *STRATEGY],
        ["--input", str(src), "--output", table, "--incremental", RUNNER, *STRATEGY],
        ["--input", str(src), "--output", table, "--incremental", RUNNER, *STRATEGY],
        ["show", table],
        ["show", once],
        ["report", once, "--to", report_dir],
        ["--input", str(src), "--output", bad, "--incremental", RUNNER, *STRATEGY],
    ])
    for code, err in runs[:2] + runs[3:6]:
        assert code == 0, err
    assert runs[2][0] == 0 and "nothing new to score" in runs[2][1], runs[2]
    assert os.path.exists(os.path.join(report_dir, "report.html"))
    code, err = runs[6]
    assert code == 2 and len(err.strip().splitlines()) == 1 and "%41" in err and "percent escape" in err, err
    assert not os.path.exists(bad)
    want = load_scored(once)
    assert want.num_rows == 4
    assert_same(load_scored(table), want)


# --- defect 10 and the fuzzed log reader ---------------------------------------------------


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory):
    """A table of two Rescore commits (version 1 replaces batch 0 and adds batch 1), and the
    rows of each version."""
    from rescore.pipelines.load import load_scored

    root = tmp_path_factory.mktemp("delta")
    inp = root / "in"
    inp.mkdir()
    pq.write_table(day([(0, 0), (0, 1)], reward=pa.float64()), inp / "a.parquet")
    table = str(root / "table")
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    v0 = load_scored(table)
    pq.write_table(day([(0, 2), (1, 0), (1, 1)], reward=pa.float64(), seed=3), inp / "b.parquet")
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    v1 = load_scored(table)
    return str(inp), table, {0: v0, 1: v1}


def _one_line_outcomes(table, capsys):
    """What load_scored, the incremental state and `rescore show` make of `table`: rows, or
    the one-line error each gives (no other exception may escape)."""
    from rescore.errors import InputError, NotFinishedOutputError
    from rescore.pipelines import show
    from rescore.pipelines.load import load_scored
    from rescore.transforms.files import delta_table

    try:
        rows = load_scored(table)
    except NotFinishedOutputError as e:
        assert "\n" not in str(e)
        rows = None
    try:
        delta_table.load_state(table)
    except InputError as e:
        assert "\n" not in str(e)
    capsys.readouterr()
    code = show.main([table])
    out = capsys.readouterr()
    assert code in (0, 2), out.err
    assert (code == 0) == (out.err == ""), out.err
    if code:
        assert len(out.err.strip().splitlines()) == 1 and out.err.startswith("rescore: error: "), out.err
    return rows


@pytest.mark.slow
def test_a_truncated_commit_is_one_line_in_every_subcommand(tmp_path, two_versions):
    inp, table, _ = two_versions
    copy = str(tmp_path / "t")
    shutil.copytree(table, copy)
    last = os.path.join(copy, "_delta_log", f"{1:020d}.json")
    text = open(last, "rb").read()
    open(last, "wb").write(text[: len(text) // 2])
    argv = ["--input", inp, "--output", copy, "--incremental", RUNNER, *STRATEGY]
    runs = run_many(tmp_path, [["show", copy], ["show", copy, "--batches"], argv])
    for code, err in runs:
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith("rescore: error: ") and "_delta_log" in err, err
    assert open(last, "rb").read() == text[: len(text) // 2]  # nothing committed over it
    from rescore.pipelines.load import OutputError, load_scored

    with pytest.raises(OutputError, match="_delta_log"):
        load_scored(copy)


@pytest.mark.slow
def test_a_replaced_file_brought_back_is_an_error_not_rows_twice(tmp_path, two_versions, capsys):
    """Version 1 removed the file of batch 0's first scoring; a damaged `remove` action (its
    path no longer names the file) makes delta-rs list that file as live again: batch 0's rows
    twice. load_scored, show and an --incremental run refuse it in one line (the rows per batch
    the last Rescore commit recorded do not match); nothing is committed over it."""
    inp, table, _ = two_versions
    copy = str(tmp_path / "t")
    shutil.copytree(table, copy)
    last = os.path.join(copy, "_delta_log", f"{1:020d}.json")
    lines = open(last, "rb").read().split(b"\n")
    [i] = [k for k, line in enumerate(lines) if line.startswith(b'{"remove"')]
    lines[i] = lines[i].replace(b'"path":"part-', b'"path":"xart-')
    open(last, "wb").write(b"\n".join(lines))
    assert _one_line_outcomes(copy, capsys) is None
    argv = ["--input", inp, "--output", copy, "--incremental", RUNNER, *STRATEGY]
    [(code, err)] = run_many(tmp_path, [argv])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "_delta_log is damaged" in err, err
    assert not os.path.exists(os.path.join(copy, "_delta_log", f"{2:020d}.json"))


def _mutate(data: bytes, how: str, at: int, value: int) -> bytes:
    if not data:
        return data
    at %= len(data)
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([data[at] ^ (value or 1)]) + data[at + 1:]
    if how == "junk":
        return data[:at] + b'{"add": {"path": 1}, "x": [' + data[at:]
    if how == "path":  # one character of a file name in an add or remove action: still valid JSON
        spots = [i for i in range(len(data)) if data.startswith(b'"path":"part-', i)]
        if not spots:
            return data
        i = spots[at % len(spots)] + len(b'"path":"part-') + 6 + value % 30
        new = b"0" if data[i:i + 1] != b"0" else b"1"
        return data[:i] + new + data[i + 1:]
    if how == "line":
        return data + b'{"commitInfo": {"rescore.state": "{}"}}\n'
    return data


@pytest.mark.slow
def test_fuzzed_delta_log_gives_a_version_or_one_line(two_versions, tmp_path_factory, capsys):
    """Random damage to the `_delta_log` (a commit truncated, bytes flipped, junk JSON, a commit
    deleted): load_scored, the incremental state and `rescore show` give the rows of a version
    the table really had, or one line; never an escaped exception, never other rows."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    _, table, versions = two_versions
    expected = {tuple(rows_of(v)[i][0] for i in range(v.num_rows)): k for k, v in versions.items()}
    logs = sorted(os.listdir(os.path.join(table, "_delta_log")))
    commits = [n for n in logs if n.endswith(".json")]
    work = tmp_path_factory.mktemp("fuzz")
    seen = {"rows": 0, "error": 0}

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(commits), st.sampled_from(["truncate", "flip", "junk", "line", "delete", "path"]),
                              st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=3))
    def check(damage):
        copy = str(work / "t")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(table, copy)
        for name, how, at, value in damage:
            path = os.path.join(copy, "_delta_log", name)
            if not os.path.exists(path):
                continue
            if how == "delete":
                os.remove(path)
                continue
            with open(path, "rb") as f:
                data = f.read()
            with open(path, "wb") as f:
                f.write(_mutate(data, how, at, value))
        rows = _one_line_outcomes(copy, capsys)
        if rows is None:
            seen["error"] += 1
            return
        seen["rows"] += 1
        ids = tuple(k for k, _ in rows_of(rows))
        assert ids in expected, f"rows of no version: {damage}"
        assert_same(rows, versions[expected[ids]], exact_types=False)

    check()
    assert seen["error"] > 0


@pytest.mark.slow
def test_a_table_of_an_earlier_rescore_gets_its_row_record(tmp_path, monkeypatch):
    """A table whose commits record no rows per batch (an earlier Rescore): its rows are
    counted once at the next commit, which records them with the new batches; readers then
    check against that record."""
    from rescore.pipelines.load import load_scored
    from rescore.transforms.files import delta_table

    inp = tmp_path / "in"
    inp.mkdir()
    pq.write_table(day([(0, 0), (0, 1), (1, 0), (1, 1)], reward=pa.float64()), inp / "a.parquet")
    table = str(tmp_path / "t")
    real = delta_table.State.document

    def without_rows(self):
        doc = real(self)
        doc.pop("rows", None)
        return doc

    monkeypatch.setattr(delta_table.State, "document", without_rows)
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    assert delta_table.load_state(table).rows is None
    monkeypatch.undo()
    pq.write_table(day([(1, 2), (2, 0), (2, 1)], reward=pa.float64(), seed=4), inp / "b.parquet")
    assert main("--input", str(inp), "--output", table, "--incremental") == 0
    assert delta_table.load_state(table).rows == [[0, 0, 2], [1, 1, 3], [2, 2, 2]]
    assert load_scored(table).num_rows == 7
