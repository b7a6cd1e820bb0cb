"""Every output is checked before anything runs (issue 28, defect 8), and a Trinity buffer's
name is a name, never SQL (defects 5 and 7, SQLite side; PostgreSQL: test_postgres_buffers.py).
Exit statuses and messages are read from a real process's stderr (tests/batched.py)."""

import os
import sqlite3

import pyarrow.parquet as pq
import pytest
from batched import run_many
from conftest import RUNNER

from rescore.pipelines.sample import make_experience


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    d = tmp_path_factory.mktemp("sample")
    table = make_experience(batches=1, tasks=3, runs=3, seed=2)
    pq.write_table(table, str(d / "exp.parquet"))
    (d / "FILE").write_text("a regular file\n")
    os.mkdir(d / "adir")
    return d, table.num_rows


def _one_line(code, err, want_code, *needles):
    lines = err.strip().splitlines()
    assert code == want_code and len(lines) == 1 and lines[0].startswith("rescore: error: "), (code, err)
    for needle in needles:
        assert needle in lines[0], err


@pytest.mark.slow
def test_unreachable_outputs_are_refused_before_anything_runs(sample, tmp_path):
    d, _ = sample
    base = ["--input", str(d / "exp.parquet"), "--strategy", "grpo", RUNNER]
    out = str(tmp_path / "out")
    runs = [
        [*base, "--output", out, "--output-db", f"sqlite:///{d}/FILE/x.db", "--output-table", "exp"],
        [*base, "--output", out, "--output-db", f"sqlite:///{d}/FILE/deeper/x.db", "--output-table", "exp"],
        [*base, "--output", out, "--output-db", f"sqlite:///{d}/adir", "--output-table", "exp"],
        [*base, "--output", str(d / "FILE" / "out")],
        [*base, "--output", out, "--output-db", f"sqlite:///{tmp_path}/b.db", "--output-table", "a'||nextval('probe_seq')||'"],
        [*base, "--output", out, "--output-db", f"sqlite:///{tmp_path}/b.db", "--output-table", "x" * 59],
        [*base, "--output", out, "--output-db", f"sqlite:///{tmp_path}/b.db", "--output-table", "2fast"],
        ["report", str(d), "--to", str(d / "FILE" / "report")],
        [*base, "--output", out, "--output-db", f"sqlite:///{d}/FILE", "--output-table", "exp"],
    ]
    results = run_many(tmp_path / "runs", runs)
    _one_line(*results[0], 2, "FILE is a file, not a directory")
    _one_line(*results[1], 2, "FILE is a file, not a directory")
    _one_line(*results[2], 2, "is a directory, not a SQLite database file")
    _one_line(*results[3], 2, "is a file, not a directory")
    _one_line(*results[4], 2, "is not a table name Rescore writes")
    _one_line(*results[5], 2, "more than 58")
    _one_line(*results[6], 2, "is not a table name Rescore writes")
    _one_line(*results[7], 2, "--to", "is a file, not a directory")
    _one_line(*results[8], 2, "as --output-db: file is not a database")
    assert not os.path.exists(out) and not os.path.exists(tmp_path / "b.db")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["x" * 58, "Select", "_t9"])
def test_sqlite_buffer_names_up_to_58_characters_and_reserved_words(sample, tmp_path, rescore, name):
    from rescore.transforms import sql_database

    d, rows = sample
    url = f"sqlite:///{tmp_path}/scored.db"
    doc, _ = rescore(str(d / "exp.parquet"), "--strategy", "grpo", "--output-db", url, "--output-table", name)
    assert doc["buffer"]["rows"] == rows
    con = sqlite3.connect(f"{tmp_path}/scored.db")
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert names == {name, f"{name}_blob"}
    assert con.execute(f'SELECT count(*) FROM "{name}"').fetchone()[0] == rows
    con.close()
    assert sql_database.staging_names(name, "ab12")[0].startswith(sql_database.STAGING_PREFIX)
    assert max(len(n) for n in sql_database.staging_names(name, sql_database.new_token())) + len("ix__model_version") <= 63


def test_staging_names_fit_postgresql_and_leftovers_of_older_versions_are_found():
    from rescore.transforms import sql_database

    a, b = sql_database.staging_names("x" * 58, "0123456789")
    assert len(a) <= 40 and b == a + "_blob" and a != sql_database.staging_names("x" * 57, "0123456789")[0]
    names = [a, b, "x" * 58 + "__rescore_0123456789", "other", sql_database.staging_names("y", "0123456789")[0]]
    assert sql_database._leftover_staging("x" * 58, names) == names[:3]
    with pytest.raises(ValueError):
        sql_database.staging_names("t", "'; DROP TABLE t; --")


def test_a_retried_insert_of_a_file_does_not_double_its_rows(sample, tmp_path):
    """A worker lost mid-file makes Beam retry the bundle: the file's fixed ids are cleared and
    inserted again, so the buffer holds each row once (before: a duplicate key failed the run)."""
    import apache_beam as beam  # noqa: F401  (the DoFn module imports it)

    from rescore.transforms import sql_buffer, sql_database
    from rescore.transforms.rows import trinity_rows

    d, rows = sample
    scored = tmp_path / "scored.parquet"
    table = pq.read_table(d / "exp.parquet")
    import numpy as np
    import pyarrow as pa

    adv = [list(np.zeros(len(m), np.float32)) for m in table["action_mask"].to_pylist()]
    pq.write_table(table.append_column("advantages", pa.array(adv, pa.list_(pa.float32()))), str(scored))
    url = f"sqlite:///{tmp_path}/buf.db"
    token = sql_database.new_token()
    sql_database.prepare_staging(url, "exp", token)
    columns = trinity_rows.sink_columns(pq.read_schema(str(scored)))
    fn = sql_buffer._InsertFile(url, "exp", token, columns)
    fn.setup()
    assert list(fn.process((str(scored), 1))) == [rows]
    assert list(fn.process((str(scored), 1))) == [rows]  # the retry
    fn.teardown()
    assert sql_database.commit_staging(url, "exp", token, overwrite=False) == rows
