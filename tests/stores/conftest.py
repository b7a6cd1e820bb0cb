"""Session-scoped object-store servers (tests/stores/servers.py): one fake-gcs-server and one
moto S3 server per test process, started on first use, stopped at the end of the session.
A test that changes a server (stops it, fronts it with a proxy) starts its own instead."""

import json
import os
import sys

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from servers import GcsServer, S3Server, Unavailable  # noqa: E402

RUNNER = "--runner=FnApiRunner"


def _start(server):
    try:
        return server.start()
    except Unavailable as e:
        server.close()
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def gcs_server():
    """A running fake-gcs-server: .url, .env (STORAGE_EMULATOR_HOST...), .bucket(name) -> gs://name,
    .put/.get/.names, .client() (google-cloud-storage)."""
    server = _start(GcsServer())
    yield server
    server.close()


@pytest.fixture(scope="session")
def s3_server():
    """A running moto S3 server: .url, .env (AWS_ENDPOINT_URL, a key pair, the region), .beam_args
    (--s3_endpoint_url...), .bucket(name) -> s3://name, .put/.get/.names, .client() (boto3)."""
    server = _start(S3Server())
    yield server
    server.close()


@pytest.fixture
def store_env(monkeypatch):
    """store_env(server): the server's client settings in this process's environment for the test."""

    def _set(server):
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        return server

    return _set


@pytest.fixture(scope="session")
def experience(tmp_path_factory):
    from rescore.pipelines.sample import make_experience

    d = tmp_path_factory.mktemp("stores-in")
    table = make_experience(batches=2, tasks=8, runs=4, seed=1)
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), str(d / "part-0.parquet"), row_group_size=16)
    pq.write_table(table.slice(half), str(d / "part-1.parquet"), row_group_size=16)
    return str(d)


@pytest.fixture(scope="session")
def local_run(experience, tmp_path_factory):
    """The same job on local paths: (metrics.json, {scored file name: bytes})."""
    from rescore.pipelines.cli import run

    out = str(tmp_path_factory.mktemp("stores-local") / "grpo")
    run(["--input", os.path.join(experience, "*.parquet"), "--output", out, "--strategy", "grpo", RUNNER, "--quiet"])
    files = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out) if n.startswith("scored-")}
    return json.load(open(os.path.join(out, "metrics.json"))), files
