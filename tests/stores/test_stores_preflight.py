"""Credentials and buckets a user gets wrong, on a real GCS server and a real S3 server: no
credentials, a bucket that does not exist, no permission. Each is exit 2 and one line naming
the path, before any work (nothing is written) and without a client's minute of retries."""

from __future__ import annotations

import time

from batched import run_many
from servers import FaultProxy

RUNNER = "--runner=FnApiRunner"
DENIED_XML = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"


def _args(inp, out, *extra):
    return ["--input", inp, "--output", out, "--strategy", "grpo", RUNNER, "--quiet", *extra]


def test_gcs_credentials_bucket_and_permission(gcs_server, tmp_path):
    bucket = gcs_server.bucket("rescore-pre")
    gcs_server.put(f"{bucket}/in/part-0.parquet", b"never read")
    empty = tmp_path / "gcloud"
    empty.mkdir()
    no_credentials = {"STORAGE_EMULATOR_HOST": None, "GOOGLE_APPLICATION_CREDENTIALS": None,
                      "CLOUDSDK_CONFIG": str(empty), "NO_GCE_CHECK": "True", "GCE_METADATA_HOST": "127.0.0.1:9"}
    with FaultProxy(gcs_server.url) as proxy, FaultProxy(gcs_server.url) as denied:
        proxy.add(method="GET", path="/b/rescore-pre/o?", status=403, times=None,
                  body=b'{"error": {"code": 403, "message": "caller does not have storage.objects.list access"}}')
        denied.add(method="POST", path="/upload/storage/v1/b/rescore-pre/o", status=403, times=None,
                   body=b'{"error": {"code": 403, "message": "caller does not have storage.objects.create access"}}')
        started = time.monotonic()
        runs = run_many(tmp_path, [
            # first: Beam remembers, per process, the credentials it found
            (_args(f"{bucket}/in/*.parquet", f"{bucket}/out"), no_credentials),
            (_args("gs://rescore-no-such-bucket/in/*.parquet", f"{bucket}/out"), gcs_server.env),
            (_args(f"{bucket}/in/*.parquet", f"{bucket}/out"), {**gcs_server.env, "STORAGE_EMULATOR_HOST": proxy.url}),
            # it may read, not write: the output lock, its first write, is refused
            (_args(f"{bucket}/in/*.parquet", f"{bucket}/out"), {**gcs_server.env, "STORAGE_EMULATOR_HOST": denied.url}),
        ])
        elapsed = time.monotonic() - started
    expected = [
        f"rescore: error: --output {bucket}/out: no Google Cloud credentials found; run `gcloud auth "
        "application-default login` or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file",
        "rescore: error: --input gs://rescore-no-such-bucket/in/*.parquet: bucket gs://rescore-no-such-bucket does not exist",
        f"rescore: error: --output {bucket}/out: no permission to list gs://rescore-pre: 403 caller does not have "
        "storage.objects.list access; check that the account the run reads with (on a cluster, its workers' service "
        "account) may list and read objects in gs://rescore-pre (storage.objects.list, storage.objects.get)",
        f"rescore: error: --output {bucket}/out: no permission to write {bucket}/out/_rescore.lock (403 caller does not "
        "have storage.objects.create access): check that the account the run writes with (on a cluster, its workers' "
        "service account) may create and delete objects in gs://rescore-pre (storage.objects.create, "
        "storage.objects.delete) and that no retention policy or object hold forbids it",
    ]
    assert [(code, err) for code, err in runs] == [(2, e + "\n") for e in expected]
    assert gcs_server.names(bucket) == ["in/part-0.parquet"]  # nothing written
    assert elapsed < 60, elapsed  # Beam alone searches credentials for 30 s, GCS retries for 120 s


def test_s3_credentials_bucket_and_permission(s3_server, tmp_path):
    bucket = s3_server.bucket("rescore-pre")
    s3_server.put(f"{bucket}/in/part-0.parquet", b"never read")
    endpoint_only = [f"--s3_endpoint_url={s3_server.url}", "--s3_region_name=us-east-1"]
    no_credentials = {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None, "AWS_SESSION_TOKEN": None,
                      "AWS_PROFILE": None, "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
                      "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true",
                      "AWS_ENDPOINT_URL": s3_server.url}
    with FaultProxy(s3_server.url) as proxy:
        proxy.add(method="GET", path="/rescore-pre?", status=403, body=DENIED_XML, times=None)
        proxy.add(method="GET", path="/rescore-pre/?", status=403, body=DENIED_XML, times=None)
        via_proxy = [a.replace(s3_server.url, proxy.url) for a in s3_server.beam_args]
        runs = run_many(tmp_path, [
            (_args(f"{bucket}/in/*.parquet", f"{bucket}/out", *endpoint_only), no_credentials),
            (_args("s3://rescore-no-such-bucket/in/*.parquet", f"{bucket}/out", *s3_server.beam_args), s3_server.env),
            (_args(f"{bucket}/in/*.parquet", f"{bucket}/out", *via_proxy), s3_server.env),
        ])
    expected = [
        f"rescore: error: --output {bucket}/out: no AWS credentials found; set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass --s3_access_key_id and --s3_secret_access_key",
        "rescore: error: --input s3://rescore-no-such-bucket/in/*.parquet: bucket s3://rescore-no-such-bucket does not exist",
        f"rescore: error: --output {bucket}/out: no permission to list s3://rescore-pre (AccessDenied): Access Denied; "
        "check that the credentials the run reads with allow s3:ListBucket and s3:GetObject on s3://rescore-pre",
    ]
    assert [(code, err) for code, err in runs] == [(2, e + "\n") for e in expected]
    assert s3_server.names(bucket) == ["in/part-0.parquet"]
