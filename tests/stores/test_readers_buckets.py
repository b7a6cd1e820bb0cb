"""Every reader on a finished output in a bucket (issue 38) gives what it gives locally:
`load_scored`, `rescore show`, `rescore report OUT --to DIR` (both in the bucket),
`rescore task-stats --input BUCKET_OUTPUT`, `rescore export`, `rescore.torch.ScoredBatches`;
one-shot and incremental outputs, gs:// and s3://, against the servers of servers.py. The
outputs are made once, locally, and uploaded as they are. An output without `_SUCCESS` and a
damaged `_delta_log` in a bucket: one line, exit 2, as locally."""

import os

import pyarrow.parquet as pq
import pytest

pytest.importorskip("deltalake")

from batched import ForkedRuns  # noqa: E402
from bucket_env import anonymous_gcs, store  # noqa: E402,F401  (fixtures)
from servers import upload_tree  # noqa: E402

RUNNER = "--runner=FnApiRunner"


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """{'oneshot': dir, 'table': dir, 'input': glob}: a one-shot run and a one-day incremental
    table of the same 64 rows, on the local disk."""
    from rescore.pipelines.cli import run
    from rescore.pipelines.sample import make_experience

    root = tmp_path_factory.mktemp("readers")
    (root / "in").mkdir()
    pq.write_table(make_experience(batches=2, tasks=8, runs=4, seed=3), str(root / "in" / "a.parquet"), row_group_size=16)
    found = {"input": str(root / "in" / "*.parquet")}
    for kind, extra in (("oneshot", []), ("table", ["--incremental", "--run-name", "day1"])):
        found[kind] = str(root / kind)
        run(["--input", found["input"], "--output", found[kind], RUNNER, "--quiet", "--strategy", "grpo", *extra])
    return found


@pytest.fixture(scope="module")
def bucket(store, local):
    """(scheme, server, env, {'oneshot': url, 'table': url}) with both outputs uploaded."""
    scheme, server, env, _ = store
    base = server.bucket("readers")
    urls = {kind: f"{base}/{kind}" for kind in ("oneshot", "table")}
    for kind, url in urls.items():
        upload_tree(server, local[kind], url)
    return scheme, server, env, urls


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with ForkedRuns(tmp_path_factory.mktemp("forked"), preload=("tests.stores.anon_gcs",)) as r:
        yield r


@pytest.mark.parametrize("kind", ["oneshot", "table"])
def test_load_scored_and_scored_batches(bucket, local, kind):
    from rescore.pipelines.load import load_scored
    from rescore.torch import ScoredBatches

    _, _, _, urls = bucket
    want = load_scored(local[kind])
    got = load_scored(urls[kind])
    assert want.num_rows == 64 and got.equals(want)
    assert load_scored(urls[kind], columns=["batch", "score"]).equals(want.select(["batch", "score"]))
    mine, theirs = list(ScoredBatches(urls[kind], batch_size=16)), list(ScoredBatches(local[kind], batch_size=16))
    assert len(mine) == len(theirs) == 4
    for a, b in zip(mine, theirs):
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k] == b[k]).all() if hasattr(a[k], "shape") else a[k] == b[k], k


@pytest.mark.parametrize("kind", ["oneshot", "table"])
def test_show_prints_what_it_prints_locally(bucket, local, runs, kind):
    _, _, env, urls = bucket
    code, err = runs.run(["show", urls[kind], "--batches"], env)
    assert code == 0, err
    got = runs.stdout()
    code, _ = runs.run(["show", local[kind], "--batches"], env)
    want = runs.stdout()
    assert got.replace(urls[kind], "OUT") == want.replace(local[kind], "OUT") and "rows            64" in got


@pytest.fixture(scope="module")
def local_readers(local, runs, tmp_path_factory):
    """What report, task-stats and export write for the local outputs (once for both stores)."""
    root = tmp_path_factory.mktemp("local-readers")
    for kind in ("oneshot", "table"):
        assert runs.run(["report", local[kind], "--to", str(root / f"report-{kind}")])[0] == 0
    assert runs.run(["task-stats", "--input", local["table"], "--output", str(root / "stats"), RUNNER])[0] == 0
    assert runs.run(["export", local["table"], "--output", str(root / "sft"), "--format", "sft"])[0] == 0
    return root


@pytest.mark.slow
def test_report_task_stats_and_export_from_a_bucket(bucket, local_readers, runs, tmp_path):
    from rescore.transforms.files.layout import TASK_BATCH_STATS, TASK_STATS

    scheme, server, env, urls = bucket
    for kind in ("oneshot", "table"):
        rep = f"{urls['oneshot'].rsplit('/', 1)[0]}/report-{kind}"
        code, err = runs.run(["report", urls[kind], "--to", rep], env)
        assert code == 0, err
        assert server.names(rep) == sorted(os.listdir(local_readers / f"report-{kind}"))
        assert "report.html" in server.names(rep) and "report-reward.png" in server.names(rep)
    code, err = runs.run(["task-stats", "--input", urls["table"], "--output", str(tmp_path / "stats"), RUNNER], env)
    assert code == 0, err
    for name in (TASK_STATS, TASK_BATCH_STATS):
        got = pq.read_table(tmp_path / "stats" / name)
        assert got.num_rows > 0 and got.equals(pq.read_table(local_readers / "stats" / name)), name
    code, err = runs.run(["export", urls["table"], "--output", str(tmp_path / "sft"), "--format", "sft"], env)
    assert code == 0, err
    assert pq.read_table(tmp_path / "sft" / "sft.parquet").equals(pq.read_table(local_readers / "sft" / "sft.parquet"))


