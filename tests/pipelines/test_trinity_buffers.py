"""Trinity-RFT SQL buffers (SQLite): TRXP blobs, the id-range source, the atomic sink, bad input.

The round trip through the real trinity-rft code is in test_trinity_roundtrip.py; the same
against a live PostgreSQL server in test_postgres_buffers.py.
"""

import os
import pickle
import sqlite3
import struct
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest
import reference
import torch

from batched import run_many
from conftest import RUNNER
from data import read_output

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rescore.transforms import sql_database  # noqa: E402
from rescore.transforms.rows import trinity_format as trxp  # noqa: E402


def _blob(batch=0, task=0, run=0, step=0, reward=1.0, prompt=3, response=4, **overrides):
    item = trxp.new_item(eid={"batch": batch, "task": task, "run": run, "step": step, "suffix": "abc"},
                         reward=reward, prompt_length=prompt)
    fields = {
        "tokens": torch.arange(prompt + response, dtype=torch.int32),
        "logprobs": -torch.rand(response),
        "action_mask": torch.ones(response, dtype=torch.bool),
    }
    fields.update(overrides)
    return trxp.encode([(item, fields)])


def _raw_blob(meta_pickle: bytes, tensor_bytes: bytes = None) -> bytes:
    tensor_bytes = tensor_bytes if tensor_bytes is not None else trxp.save_tensors({"0:tokens": torch.arange(5)})
    return b"TRXP" + struct.pack("<B", 1) + struct.pack("<QQ", len(meta_pickle), len(tensor_bytes)) + meta_pickle + tensor_bytes


class _Evil:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _sample_buffer(path, **kw):
    from rescore.pipelines.sample import make_experience
    from rescore.pipelines.doors.trinity_sql import write_trinity_sqlite

    write_trinity_sqlite(make_experience(seed=kw.pop("seed", 0), **kw), str(path), "experience")
    return f"sqlite:///{path}"


def _insert(url, name, rows):
    """rows: (task_id, run_id, reward, blob or None)."""
    db = url[len("sqlite:///"):]
    con = sqlite3.connect(db)
    start = con.execute(f"SELECT coalesce(max(id), 0) FROM {name}").fetchone()[0] + 1
    for i, (task, run, reward, blob) in enumerate(rows):
        con.execute(f"INSERT INTO {name} (id, task_id, run_id, msg_id, model_version, reward, consumed) "
                    "VALUES (?, ?, ?, ?, 0, ?, 0)", (start + i, task, run, f"bad{i}", reward))
        if blob is not None:
            con.execute(f"INSERT INTO {name}_blob (id, experience_bytes) VALUES (?, ?)", (start + i, blob))
    con.commit()
    con.close()
    return list(range(start, start + len(rows)))


def _cli(*args, cwd=None):
    env = {**os.environ, "PYTHONPATH": ROOT}
    return subprocess.run([sys.executable, "-m", "rescore", *args, RUNNER], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=300)


# --- the TRXP format ---------------------------------------------------------------------------

def test_blob_round_trip_keeps_every_field_and_dtype():
    item = trxp.new_item(eid={"batch": 3, "task": "t", "run": 1, "step": 0, "suffix": "x"}, reward=0.5, prompt_length=2)
    item["messages"] = [{"role": "user", "content": "hi"}]
    item["metrics"] = {"m": np.float64(0.25)}
    fields = {"tokens": torch.tensor([1, 2, 3, 4], dtype=torch.int32), "logprobs": torch.tensor([-0.5, -1.5]),
              "action_mask": torch.tensor([True, False]), "routed_experts": torch.zeros(3, 2, 2, dtype=torch.uint8),
              "multi_modal_inputs:pixel": torch.ones(2, 2, dtype=torch.bfloat16)}
    ((back, t),) = trxp.decode(trxp.encode([(item, fields)]))
    assert back["eid"] == item["eid"] and back["messages"] == item["messages"] and back["metrics"]["m"] == 0.25
    assert set(t) == set(fields)
    for k, v in fields.items():
        assert t[k].dtype == v.dtype and t[k].shape == v.shape and torch.equal(t[k], v)


