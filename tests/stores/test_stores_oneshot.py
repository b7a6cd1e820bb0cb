"""The one-shot job with its input and output in a bucket, on a real GCS server (fake-gcs-server)
and a real S3 server (moto), compared with the same run on local paths: byte-identical scored
files, the same accounting in metrics.json; the output rules (_SUCCESS, --overwrite, files
Rescore did not write) and the output lock on both stores."""

from __future__ import annotations

import json
import os
import threading

import pytest
from batched import run_many
from servers import FaultProxy, accounting, store_environment, upload_tree

BUCKET = "rescore-test"
RUNNER = "--runner=FnApiRunner"


@pytest.fixture(scope="module", params=["gs", "s3"])
def store(request, experience):
    """(server, bucket URL) with the experience uploaded under BUCKET/in/."""
    server = request.getfixturevalue("gcs_server" if request.param == "gs" else "s3_server")
    bucket = server.bucket(BUCKET)
    upload_tree(server, experience, f"{bucket}/in")
    return server, bucket


def _run(server, *args):
    from rescore.pipelines.cli import run

    with store_environment(server):
        return run([*args, RUNNER, "--quiet", *server.beam_args])


def _same_as_local(server, output, local_run):
    local_doc, local_files = local_run
    names = server.names(output)
    assert sorted(n for n in names if n.startswith("scored-")) == sorted(local_files)
    for name, data in local_files.items():
        assert server.get(f"{output}/{name}") == data, name
    doc = json.loads(server.get(f"{output}/metrics.json"))
    assert accounting(doc) == accounting(local_doc)
    assert doc["output"] == output
    assert "_SUCCESS" in names and not any(n.startswith(("_staging", "_rescore.lock")) for n in names)
    return names


def test_one_shot_run_in_a_bucket_equals_the_local_run(store, local_run):
    server, bucket = store
    output = f"{bucket}/out/grpo"
    doc = _run(server, "--input", f"{bucket}/in/*.parquet", "--output", output, "--strategy", "grpo")
    assert doc["totals"]["rows_written"] == local_run[0]["totals"]["rows_written"] == 64
    names = _same_as_local(server, output, local_run)
    assert set(names) == {"_SUCCESS", "_rescore_files.json", "metrics.json", *local_run[1]}

    # without --overwrite: refused, one line, exit 2; with it: replaced (the same bytes again)
    [(code, err), (code2, err2)] = _two_runs(server, bucket, output)
    assert code == 2 and err.strip() == f"rescore: error: {output} already holds a finished run (_SUCCESS); pass --overwrite to replace it", err
    assert code2 == 0, err2
    _same_as_local(server, output, local_run)


def _two_runs(server, bucket, output):
    import tempfile

    args = ["--input", f"{bucket}/in/*.parquet", "--output", output, "--strategy", "grpo", RUNNER, "--quiet", *server.beam_args]
    return run_many(tempfile.mkdtemp(prefix="stores-runs-"), [(args, server.env), ([*args, "--overwrite"], server.env)])


def test_a_file_rescore_did_not_write_is_refused_and_kept(store, tmp_path):
    server, bucket = store
    output = f"{bucket}/theirs"
    server.put(f"{output}/scored-00000-of-00001.parquet", b"not ours")
    [(code, err)] = run_many(tmp_path, [(["--input", f"{bucket}/in/*.parquet", "--output", output, "--strategy", "grpo",
                                          RUNNER, "--quiet", *server.beam_args], server.env)])
    assert code == 2 and err.strip() == (
        f"rescore: error: --output {output} holds 'scored-00000-of-00001.parquet', which Rescore did not write; "
        "it deletes only its own files: pick another directory or move that file away"), err
    assert server.get(f"{output}/scored-00000-of-00001.parquet") == b"not ours"
    assert server.names(output) == ["scored-00000-of-00001.parquet"]


def test_the_output_lock_has_exactly_one_winner(store):
    """Eight runs take the lock of one output at once: the store's conditional create (GCS
    ifGenerationMatch=0, S3 If-None-Match: *) lets exactly one through; the others are told who
    holds it. Released, it can be taken again."""
    from rescore.errors import LockBusy
    from rescore.transforms.files import lock as output_lock
    from rescore.transforms.files import stores

    server, bucket = store
    output = f"{bucket}/raced"
    won, busy, other = [], [], []
    start = threading.Barrier(8)

    def take():
        start.wait()
        try:
            won.append(output_lock.acquire(output))
        except LockBusy as e:
            busy.append(str(e))
        except Exception as e:  # noqa: BLE001
            other.append(repr(e))

    with store_environment(server):
        stores.preflight([("--output", output)], server.beam_args)
        threads = [threading.Thread(target=take) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert other == [] and len(won) == 1 and len(busy) == 7, (won, busy, other)
        assert all(m.startswith(f"{output} is being written by another run (pid {os.getpid()} on host ") for m in busy)
        assert server.names(output) == ["_rescore.lock"]
        holder = json.loads(server.get(f"{output}/_rescore.lock"))
        assert holder["pid"] == os.getpid()
        won[0].release()
        assert server.names(output) == []
        output_lock.acquire(output).release()


def test_a_run_into_a_locked_output_exits_2_naming_the_holder(store, tmp_path):
    from rescore.transforms.files import lock as output_lock
    from rescore.transforms.files import stores

    server, bucket = store
    output = f"{bucket}/held"
    with store_environment(server):
        stores.preflight([("--output", output)], server.beam_args)
        held = output_lock.acquire(output)
    try:
        [(code, err)] = run_many(tmp_path, [(["--input", f"{bucket}/in/*.parquet", "--output", output, "--strategy",
                                              "grpo", RUNNER, "--quiet", *server.beam_args], server.env)])
    finally:
        with store_environment(server):
            held.release()
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"rescore: error: {output} is being written by another run (pid {os.getpid()} on host "), err
    assert server.names(output) == []


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_a_store_that_ignores_the_condition_is_refused(scheme, tmp_path, request):
    """A store that drops the condition of a create (an old S3-compatible server; here a proxy
    strips If-None-Match, or the ifGenerationMatch parameter) would let two runs hold the lock:
    the run refuses with one line and leaves nothing behind."""
    server = request.getfixturevalue("gcs_server" if scheme == "gs" else "s3_server")
    bucket = server.bucket(BUCKET)
    with FaultProxy(server.url) as proxy:
        if scheme == "s3":
            proxy.add(method="PUT", path="_rescore.lock", strip_header="If-None-Match", times=None)
            env = {**server.env, "AWS_ENDPOINT_URL": proxy.url}
            beam = [a.replace(server.url, proxy.url) for a in server.beam_args]
        else:
            proxy.add(method="POST", path="ifGenerationMatch=0", edit_query=("ifGenerationMatch=0", "x=0"), times=None)
            env, beam = {**server.env, "STORAGE_EMULATOR_HOST": proxy.url}, []
        output = f"{bucket}/unguarded-{scheme}"
        [(code, err)] = run_many(tmp_path, [(["--input", f"{bucket}/in/*.parquet", "--output", output, "--strategy",
                                              "grpo", RUNNER, "--quiet", *beam], env)])
    what = "conditional writes (If-None-Match)" if scheme == "s3" else "generation preconditions (ifGenerationMatch=0)"
    assert code == 2 and err.count("\n") == 1 and f"--output {output}: this " in err and what in err, err
    assert server.names(output) == []
