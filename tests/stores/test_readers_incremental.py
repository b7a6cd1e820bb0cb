"""The incremental Delta table on a bucket (issue 38): `--incremental` into gs:// and s3:// over
several days, against the real servers of tests/stores/servers.py, equals the same days run
into a local directory: the same scored rows (byte for byte once sorted by id), the same
accounting. Two writers of one table version: exactly one commit wins, decided by the store
(GCS: ifGenerationMatch=0, S3: If-None-Match). An S3 configuration whose commit cannot be
atomic is refused before any work.

GCS goes through tests/stores/gcs_xml.py: delta-rs writes with the XML API, which
fake-gcs-server lacks; the proxy turns those writes into the JSON-API uploads that mean the
same, and the server checks their preconditions."""

import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("deltalake")

from bucket_env import anonymous_gcs, store  # noqa: E402,F401  (fixtures)
from gcs_xml import XmlWrites  # noqa: E402

RUNNER = "--runner=FnApiRunner"
STRATEGY = ["--strategy", "grpo"]
ID = ["batch", "task", "run", "step"]
ACCOUNTING = ("table_version_before", "new_files", "changed_files", "deleted_files", "already_scored",
              "batches_rescored", "source_files", "table_version", "rows_committed")


def day_files():
    """Day 1: a.parquet (batches 0, 1); day 2: b.parquet (batch 2) and a.parquet rewritten
    (batch 1 gone from it: its rows are removed, batch 0 rescored)."""
    from rescore.pipelines.sample import make_experience

    rows = make_experience(batches=3, tasks=4, runs=4, seed=5)
    batch = rows["batch"].to_numpy()
    return [
        {"a.parquet": rows.filter(pa.array(batch < 2))},
        {"a.parquet": rows.filter(pa.array(batch == 0)), "b.parquet": rows.filter(pa.array(batch == 2))},
    ]


def parquet_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=16)
    return sink.getvalue().to_pybytes()


def sorted_rows(table: pa.Table) -> pa.Table:
    return table.sort_by([(c, "ascending") for c in ID])


def run_incremental(inputs: str, out: str, *extra: str) -> dict:
    from rescore.pipelines.cli import run

    return run(["--input", inputs, "--output", out, "--incremental", RUNNER, "--quiet", *STRATEGY, *extra])


@pytest.fixture(scope="module")
def local_days(tmp_path_factory):
    """The two days run into a local table: [(metrics document, sorted rows)] per day."""
    from rescore.pipelines.load import load_scored

    root = tmp_path_factory.mktemp("local-days")
    out, found = str(root / "table"), []
    for files in day_files():
        for name, table in files.items():
            (root / "in").mkdir(exist_ok=True)
            (root / "in" / name).write_bytes(parquet_bytes(table))
        doc = run_incremental(str(root / "in" / "*.parquet"), out)
        found.append((doc, sorted_rows(load_scored(out))))
    return found


@pytest.mark.slow
def test_days_on_a_bucket_equal_the_days_on_a_local_disk(store, local_days):
    from rescore.pipelines.load import load_scored

    scheme, server, _, beam_args = store
    bucket = server.bucket("days")
    out = f"{bucket}/table"
    for (want_doc, want_rows), files in zip(local_days, day_files()):
        for name, table in files.items():
            server.put(f"{bucket}/in/{name}", parquet_bytes(table))
        doc = run_incremental(f"{bucket}/in/*.parquet", out, *beam_args)
        got = sorted_rows(load_scored(out))
        assert got.num_rows == want_rows.num_rows > 0
        assert got.equals(want_rows), f"{scheme}: the table's rows differ from the local run's"
        assert {k: doc["incremental"][k] for k in ACCOUNTING} == {k: want_doc["incremental"][k] for k in ACCOUNTING}
    # day 3: nothing new
    doc = run_incremental(f"{bucket}/in/*.parquet", out, *beam_args)
    assert doc["nothing_new"] and doc["table_version"] == 1
    names = server.names(out)
    assert "_delta_log/00000000000000000001.json" in names and "_delta_log/00000000000000000002.json" not in names