def test_malicious_pickle_runs_nothing_and_names_the_callable(tmp_path):
    marker = tmp_path / "pwned"
    blob = _raw_blob(pickle.dumps({"version": 1, "num_items": 1, "items": [_Evil(marker)]}))
    with pytest.raises(trxp.BlobError, match=r"unsafe_pickle: .*(posix|os)\.system"):
        trxp.decode(blob)
    assert not marker.exists()
    # builtins.eval / exec and Trinity's own classes are refused the same way
    for module, name in (("builtins", "eval"), ("subprocess", "Popen"), ("trinity.common.experience", "Experience")):
        evil = f"c{module}\n{name}\n(S'1'\ntR.".encode()
        with pytest.raises(trxp.BlobError, match=f"unsafe_pickle: the metadata pickle names {module}.{name}"):
            trxp.loads_plain(evil)


def test_legacy_and_garbage_blobs_are_refused():
    legacy = pickle.dumps({"tokens": [1, 2]})
    with pytest.raises(trxp.BlobError, match="not a TRXP blob"):
        trxp.decode(legacy)
    with pytest.raises(trxp.BlobError, match="truncated"):
        trxp.decode(_blob()[:-10])
    with pytest.raises(trxp.BlobError, match="bad_blob"):
        trxp.decode(_raw_blob(b"not a pickle at all"))


