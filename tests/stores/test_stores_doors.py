"""The doors with their input in a bucket: verl rollout dumps (JSONL) read from GCS and S3 give
the rows the local run gives (their source_file column names the object read); a SQLite buffer in a bucket is refused with one line (SQLite opens
files on a local disk only)."""

from __future__ import annotations

import io
import json
import os

import pyarrow.parquet as pq
import pytest
from batched import run_many
from servers import accounting, store_environment, upload_tree

RUNNER = "--runner=FnApiRunner"


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory):
    """Two steps of verl dumps, and the local run on them: (dump dir, metrics, {name: bytes})."""
    from rescore.pipelines.cli import run

    d = tmp_path_factory.mktemp("verl")
    dumps = d / "rollouts"
    dumps.mkdir()
    for step in (1, 2):
        lines = [json.dumps({"input": f"p{i % 3}", "output": f"o{i}", "score": float((i * step) % 4), "step": step})
                 for i in range(12)]
        (dumps / f"{step}.jsonl").write_text("\n".join(lines) + "\n")
    out = str(d / "out")
    run(["--input", str(dumps / "*.jsonl"), "--input-format", "verl-rollouts", "--output", out, "--strategy", "grpo",
         RUNNER, "--quiet"])
    files = {n: open(os.path.join(out, n), "rb").read() for n in os.listdir(out) if n.startswith("scored-")}
    return str(dumps), json.load(open(os.path.join(out, "metrics.json"))), files


@pytest.mark.parametrize("scheme", ["gs", "s3"])
def test_verl_dumps_in_a_bucket_equal_the_local_run(scheme, rollouts, request, tmp_path):
    from rescore.pipelines.cli import run

    server = request.getfixturevalue("gcs_server" if scheme == "gs" else "s3_server")
    bucket = server.bucket("rescore-doors")
    dumps, local_doc, local_files = rollouts
    upload_tree(server, dumps, f"{bucket}/rollouts")
    output = f"{bucket}/verl-out"
    with store_environment(server):
        doc = run(["--input", f"{bucket}/rollouts/*.jsonl", "--input-format", "verl-rollouts", "--output", output,
                   "--strategy", "grpo", RUNNER, "--quiet", *server.beam_args])
    assert doc["source"] == {"format": "verl-rollouts", "files": 2} and doc["totals"]["rows_written"] == 24
    names = server.names(output)
    assert sorted(n for n in names if n.startswith("scored-")) == sorted(local_files)
    for name, data in local_files.items():  # the same rows; source_file names where each was read
        local, remote = pq.read_table(io.BytesIO(data)), pq.read_table(io.BytesIO(server.get(f"{output}/{name}")))
        assert remote.schema == local.schema and remote.num_rows == local.num_rows > 0
        assert remote.drop(["source_file"]).equals(local.drop(["source_file"]))
        assert remote["source_file"].to_pylist() == [
            p.replace(dumps, f"{bucket}/rollouts") for p in local["source_file"].to_pylist()]
    assert accounting(json.loads(server.get(f"{output}/metrics.json"))) == accounting(local_doc)
    assert "_SUCCESS" in names and not any(n.startswith(("_staging", "_source")) for n in names), names

    if scheme == "gs":  # a SQLite buffer in a bucket: refused, one line, before any work
        [(code, err)] = run_many(tmp_path, [(["--input", f"{bucket}/buffer.db", "--input-table", "experience",
                                              "--output", f"{bucket}/sql-out", "--algorithm", "grpo", RUNNER],
                                             server.env)])
        assert (code, err) == (2, f"rescore: error: --input {bucket}/buffer.db: --input-table reads a SQL buffer "
                                  "through its database URL, and SQLite cannot open a file in a bucket; copy it to a "
                                  "local disk first and pass --input sqlite:///PATH\n")
        assert not any(n.startswith("sql-out") for n in server.names(bucket))