def test_two_writers_of_one_version_exactly_one_wins(store):
    """Both commit against version 0 at once; the store lets one create version 1."""
    from rescore.errors import ConflictError
    from rescore.pipelines.load import load_scored
    from rescore.transforms.files import delta_table as dtab

    scheme, server, _, _ = store
    out = f"{server.bucket('race')}/table"
    rows = day_files()[0]["a.parquet"]
    base = dtab.State(strategy="grpo", config_hash="h", rows=[])
    dtab.commit(out, dtab.State(), base, set(), rows.slice(0, 0).to_reader(), rebuild=False)
    start = dtab.load_state(out)
    assert start.version == 0
    results, barrier = {}, threading.Barrier(2)

    def writer(b: int) -> None:
        mine = rows.filter(pa.array(rows["batch"].to_numpy() == b))
        state = dtab.State(strategy="grpo", config_hash="h", rows=[[b, b, mine.num_rows]],
                           runs=[{"run": f"writer-{b}"}])
        barrier.wait()
        try:
            results[b] = dtab.commit(out, start, state, {b}, mine.to_reader(), rebuild=False)
        except ConflictError as e:
            results[b] = e

    threads = [threading.Thread(target=writer, args=(b,)) for b in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    won = [b for b, r in results.items() if r == 1]
    lost = [b for b, r in results.items() if isinstance(r, ConflictError)]
    assert len(won) == 1 and len(lost) == 1, (scheme, results)
    assert "another run committed to" in str(results[lost[0]])
    table = load_scored(out)
    assert set(table["batch"].to_pylist()) == {won[0]}
    assert dtab.load_state(out).runs == [{"run": f"writer-{won[0]}"}]
    assert "_delta_log/00000000000000000002.json" not in server.names(out)


@pytest.mark.parametrize("setting", [{"AWS_CONDITIONAL_PUT": "disabled"}, {"AWS_S3_ALLOW_UNSAFE_RENAME": "true"}])
def test_an_s3_commit_that_cannot_be_atomic_is_refused_before_work(s3_server, forked, tmp_path, setting):
    bucket = s3_server.bucket("refused")
    s3_server.put(f"{bucket}/in/a.parquet", parquet_bytes(day_files()[0]["a.parquet"]))
    code, err = forked.run(["--input", f"{bucket}/in/*.parquet", "--output", f"{bucket}/table", "--incremental", RUNNER,
                            *STRATEGY, *s3_server.beam_args], {**s3_server.env, **setting})
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("rescore: error: ")
    assert f"{bucket}/table" in err and next(iter(setting)) in err
    assert [n for n in s3_server.names(bucket) if n.startswith("table/")] == []


@pytest.mark.slow
def test_a_refused_commit_publishes_nothing_and_a_rerun_equals_the_local_days(gcs_server, local_days, tmp_path):
    """Day 2 on GCS with the store refusing the commit's write (403 on version 1 of the log):
    exit 1, one line, the table still day 1's; the rerun then equals the local day 2."""
    from batched import ForkedRuns
    from servers import FaultProxy

    bucket = gcs_server.bucket("refused-commit")
    days = day_files()
    with XmlWrites(gcs_server.port) as xml, FaultProxy(xml.url) as proxy, \
            ForkedRuns(tmp_path / "runs", preload=("tests.stores.anon_gcs",)) as runs:
        env = {**gcs_server.env, "STORAGE_EMULATOR_HOST": proxy.url}
        argv = ["--input", f"{bucket}/in/*.parquet", "--output", f"{bucket}/table", "--incremental", RUNNER, *STRATEGY]
        for name, table in days[0].items():
            gcs_server.put(f"{bucket}/in/{name}", parquet_bytes(table))
        assert runs.run(argv, env)[0] == 0
        for name, table in days[1].items():
            gcs_server.put(f"{bucket}/in/{name}", parquet_bytes(table))
        fault = proxy.add(method="PUT", path="00000000000000000001", status=403, times=None)
        code, err = runs.run(argv, env)
        assert fault.hits >= 1 and code == 1, err
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("rescore: error: "), err
        names = gcs_server.names(f"{bucket}/table")
        assert "_delta_log/00000000000000000001.json" not in names
        code, out = runs.run(["show", f"{bucket}/table"], env)
        assert code == 0 and "version 0" in runs.stdout(), out
        proxy.clear()
        failed = {n.split("/")[2] for n in gcs_server.names(f"{bucket}/table") if n.startswith("_rescore/runs/")}
        assert len(failed) == 2  # day 1's and the failed run's work directories
        assert runs.run(argv, env)[0] == 0
        work = {n.split("/")[2] for n in gcs_server.names(f"{bucket}/table") if n.startswith("_rescore/runs/")}
        assert len(work) == 2 and len(work & failed) == 1  # the failed run's work is gone, the rerun's is there
        assert not [n for n in gcs_server.names(f"{bucket}/table") if "/scored-" in n]  # committed rows live in the table
    from rescore.pipelines.load import load_scored

    with pytest.MonkeyPatch.context() as mp:
        with XmlWrites(gcs_server.port) as xml:
            mp.setenv("STORAGE_EMULATOR_HOST", xml.url)
            assert sorted_rows(load_scored(f"{bucket}/table")).equals(local_days[1][1])
