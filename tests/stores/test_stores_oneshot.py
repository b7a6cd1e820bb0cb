"""The one-shot job with its input and output in a bucket, on a real GCS server (fake-gcs-server)
and a real S3 server (moto), compared with the same run on local paths: byte-identical scored
files, the same accounting in metrics.json; the output rules (_SUCCESS, --overwrite, files
Rescore did not write) and the output lock on both stores."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time

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


@pytest.mark.slow
def test_one_shot_run_in_a_bucket_equals_the_local_run_and_keeps_the_output_rules(store, local_run, tmp_path):
    """In process: the run, compared with the local one. Then, in one child process (real stderr):
    a second run without --overwrite (refused), with it (the same bytes again), a run into an
    output holding a file Rescore did not write (refused, the file kept), a run into an output
    whose lock another run holds (refused, naming the holder), and a run through a store that
    ignores the lock's condition (refused: the lock could not be atomic). The input and the output
    have a space, Unicode, '#' and '?' in their names (a glob's literal '?' is `[?]`): every object
    has exactly its name. An incremental table at such a path is refused before any work: delta-rs
    would write it at the path cut at the '#'."""
    from rescore.transforms.files import lock as output_lock

    server, bucket = store
    scheme = bucket.split("://")[0]
    output = f"{bucket}/out é #1 ?x/grpo"
    for name in ("part-0.parquet", "part-1.parquet"):
        server.put(f"{bucket}/in dir é#?/{name}", server.get(f"{bucket}/in/{name}"))
    doc = _run(server, "--input", f"{bucket}/in dir é#[?]/*.parquet", "--output", output, "--strategy", "grpo")
    assert doc["totals"]["rows_written"] == local_run[0]["totals"]["rows_written"] == 64
    names = _same_as_local(server, output, local_run)
    assert set(names) == {"_SUCCESS", "_rescore_files.json", "metrics.json", *local_run[1]}

    theirs, held, unguarded = f"{bucket}/theirs", f"{bucket}/held", f"{bucket}/unguarded"
    server.put(f"{theirs}/scored-00000-of-00001.parquet", b"not ours")
    with store_environment(server):
        holder = output_lock.acquire(held)
    args = ["--input", f"{bucket}/in/*.parquet", "--strategy", "grpo", RUNNER, "--quiet"]
    try:
        with FaultProxy(server.url) as proxy:
            if scheme == "s3":
                proxy.add(method="PUT", path="_rescore.lock", strip_header="If-None-Match", times=None)
                proxy_env = {**server.env, "AWS_ENDPOINT_URL": proxy.url}
                proxy_beam = [a.replace(server.url, proxy.url) for a in server.beam_args]
            else:
                proxy.add(method="POST", path="ifGenerationMatch=0", edit_query=("ifGenerationMatch=0", "x=0"), times=None)
                proxy_env, proxy_beam = {**server.env, "STORAGE_EMULATOR_HOST": proxy.url}, []
            runs = run_many(tmp_path, [
                ([*args, "--output", output, *server.beam_args], server.env),
                ([*args, "--output", output, "--overwrite", *server.beam_args], server.env),
                ([*args, "--output", theirs, *server.beam_args], server.env),
                ([*args, "--output", held, *server.beam_args], server.env),
                ([*args, "--output", unguarded, *proxy_beam], proxy_env),
                ([*args, "--output", f"{bucket}/day #2", "--incremental", *server.beam_args], server.env),
            ])
    finally:
        with store_environment(server):
            holder.release()
    (finished, _), (overwrite, overwrite_err), (foreign, _), (locked, locked_err), (unsafe, unsafe_err), cut = runs
    assert (finished, runs[0][1]) == (2, f"rescore: error: {output} already holds a finished run (_SUCCESS); pass --overwrite to replace it\n")
    assert overwrite == 0, overwrite_err
    _same_as_local(server, output, local_run)
    assert (foreign, runs[2][1]) == (2, f"rescore: error: --output {theirs} holds 'scored-00000-of-00001.parquet', which "
                                        "Rescore did not write; it deletes only its own files: pick another directory or "
                                        "move that file away\n")
    assert server.names(theirs) == ["scored-00000-of-00001.parquet"] and server.get(f"{theirs}/scored-00000-of-00001.parquet") == b"not ours"
    assert locked == 2 and locked_err.count("\n") == 1, locked_err
    assert locked_err.startswith(f"rescore: error: {held} is being written by another run (pid {os.getpid()} on host "), locked_err
    assert server.names(held) == []  # the holder released it; the refused run wrote nothing
    what = "conditional writes (If-None-Match)" if scheme == "s3" else "generation preconditions (ifGenerationMatch=0)"
    assert unsafe == 2 and unsafe_err.count("\n") == 1 and f"--output {unguarded}: this " in unsafe_err and what in unsafe_err, unsafe_err
    assert server.names(unguarded) == []
    assert cut == (2, f"rescore: error: {bucket}/day #2: a Delta table's path in a bucket cannot hold '#', which "
                      "delta-rs reads as the start of a URL's fragment (it would write the table at the path cut there); "
                      "pick a path without '#', '?' or '%' followed by two hex digits\n"), cut
    assert not [n for n in server.names(bucket) if n.startswith("day")]


def _race(output: str, racers: int) -> list:
    """`racers` threads take the output's lock at once: exactly one wins, the others are told
    that this process holds it; returns [the winner's lock]."""
    from rescore.errors import LockBusy
    from rescore.transforms.files import lock as output_lock

    won, busy, other = [], [], []
    start = threading.Barrier(racers)

    def take():
        start.wait()
        try:
            won.append(output_lock.acquire(output))
        except LockBusy as e:
            busy.append(str(e))
        except Exception as e:  # noqa: BLE001
            other.append(repr(e))

    threads = [threading.Thread(target=take) for _ in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert other == [] and len(won) == 1 and len(busy) == racers - 1, (won, busy, other)
    assert all(m.startswith(f"{output} is being written by another run (pid {os.getpid()} on host ") for m in busy)
    return won


def test_the_output_lock_has_exactly_one_winner(store):
    """Eight runs take the lock of one output at once: the store's conditional create (GCS
    ifGenerationMatch=0, S3 If-None-Match: *) lets exactly one through; the others are told who
    holds it. Released, it can be taken again."""
    from rescore.transforms.files import lock as output_lock
    from rescore.transforms.files import stores

    server, bucket = store
    output = f"{bucket}/raced"
    with store_environment(server):
        stores.preflight([("--output", output)], server.beam_args)
        won = _race(output, 8)
        assert server.names(output) == ["_rescore.lock"]
        holder = json.loads(server.get(f"{output}/_rescore.lock"))
        assert holder["pid"] == os.getpid()
        won[0].release()
        assert server.names(output) == []
        output_lock.acquire(output).release()


def test_a_stale_or_orphaned_lock_is_taken_over_and_by_one_run_only(store, monkeypatch):
    """The lock object a killed run left (its pid gone on this host) is taken over at once; one
    whose heartbeat stopped (another host) is refused while fresh and taken over once older than
    STALE_SECONDS; eight runs that find that stale lock at once: one takes it over, seven are told
    who holds it now (the takeover deletes only the lock object it saw, the create is
    create-if-absent, and each lock and each of its heartbeats has bytes of its own, so an ETag
    seen once names one version). GCS: fake-gcs-server deletes whatever the generation, so there the race
    runs once with the lock already taken over (real GCS applies ifGenerationMatch to a delete)."""
    from rescore.errors import LockBusy
    from rescore.transforms.files import lock as output_lock
    from rescore.transforms.files import stores

    server, bucket = store
    gone = subprocess.Popen(["true"])
    gone.wait()
    output = f"{bucket}/orphaned"
    lock = f"{output}/_rescore.lock"

    def left_by(pid, host):
        server.put(lock, json.dumps({"pid": pid, "host": host, "started": "2026-11-27T00:00:00+00:00"}).encode())

    with store_environment(server):
        stores.preflight([("--output", output)], server.beam_args)
        left_by(gone.pid, socket.gethostname())
        taken = output_lock.acquire(output)
        assert json.loads(server.get(lock))["pid"] == os.getpid()
        taken.release()
        assert server.names(output) == []

        left_by(1, "another-host")
        with pytest.raises(LockBusy, match=r"being written by another run \(pid 1 on host another-host, started "):
            output_lock.acquire(output)  # its heartbeat is fresh
        # (600 s and 60 s: the test would wait that long.) The winner's heartbeat keeps its new
        # lock fresh while the seven others judge it: S3's LastModified counts whole seconds,
        # so a lock written 0.1 s ago can read as 1.1 s old (with STALE_SECONDS at 1 s, a loaded
        # CI machine saw a second racer take over the winner's lock).
        monkeypatch.setattr(output_lock, "STALE_SECONDS", 3.0)
        monkeypatch.setattr(output_lock, "HEARTBEAT_SECONDS", 0.2)
        time.sleep(3.2)
        won = _race(output, 8 if bucket.startswith("s3://") else 1)
        first = json.loads(server.get(lock))
        assert first["host"] == socket.gethostname() and len(first["run"]) == 32
        deadline = time.monotonic() + 10
        while json.loads(server.get(lock)).get("beat", 0) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        beaten = json.loads(server.get(lock))
        # each refresh writes other bytes (S3: another ETag), the same acquisition's token
        assert beaten["beat"] >= 2 and beaten["run"] == first["run"], (first, beaten)
        won[0].release()
        assert server.names(output) == []
