"""Faults on the store in the middle of a run, through a proxy in front of a real server
(servers.FaultProxy): what the client libraries retry (a 503, a slow first byte) leaves a run
equal to a clean one; what they do not (S3 gone for good, a write GCS refuses, a GCS upload
whose session died with the server) fails the run with one line, exit 1 and no _SUCCESS, and a rerun then equals a
clean run."""

from __future__ import annotations

import json
import threading
import pytest
from batched import run_many
from servers import FaultProxy, GcsServer, S3Server, accounting, store_environment, upload_tree

RUNNER = "--runner=FnApiRunner"


def _through(server, proxy):
    """(env, Beam arguments) that send a run's requests to `proxy` instead of `server`."""
    if isinstance(server, GcsServer):
        return {**server.env, "STORAGE_EMULATOR_HOST": proxy.url}, []
    return {**server.env, "AWS_ENDPOINT_URL": proxy.url}, [a.replace(server.url, proxy.url) for a in server.beam_args]


class _Env:
    def __init__(self, env):
        self.env = env


def _run_in_process(env, beam, bucket, output):
    from rescore.pipelines.cli import run

    with store_environment(_Env(env)):
        return run(["--input", f"{bucket}/in/*.parquet", "--output", output, "--strategy", "grpo", RUNNER, "--quiet", *beam])


def _equals_clean_run(server, output, local_run):
    local_doc, local_files = local_run
    names = server.names(output)
    assert sorted(n for n in names if n.startswith("scored-")) == sorted(local_files)
    assert all(server.get(f"{output}/{n}") == data for n, data in local_files.items())
    assert accounting(json.loads(server.get(f"{output}/metrics.json"))) == accounting(local_doc)
    assert "_SUCCESS" in names and not any(n.startswith("_staging") for n in names), names


@pytest.mark.slow
def test_gcs_retries_a_503_and_a_slow_first_byte(gcs_server, experience, local_run):
    server = gcs_server
    bucket = server.bucket("rescore-faults")
    upload_tree(server, experience, f"{bucket}/in")
    with FaultProxy(server.url) as proxy:
        slow = proxy.add(method="GET", path="/o/in%2Fpart-0", delay=3.0)  # (object data comes from its mediaLink: the server)
        unavailable = proxy.add(method="PUT", path="scored-00000", status=503)
        env, beam = _through(server, proxy)
        output = f"{bucket}/out"
        doc = _run_in_process(env, beam, bucket, output)
    assert (slow.hits, unavailable.hits) == (1, 1)
    assert doc["totals"]["rows_written"] == 64
    _equals_clean_run(server, output, local_run)


@pytest.mark.slow
def test_gcs_a_refused_write_or_a_restarted_server_fail_with_one_line_and_a_rerun_equals_a_clean_run(
        experience, local_run, tmp_path):
    """A write GCS refuses (403: not retried), and the server stopped in the middle of an upload
    and back 2 s later: the client retries the connection, but the upload session is gone with
    the server (fake-gcs-server keeps sessions in memory; real GCS keeps them a week), so the
    upload fails. Both: exit 1, one line, no _SUCCESS; then a rerun equals a clean run."""
    with GcsServer() as server:  # its own: stopped mid-run (its objects are on disk)
        bucket = server.bucket("rescore-refused")
        upload_tree(server, experience, f"{bucket}/in")
        refused, restarted = f"{bucket}/refused", f"{bucket}/restarted"

        def restart():
            server.stop()
            threading.Timer(2.0, server.start).start()

        with FaultProxy(server.url) as proxy:
            proxy.add(method="PUT", path="refused%2F_staging%2Fscored-", status=403, times=None,
                      body=b'{"error": {"code": 403, "message": "the retention policy forbids it"}}')
            stopped = proxy.add(method="PUT", path="restarted%2F_staging%2Fscored-", action=restart)
            env, beam = _through(server, proxy)
            args = ["--input", f"{bucket}/in/*.parquet", "--strategy", "grpo", RUNNER, "--quiet", *beam]
            runs = run_many(tmp_path, [([*args, "--output", refused], env), ([*args, "--output", restarted], env)])
        assert stopped.hits == 1 and any(status == 0 for _, _, status in proxy.requests)  # it found the server gone
        # the refusal names the object and what to check (google-resumable-media's own message was
        # "(403, 'Expected one of', <HTTPStatus.OK: 200>, ...)"); the lost upload session is its own
        for (code, err), start in zip(runs, (f"no permission to write {refused}/_staging/scored-", "(404, ")):
            assert code == 1 and err.count("\n") == 1 and err.startswith(f"rescore: error: pipeline failed: {start}"), err
        assert "(403 the retention policy forbids it): check that the account the run writes with" in runs[0][1]
        assert f"objects in {bucket} (storage.objects.create, storage.objects.delete)" in runs[0][1]
        for output in (refused, restarted):
            assert "_SUCCESS" not in server.names(output) and "metrics.json" not in server.names(output)
            _run_in_process(server.env, [], bucket, output)
            _equals_clean_run(server, output, local_run)


@pytest.mark.slow
def test_s3_retries_a_503_and_a_slow_first_byte(s3_server, experience, local_run):
    server = s3_server
    bucket = server.bucket("rescore-faults")
    upload_tree(server, experience, f"{bucket}/in")
    with FaultProxy(server.url) as proxy:
        slow = proxy.add(method="GET", path="/in/part-", delay=3.0)
        unavailable = proxy.add(method="PUT", path="scored-", status=503, times=2,
                                body=b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message></Error>")
        env, beam = _through(server, proxy)
        output = f"{bucket}/out"
        _run_in_process(env, beam, bucket, output)
    assert (slow.hits, unavailable.hits) == (1, 2)
    _equals_clean_run(server, output, local_run)


@pytest.mark.slow
def test_s3_server_stopped_mid_run_fails_with_one_line_and_a_rerun_equals_a_clean_run(experience, local_run, tmp_path):
    with S3Server() as server:
        bucket = server.bucket("rescore-stopped")
        upload_tree(server, experience, f"{bucket}/in")
        output = f"{bucket}/out"
        with FaultProxy(server.url) as proxy:
            stopped = proxy.add(method="PUT", path="_staging/scored-", action=server.stop)
            env, beam = _through(server, proxy)
            [(code, err)] = run_many(tmp_path, [(["--input", f"{bucket}/in/*.parquet", "--output", output, "--strategy",
                                                  "grpo", RUNNER, "--quiet", *beam], env)])
        assert stopped.hits == 1
        assert code == 1 and err.count("\n") == 1 and err.startswith("rescore: error: pipeline failed: "), err
        server.start()  # moto keeps its objects in memory: the bucket comes back empty
        bucket = server.bucket("rescore-stopped")
        upload_tree(server, experience, f"{bucket}/in")
        assert server.names(output) == []  # (no _SUCCESS survives a crash of the store either)
        _run_in_process(server.env, server.beam_args, bucket, output)
        _equals_clean_run(server, output, local_run)