def test_id_ranges_cover_every_id_once():
    for lo, hi, count, shard in ((1, 100, 100, 7), (5, 5, 1, 10), (1, 10**6, 10, 3), (1, 9, 9, 100)):
        ranges = sql_database.id_ranges(lo, hi, count, shard)
        ids = [i for a, b in ranges for i in range(a, b)] if hi - lo < 10**5 else None
        assert ranges[0][0] == lo and ranges[-1][1] == hi + 1
        assert all(a < b for a, b in ranges) and all(x[1] == y[0] for x, y in zip(ranges, ranges[1:]))
        assert len(ranges) == -(-count // shard)
        if ids is not None:
            assert ids == list(range(lo, hi + 1))


# --- reading a buffer --------------------------------------------------------------------------

def test_buffer_in_parallel_ranges_scores_like_grpo(tmp_path, rescore, monkeypatch):
    monkeypatch.setattr(sql_database, "STAGE_ROWS", 3)  # several row groups per staged range
    url = _sample_buffer(tmp_path / "buffer.db", batches=2, tasks=5, runs=4)
    plan = sql_database.plan_source(url, "experience", 7)
    assert plan.rows == 40 and len(plan.ranges) == 6
    doc, out = rescore(url, "--input-table", "experience", "--strategy", "grpo", "--shard-rows", "7")
    assert doc["source"] == {"format": "trinity-sql", "url": url, "table": "experience", "rows": 40, "id_ranges": 6}
    assert doc["totals"]["rows_read"] == 40 and doc["totals"]["rows_written"] == 40 and doc["input"] == [url]
    assert os.path.exists(os.path.join(out, "_SUCCESS")) and not os.path.exists(os.path.join(out, "_source"))
    scored = read_output(out).to_pylist()
    # every buffer row once, with the ids Trinity's reader gives it (task from task_id: a string)
    assert sorted(r["sql_id"] for r in scored) == list(range(1, 41))
    assert all(isinstance(r["task"], str) for r in scored)
    expected = reference.rescore(scored, "grpo")["scored"]  # (batch, task, run, step) -> (score, advantages)
    for r in scored:
        score = expected[(r["batch"], r["task"], r["run"], r["step"])][0]
        assert r["score"] == pytest.approx(score, abs=1e-5)
        np.testing.assert_allclose(r["advantages"], np.float32(score) * np.asarray(r["action_mask"], np.float32), atol=1e-5)
        assert len(r["advantages"]) == len(r["tokens"]) - r["prompt_length"]
        assert r["trinity_blob"][:4] == b"TRXP"


@pytest.mark.slow
def test_bad_blobs_are_rejected_with_reasons_and_nothing_runs(tmp_path, rescore):
    url = _sample_buffer(tmp_path / "buffer.db", batches=1, tasks=3, runs=4)
    marker = tmp_path / "pwned"
    evil = _raw_blob(pickle.dumps({"version": 1, "num_items": 1, "items": [_Evil(marker)]}))
    ids = _insert(url, "experience", [
        ("0", 9, 1.0, b"\x00garbage"),
        ("0", 10, 1.0, _blob(response=4, logprobs=torch.zeros(6))),   # 6 logprobs, 4 response tokens
        ("0", 11, 1.0, evil),
        ("0", 12, 1.0, None),                                          # no blob row
        ("0", 13, 1.0, _blob(batch="eval-3", response=4)),             # a batch id that is no integer
    ])
    doc, out = rescore(url, "--input-table", "experience", "--strategy", "grpo")
    assert not marker.exists()
    rejected = {r["sql_id"]: r["reject_reason"] for r in read_output(out, "rejected").to_pylist()}
    assert sorted(rejected) == ids
    assert rejected[ids[0]].startswith("bad_blob: not a TRXP blob")
    assert rejected[ids[1]].startswith("length_mismatch: logprobs has 6 values but tokens - prompt_length is 7 - 3 = 4")
    assert rejected[ids[2]].startswith("unsafe_pickle:") and "system" in rejected[ids[2]]
    assert rejected[ids[3]] == f"missing_blob: no row {ids[3]} in the _blob table"
    assert rejected[ids[4]].startswith("bad_eid: eid.batch is 'eval-3', not an integer")
    reasons = doc["totals"]["reject_reasons"]
    assert reasons == {"bad_blob": 1, "length_mismatch": 1, "unsafe_pickle": 1, "missing_blob": 1, "bad_eid": 1}
    assert doc["totals"]["rows_written"] == 12


BAD_SOURCES = [
    (["--input", "sqlite:///{d}/buffer.db", "--input-table", "nope"], "no table 'nope' in sqlite:///"),
    (["--input", "sqlite:///{d}/missing.db", "--input-table", "experience"], "no SQLite database file"),
    (["--input", "postgresql://u:secret@127.0.0.1:1/db", "--input-table", "experience"], "cannot connect to postgresql://u:***@127.0.0.1:1/db"),
    (["--input", "nosuchdb://x/y", "--input-table", "experience"], "cannot open nosuchdb://x/y: Can't load plugin"),
    (["--input", "{d}/buffer.db", "--input-table", "experience"], "is not a database URL (e.g. sqlite:///buffer.db"),
    (["--input", "sqlite:///{d}/buffer.db"], "is a database URL: name the Trinity buffer to read with --input-table"),
    (["--input", "sqlite:///{d}/buffer.db", "--input-table", "experience", "--output-db", "sqlite:///{d}/o.db"],
     "--output-db URL and --output-table NAME go together"),
]


@pytest.fixture(scope="module")
def bad_source_runs(tmp_path_factory):
    """Every BAD_SOURCES command line, each with its own buffer, in one child process (batched.py):
    {args: (code, stderr, directory)}."""
    work = tmp_path_factory.mktemp("bad-sources")
    dirs = [work / f"d{i}" for i in range(len(BAD_SOURCES))]
    for d in dirs:
        d.mkdir()
        _sample_buffer(d / "buffer.db", batches=1, tasks=2, runs=2)
    runs = run_many(work, [[a.format(d=d) for a in args] + ["--output", str(d / "out"), "--strategy", "grpo", RUNNER]
                           for d, (args, _) in zip(dirs, BAD_SOURCES)])
    return {tuple(args): (code, err, d) for (args, _), (code, err), d in zip(BAD_SOURCES, runs, dirs)}


@pytest.mark.slow
@pytest.mark.parametrize("args, message", BAD_SOURCES)
def test_bad_source_is_one_line_exit_2(bad_source_runs, args, message):
    code, stderr, d = bad_source_runs[tuple(args)]
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rescore: error: ") and message in lines[0], stderr
    assert "secret" not in stderr
    assert not (d / "missing.db").exists()


# --- writing a buffer --------------------------------------------------------------------------

def _read_buffer(url, name):
    """(meta rows, decoded blobs) by id, with this package's decoder."""
    con = sqlite3.connect(url[len("sqlite:///"):])
    meta = {r[0]: r for r in con.execute(f"SELECT id, task_id, run_id, msg_id, model_version, reward, consumed FROM {name}")}
    blobs = {i: trxp.decode(b)[0] for i, b in con.execute(f"SELECT id, experience_bytes FROM {name}_blob")}
    con.close()
    return meta, blobs


@pytest.mark.slow
def test_output_db_holds_every_scored_row_once(tmp_path, rescore):
    url = _sample_buffer(tmp_path / "buffer.db", batches=2, tasks=4, runs=4)
    out_url = f"sqlite:///{tmp_path}/scored.db"
    doc, out = rescore(url, "--input-table", "experience", "--strategy", "grpo,duplicate_informative",
                       "--output-db", out_url, "--output-table", "rescored", "--shard-rows", "9")
    scored = read_output(out).to_pylist()
    assert doc["buffer"] == {"url": out_url, "table": "rescored", "rows": len(scored)}
    meta, blobs = _read_buffer(out_url, "rescored")
    assert sorted(meta) == list(range(1, len(scored) + 1)) and sorted(blobs) == sorted(meta)
    src_meta, src_blobs = _read_buffer(url, "experience")
    suffixes = set()
    for i, (item, t) in blobs.items():
        _, task, run, msg, version, reward, consumed = meta[i]
        assert consumed == 0 and msg == item["eid"]["suffix"]
        suffixes.add(msg)
        row = next(r for r in scored if str(r["task"]) == task and r["run"] == run and r["batch"] == item["eid"]["batch"]
                   and msg.startswith(r["msg_id"]) and (r.get("copy_index") or 0) == (int(msg.split("-c")[1]) if "-c" in msg else 0))
        assert reward == row["reward"] and version == row["model_version"]
        np.testing.assert_array_equal(t["advantages"].numpy(), np.asarray(row["advantages"], np.float32))
        np.testing.assert_array_equal(t["returns"].numpy(), np.asarray(row["returns"], np.float32))
        _, src_t = src_blobs[row["sql_id"]]
        for name in ("tokens", "logprobs", "action_mask"):  # the tensors read, bit for bit, dtype too
            assert t[name].dtype == src_t[name].dtype and torch.equal(t[name], src_t[name])
    assert len(suffixes) == len(blobs)  # copies get ids of their own
    assert doc["totals"]["rows_duplicated"] > 0


@pytest.mark.slow
def test_output_table_is_refused_then_replaced_atomically(tmp_path, rescore):
    url = _sample_buffer(tmp_path / "buffer.db", batches=1, tasks=3, runs=4)
    out_url = f"sqlite:///{tmp_path}/scored.db"
    rescore(url, "--input-table", "experience", "--strategy", "grpo", "--output-db", out_url, "--output-table", "t")
    proc = _cli("--input", url, "--input-table", "experience", "--strategy", "rloo", "--output", str(tmp_path / "o2"),
                "--output-db", out_url, "--output-table", "t")
    assert proc.returncode == 2 and "table 't' already exists" in proc.stderr and "--overwrite" in proc.stderr
    assert not (tmp_path / "o2" / "_source").exists()

    # a run failing while inserting: 't' keeps its old rows, its staging tables are dropped and
    # the Parquet output it published claims no success
    env = {**os.environ, "PYTHONPATH": ROOT, "RESCORE_TEST_INJECT_FAULT": "fail_insert:1"}
    proc = subprocess.run([sys.executable, "-m", "rescore", "--input", url, "--input-table", "experience",
                           "--strategy", "rloo", "--output", str(tmp_path / "o3"), "--output-db", out_url,
                           "--output-table", "t", "--overwrite", RUNNER], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr
    con = sqlite3.connect(f"{tmp_path}/scored.db")
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert names == {"t", "t_blob"}, names
    assert not (tmp_path / "o3" / "_SUCCESS").exists() and not (tmp_path / "o3" / "_source").exists()
    before = con.execute("SELECT count(*) FROM t").fetchone()[0]
    con.close()
    _, old = _read_buffer(out_url, "t")
    grpo_adv = {i: t["advantages"] for i, (_, t) in old.items()}

    doc, _ = rescore(url, "--input-table", "experience", "--strategy", "rloo", "--output-db", out_url,
                     "--output-table", "t", "--overwrite", output=str(tmp_path / "o4"))
    con = sqlite3.connect(f"{tmp_path}/scored.db")
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    assert names == {"t", "t_blob"}  # no staging tables
    _, new = _read_buffer(out_url, "t")
    assert len(new) == before == doc["buffer"]["rows"]
    assert any(not torch.equal(new[i][1]["advantages"], grpo_adv[i]) for i in new)  # RLOO replaced GRPO


def _one_error(proc, code, message):
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code and len(lines) == 1 and lines[0].startswith("rescore: error: "), proc.stderr
    assert message in lines[0], proc.stderr


def _tables(db):
    con = sqlite3.connect(db)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.close()
    return names


@pytest.mark.slow
def test_output_db_checks_every_input_file_before_running(tmp_path):
    """A later input file without token ids: exit 2 before anything runs, the finished run kept."""
    from rescore.pipelines.doors.parquet import write_files
    from rescore.pipelines.sample import make_experience

    files = write_files(make_experience(batches=1, tasks=3, runs=3), str(tmp_path / "data"))
    mix = tmp_path / "mixin"
    mix.mkdir()
    pq.write_table(pq.read_table(files[0]), str(mix / "a.parquet"))
    pq.write_table(pq.read_table(files[1]).drop(["tokens", "prompt_length", "logprobs", "action_mask"]),
                   str(mix / "b.parquet"))
    out = tmp_path / "out"
    from rescore.pipelines.cli import main

    assert main(["--input", str(tmp_path / "data" / "*.parquet"), "--output", str(out), "--strategy", "rloo", "--quiet", RUNNER]) == 0
    metrics = (out / "metrics.json").read_text()
    proc = _cli("--input", str(mix / "*.parquet"), "--output", str(out), "--strategy", "grpo", "--overwrite",
                "--output-db", f"sqlite:///{tmp_path}/mix.db", "--output-table", "experience")
    _one_error(proc, 2, f"{mix / 'b.parquet'}: --output-db writes Trinity experiences, which need token ids")
    assert (out / "_SUCCESS").exists() and (out / "metrics.json").read_text() == metrics  # the rloo run, untouched
    assert not os.path.exists(tmp_path / "mix.db") or not _tables(tmp_path / "mix.db")


@pytest.mark.slow
def test_buffer_failure_leaves_no_success_and_no_staging_tables(tmp_path, rescore, monkeypatch):
    """A table created by another writer during the run: ConfigError, staging tables dropped,
    and the Parquet output published before the buffer no longer claims success."""
    from rescore.transforms.strategies import ConfigError

    url = _sample_buffer(tmp_path / "buffer.db", batches=1, tasks=3, runs=4)
    out_url = f"sqlite:///{tmp_path}/scored.db"
    real = sql_database.prepare_staging

    def racing(url_, table, token):
        real(url_, table, token)
        con = sqlite3.connect(f"{tmp_path}/scored.db")
        con.execute(f"CREATE TABLE {table} (id INTEGER)")  # another writer, mid-run
        con.commit()
        con.close()

    monkeypatch.setattr(sql_database, "prepare_staging", racing)
    with pytest.raises(ConfigError, match="table 't' appeared .* during the run.*left without _SUCCESS"):
        rescore(url, "--input-table", "experience", "--strategy", "grpo", "--output-db", out_url, "--output-table", "t")
    out = tmp_path / "out"
    assert not (out / "_SUCCESS").exists() and not (out / "_source").exists()
    assert "_SUCCESS" not in (out / "_rescore_files.json").read_text()
    assert _tables(tmp_path / "scored.db") == {"t"}  # the other writer's table; no staging tables


@pytest.mark.slow
def test_source_input_is_validated_before_staging_and_source_removed(tmp_path):
    url = _sample_buffer(tmp_path / "buffer.db", batches=1, tasks=3, runs=4)
    base = ["--input", url, "--input-table", "experience", "--algorithm", "grpo", RUNNER]
    (tmp_path / "f4").mkdir()
    (tmp_path / "f4" / "metrics.json").write_text("{}")
    f6 = tmp_path / "f6"
    bad_param, foreign, finished = _procs(run_many(tmp_path / "f0", [
        [*base, "--output", str(tmp_path / "f3"), "--set", "nonexistent=1"],
        [*base, "--output", str(tmp_path / "f4")],
        [*base, "--output", str(f6), "--quiet"],
    ]))  # one child process for the runs (batched.py), each with its own stderr
    # a bad parameter: nothing is written at all
    _one_error(bad_param, 2, "unknown parameter 'nonexistent'")
    assert not (tmp_path / "f3").exists()
    # a foreign metrics.json in the output: refused before staging
    _one_error(foreign, 2, "holds 'metrics.json', which Rescore did not write")
    assert sorted(os.listdir(tmp_path / "f4")) == ["metrics.json"]
    # a pipeline failure over a finished run: the run is kept, _source removed
    assert finished.returncode == 0 and not (f6 / "_source").exists(), finished.stderr
    before = sorted(os.listdir(f6))
    (tmp_path / "f5" / "_source").mkdir(parents=True)
    (tmp_path / "f5" / "_source" / "important.txt").write_text("mine")
    failed, user_source = _procs(run_many(tmp_path / "f0", [
        [*base, "--output", str(f6), "--max-group-rows", "2", "--overwrite"],
        [*base, "--output", str(tmp_path / "f5")],
    ]))
    _one_error(failed, 1, "more than --max-group-rows=2")
    assert sorted(os.listdir(f6)) == before and (f6 / "_SUCCESS").exists()
    # the user's own OUTPUT/_source is never emptied
    _one_error(user_source, 2, "_source exists and holds 'important.txt', which Rescore did not write")
    assert os.listdir(tmp_path / "f5") == ["_source"]
    assert (tmp_path / "f5" / "_source" / "important.txt").read_text() == "mine"


def _procs(runs):
    """run_many's (exit status, stderr) pairs as the CompletedProcess that _one_error reads."""
    return [subprocess.CompletedProcess([], code, "", err) for code, err in runs]


@pytest.mark.slow
def test_verl_input_failing_after_staging_removes_source(tmp_path):
    from rescore.pipelines.sample import main as sample

    assert sample(["--format", "verl-rollouts", "--output", str(tmp_path / "verl")]) == 0
    (tmp_path / "myrf.py").write_text("def score(**kw):\n    return 1.0\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{tmp_path}"}
    proc = subprocess.run([sys.executable, "-m", "rescore", "--input", str(tmp_path / "verl"), "--input-format",
                           "verl-rollouts", "--output", str(tmp_path / "v1"), "--strategy", "grpo", "--reward-fn",
                           "myrf:score", RUNNER], capture_output=True, text=True, env=env, timeout=300)
    _one_error(proc, 2, "no input file has a 'tokens' column")
    assert not (tmp_path / "v1" / "_source").exists()


@pytest.mark.slow
def test_parquet_input_to_buffer_and_verl_refused(tmp_path, rescore):
    from rescore.pipelines.doors.parquet import write_files
    from rescore.pipelines.sample import make_experience

    write_files(make_experience(batches=1, tasks=3, runs=3), str(tmp_path / "data"))
    out_url = f"sqlite:///{tmp_path}/scored.db"
    doc, out = rescore(str(tmp_path / "data" / "*.parquet"), "--strategy", "grpo", "--output-db", out_url,
                       "--output-table", "exp")
    meta, blobs = _read_buffer(out_url, "exp")
    assert len(meta) == doc["totals"]["rows_written"] == 9
    scored = {(r["task"], r["run"]): r for r in read_output(out).to_pylist()}
    for i, (item, t) in blobs.items():
        row = scored[(item["eid"]["task"], item["eid"]["run"])]
        assert t["tokens"].dtype == torch.int32 and t["tokens"].tolist() == row["tokens"]
        assert item["prompt_length"] == row["prompt_length"] and meta[i][1] == str(row["task"])
        np.testing.assert_array_equal(t["advantages"].numpy(), np.asarray(row["advantages"], np.float32))


@pytest.mark.slow
def test_sample_buffer_command(tmp_path):
    proc, again = _procs(run_many(tmp_path, [
        ["sample", "--format", "trinity-sql", "--output", str(tmp_path / "b.db"), "--batches", "1", "--tasks", "2", "--runs", "3"],
        ["sample", "--format", "trinity-sql", "--output", str(tmp_path / "b.db")],
    ]))  # one child process (batched.py), each run with its own stderr
    assert proc.returncode == 0, proc.stderr
    assert "wrote 6 experiences to the Trinity buffer 'experience'" in proc.stderr
    meta, blobs = _read_buffer(f"sqlite:///{tmp_path}/b.db", "experience")
    assert len(meta) == len(blobs) == 6
    assert again.returncode == 2 and "exists" in again.stderr


def test_staged_schema_parquet_is_valid_input(tmp_path):
    """The staged files pass the input contract as they are (a column type drift would fail here)."""
    from rescore.schemas import validate_file_schema

    url = _sample_buffer(tmp_path / "buffer.db", batches=1, tasks=2, runs=2)
    table = sql_database.read_range(url, "experience", 1, 100)
    eng = sql_database.engine(url)
    assert sql_database.stage_range(url, "experience", 1, 100, str(tmp_path / "s.parquet"), eng) == 4
    assert sql_database.stage_range(url, "experience", 100, 200, str(tmp_path / "empty.parquet"), eng) == 0
    eng.dispose()
    assert pq.read_table(tmp_path / "s.parquet").equals(table) and not (tmp_path / "empty.parquet").exists()
    assert not [n for n in os.listdir(tmp_path) if n.endswith('.tmp')]
    pq.write_table(table, tmp_path / "x.parquet")
    assert validate_file_schema(str(tmp_path / "x.parquet"), pq.read_schema(tmp_path / "x.parquet")) == []
    assert table.num_rows == 4 and table["source_error"].null_count == 4


def test_yaml_config_keys_and_flags(tmp_path):
    from rescore.pipelines.config import parse_args
    from rescore.transforms.strategies import ConfigError

    cfg_file = tmp_path / "run.yaml"
    cfg_file.write_text("input: sqlite:///b.db\ninput_table: experience\noutput: out\nstrategy: grpo\n"
                        "output_db: postgresql://u@h/db\noutput_table: rescored\n")
    cfg = parse_args(["--config", str(cfg_file)])
    assert (cfg.inputs, cfg.input_table, cfg.output_db, cfg.output_table) == (
        ["sqlite:///b.db"], "experience", "postgresql://u@h/db", "rescored")
    cfg = parse_args(["--config", str(cfg_file), "--output-table", "other", "--input-format", "parquet"])
    assert cfg.output_table == "other" and cfg.input_format == "parquet"
    with pytest.raises(ConfigError, match="takes no --input-format"):
        parse_args(["--config", str(cfg_file), "--input-format", "verl-rollouts"])
    with pytest.raises(ConfigError, match="invalid choice"):
        parse_args(["--input", "x", "--output", "o", "--strategy", "grpo", "--input-format", "jsonl"])


def test_async_driver_names_from_trinity_configs_map_to_sync_drivers():
    assert sql_database._sync_driver("sqlite+aiosqlite") == "sqlite"
    assert sql_database._sync_driver("postgresql+asyncpg") == "postgresql+psycopg"
    assert sql_database._sync_driver("postgresql") == "postgresql+psycopg"
    assert sql_database._sync_driver("mysql+pymysql") == "mysql+pymysql"
    eng = sql_database.engine("sqlite+aiosqlite:///:memory:")
    assert eng.dialect.driver == "pysqlite"
    eng.dispose()


@pytest.mark.slow
def test_hostile_rows_are_rejected_and_the_run_scores_the_rest(tmp_path, rescore):
    """Issue 28, defect 6: blobs whose safetensors header lies, an `info` nested 100,000 deep,
    text in SQLite's numeric columns, text that is not UTF-8, a blob column holding a number:
    each is one rejected row with its reason; the run succeeds and scores the rest exactly."""
    import trinity_hostile as hostile

    url = _sample_buffer(tmp_path / "buffer.db", batches=1, tasks=3, runs=4)
    lies = ["negative_shape", "overflowing_shape", "offsets_beyond", "huge_header_length", "wrong_dtype",
            "deep_info", "deep_tensor_header", "bool_not_0_1", "surrogate_text"]
    ids = _insert(url, "experience", [("0", 20 + i, 1.0, hostile.HOSTILE[name][0]) for i, name in enumerate(lies)])
    con = sqlite3.connect(url[len("sqlite:///"):])
    odd = [  # (task_id, run_id, reward, model_version, blob) as SQL expressions
        ("'0'", "30", "'n/a'", "0", "?"),
        ("'0'", "'two'", "1.0", "0", "?"),
        ("'0'", "31", "1.0", "'v2'", "?"),
        ("CAST(x'ff00' AS TEXT)", "32", "1.0", "0", "?"),
        ("'0'", "33", "1.0", "0", "1000000000"),
        ("'0'", "34", "1.0", "0", "'TRXP as text'"),
    ]
    first = ids[-1] + 1
    for i, (task, run, reward, version, blob) in enumerate(odd):
        con.execute(f"INSERT INTO experience (id, task_id, run_id, msg_id, model_version, reward, consumed) "
                    f"VALUES ({first + i}, {task}, {run}, 'm{i}', {version}, {reward}, 0)")
        params = (hostile.valid_blob(),) if blob == "?" else ()
        con.execute(f"INSERT INTO experience_blob (id, experience_bytes) VALUES ({first + i}, {blob})", params)
    con.commit()
    con.close()
    doc, out = rescore(url, "--input-table", "experience", "--strategy", "grpo", "--max-reject-fraction", "1")
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    rejected = {r["sql_id"]: r["reject_reason"] for r in read_output(out, "rejected").to_pylist()}
    assert sorted(rejected) == ids + list(range(first, first + len(odd)))
    for i, name in zip(ids, lies):
        assert rejected[i].startswith(hostile.HOSTILE[name][1]), (name, rejected[i])
    assert [rejected[first + i].split(":")[0] for i in range(len(odd))] == [
        "bad_reward", "bad_run", "bad_model_version", "bad_task", "bad_blob", "bad_blob"]
    assert rejected[first] == "bad_reward: reward is 'n/a', not a number"
    assert rejected[first + 4] == "bad_blob: experience_bytes holds int, not bytes"
    totals = doc["totals"]
    assert (totals["rows_read"], totals["rows_written"], totals["rows_rejected"]) == (12 + len(lies) + len(odd), 12, len(lies) + len(odd))
    scored = read_output(out).to_pylist()
    expected = reference.rescore(scored, "grpo")["scored"]
    for r in scored:
        assert r["score"] == pytest.approx(expected[(r["batch"], r["task"], r["run"], r["step"])][0], abs=1e-5)