@pytest.mark.slow
def test_commands_that_publish_locally_refuse_a_bucket_and_report_keeps_a_users_chart(bucket, runs):
    """task-stats and export write a local directory only: --output in a bucket is exit 2 and one
    line saying why and how to copy it there, nothing written. report --to a bucket holding a
    chart Rescore did not write: refused as on a disk, the chart untouched."""
    scheme, server, env, urls = bucket
    base = urls["oneshot"].rsplit("/", 1)[0]
    copy = {"gs": "gcloud storage cp -r DIR", "s3": "aws s3 cp --recursive DIR"}[scheme]
    why = "writes a local directory only (its output checks and staged publish work on a local disk): write to a " \
          "local DIR, then copy it to the bucket"
    for argv, command in ((["task-stats", "--input", urls["table"], "--output", f"{base}/stats", RUNNER], "task-stats"),
                          (["task-stats", "--input", urls["table"], "--output", f"{base}/stats", "--incremental", RUNNER],
                           "task-stats"),
                          (["export", urls["table"], "--output", f"{base}/sft", "--format", "sft"], "export")):
        code, err = runs.run(argv, env)
        assert (code, err) == (2, f"rescore: error: --output {argv[argv.index('--output') + 1]}: rescore {command} "
                                  f"{why} ({copy} {argv[argv.index('--output') + 1]})\n"), err
    mine = f"{base}/mine"
    server.put(f"{mine}/report-reward.png", b"the user's own chart")
    code, err = runs.run(["report", urls["oneshot"], "--to", mine], env)
    assert (code, err) == (2, f"rescore: error: {mine}/report-reward.png is not Rescore's, and Rescore replaces only "
                              "its own files: move it away or pass --to another directory\n"), err
    assert server.names(mine) == ["report-reward.png"] and server.get(f"{mine}/report-reward.png") == b"the user's own chart"
    assert not [n for n in server.names(base) if n.startswith(("stats/", "sft/"))]


def test_an_unfinished_or_damaged_output_in_a_bucket_is_one_line(bucket, local, runs):
    scheme, server, env, urls = bucket
    base = urls["oneshot"].rsplit("/", 1)[0]
    # a one-shot output without _SUCCESS (a run in progress or failed)
    for name in server.names(urls["oneshot"]):
        if name != "_SUCCESS":
            server.put(f"{base}/unfinished/{name}", server.get(f"{urls['oneshot']}/{name}"))
    # a table whose latest commit is not JSON
    for name in server.names(urls["table"]):
        data = server.get(f"{urls['table']}/{name}")
        server.put(f"{base}/damaged/{name}", b"{not json\n" if name == "_delta_log/00000000000000000000.json" else data)
    for where, words in ((f"{base}/unfinished", "is not a finished Rescore output"),
                         (f"{base}/damaged", "Delta table cannot be read"),
                         (f"{base}/nowhere", "does not exist")):
        readers = [["show", where], ["export", where, "--output", "/nonexistent/x", "--format", "sft"]]
        if "unfinished" not in where:  # report draws an unfinished run's metrics.json, locally too
            readers.append(["report", where, "--to", f"{base}/rep-x"])
        for argv in readers:
            code, err = runs.run(argv, env)
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and lines[0].startswith("rescore: error: "), (argv, code, err)
            assert where in lines[0] and (words in lines[0] or argv[0] != "show"), (argv, lines)
    assert not [n for n in server.names(base) if n.startswith("rep-x/")]


def test_a_damaged_scored_file_fails_as_it_does_locally(bucket, local, runs, tmp_path):
    """A scored file that is not Parquet: `show` fails with one line and the exit status it has
    on a local copy of the same damage."""
    import shutil

    scheme, server, env, urls = bucket
    base = urls["oneshot"].rsplit("/", 1)[0]
    copy = tmp_path / "damaged"
    shutil.copytree(local["oneshot"], copy)
    victim = sorted(n for n in os.listdir(copy) if n.startswith("scored-"))[0]
    (copy / victim).write_bytes(b"PAR1 not parquet PAR1")
    upload_tree(server, str(copy), f"{base}/damaged-file")
    results = []
    for where in (f"{base}/damaged-file", str(copy)):
        code, err = runs.run(["show", where], env)
        lines = err.strip().splitlines()
        assert code != 0 and len(lines) == 1 and lines[0].startswith("rescore: error: "), (where, code, err)
        results.append((code, lines[0].replace(where, "OUT")))
    assert results[0][0] == results[1][0], results
