"""The incremental table on an object store: delta-rs's storage options, taken from the settings
the user already gives Beam, and the check that a Delta commit there is atomic.

Beam's filesystems and delta-rs (the Rust `object_store` crate) each have their own client, so
one set of settings must reach both. Rescore maps them, and nothing else is needed:

    Beam / Google client                       delta-rs storage option
    STORAGE_EMULATOR_HOST=http://HOST:PORT     google_service_account_key: {"gcs_base_url":
                                               "http://HOST:PORT", "disable_oauth": true, ...}
    (real GCS: GOOGLE_APPLICATION_CREDENTIALS   nothing: object_store reads the same variable
     or the machine's default credentials)      (and GOOGLE_SERVICE_ACCOUNT)
    --s3_endpoint_url URL / AWS_ENDPOINT_URL   AWS_ENDPOINT_URL (AWS_ALLOW_HTTP=true for http://)
    --s3_access_key_id / --s3_secret_access_key  AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
    --s3_session_token / --s3_region_name      AWS_SESSION_TOKEN / AWS_REGION
    --s3_disable_ssl                           AWS_ALLOW_HTTP=true
    (AWS_* variables)                          read by object_store itself

A Delta commit is the creation of `_delta_log/<version>.json`; it is atomic only where the
store creates an object "if it does not exist" in one request, so that of two writers of one
version exactly one succeeds. GCS: an upload with the precondition `ifGenerationMatch=0`
(always supported). S3: `PutObject` with `If-None-Match: *` (conditional put; AWS S3 since
2024, MinIO, most S3-compatible stores; delta-rs 1.x commits this way by default). Refused
before any work (exit 2, one line, `check_settings`): `aws_conditional_put=disabled` (delta-rs
would fail at the commit, after the work) and `AWS_S3_ALLOW_UNSAFE_RENAME` (a commit that may
overwrite another). A store that ignores the condition is refused by the output lock's own
self-check, which creates its lock object the same way (transforms/files/lock.py).

No Beam import: the readers (load_scored, rescore show) use it too.
"""

from __future__ import annotations

import json
import os

from rescore.errors import ConfigError

S3_FLAGS = {
    "--s3_endpoint_url": "AWS_ENDPOINT_URL",
    "--s3_access_key_id": "AWS_ACCESS_KEY_ID",
    "--s3_secret_access_key": "AWS_SECRET_ACCESS_KEY",
    "--s3_session_token": "AWS_SESSION_TOKEN",
    "--s3_region_name": "AWS_REGION",
}
"""Beam's S3 options (apache_beam.options.pipeline_options.S3Options) -> delta-rs's names."""


def scheme(path: str) -> str:
    return path.split("://", 1)[0].lower() if "://" in path else ""


def _flag_values(beam_args: list[str] | None) -> dict[str, str]:
    """The --s3_* flags of Beam's arguments (`--flag value` or `--flag=value`); the last wins."""
    found: dict[str, str] = {}
    args = list(beam_args or ())
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name == "--s3_disable_ssl":
            found[name] = "false" if eq and value.lower() in ("false", "0", "no") else "true"
        elif name in S3_FLAGS:
            if eq:
                found[name] = value
            elif i + 1 < len(args):
                found[name] = args[i + 1]
    return found


def emulator_key(host: str) -> str:
    """The service-account document object_store takes for a GCS emulator at `host`."""
    base = host if "://" in host else f"http://{host}"
    return json.dumps({"gcs_base_url": base.rstrip("/"), "disable_oauth": True, "client_email": "",
                       "private_key": "", "private_key_id": ""})


def delta_options(path: str, beam_args: list[str] | None = None) -> dict[str, str] | None:
    """delta-rs's storage options for the table at `path`, from Beam's arguments (a run) and
    the environment (both); None for a local path or where object_store's own reading of the
    environment is all it needs."""
    kind = scheme(path)
    if kind == "gs":
        host = os.environ.get("STORAGE_EMULATOR_HOST")
        return {"google_service_account_key": emulator_key(host)} if host else None
    if kind not in ("s3", "s3a"):
        return None
    flags = _flag_values(beam_args)
    opts = {S3_FLAGS[f]: v for f, v in flags.items() if f in S3_FLAGS and v}
    endpoint = opts.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        opts["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.lower().startswith("http://"):
            opts["AWS_ALLOW_HTTP"] = "true"
    if flags.get("--s3_disable_ssl") == "true":
        opts["AWS_ALLOW_HTTP"] = "true"
    if "AWS_REGION" not in opts and not (os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")):
        opts["AWS_REGION"] = "us-east-1"  # what boto3 and Beam assume too; object_store needs one
    return opts or None


def _setting(opts: dict[str, str] | None, *names: str) -> str | None:
    """A delta-rs setting as it takes it: the storage option (any case), else the variable."""
    lowered = {k.lower(): v for k, v in (opts or {}).items()}
    for name in names:
        if name.lower() in lowered:
            return lowered[name.lower()]
    for name in names:
        if name.upper() in os.environ:
            return os.environ[name.upper()]
    return None


def check_settings(path: str, opts: dict[str, str] | None) -> None:
    """ConfigError (exit 2, one line) for an S3 configuration whose commits cannot be atomic."""
    if scheme(path) not in ("s3", "s3a"):
        return
    put = _setting(opts, "aws_conditional_put", "conditional_put")
    if put is not None and put.strip().lower() == "disabled":
        raise ConfigError(
            f"--output {path}: conditional put is disabled (aws_conditional_put=disabled), so two runs could both "
            "commit one table version; Rescore commits to S3 with If-None-Match: unset AWS_CONDITIONAL_PUT"
        )
    unsafe = _setting(opts, "AWS_S3_ALLOW_UNSAFE_RENAME")
    if unsafe is not None and unsafe.strip().lower() in ("1", "true", "yes"):
        raise ConfigError(
            f"--output {path}: AWS_S3_ALLOW_UNSAFE_RENAME lets a commit overwrite another run's, so the table could "
            "lose a run's rows; Rescore commits to S3 with conditional put (If-None-Match): unset it"
        )


def use_beam_options(beam_args: list[str] | None, *, replace: bool = True) -> None:
    """Beam's filesystems read and write with `beam_args` (a run's --s3_* settings) from here
    on, as a Beam pipeline built with them would set; `replace=False`: only where nothing set
    them yet (a reader: Beam's S3 filesystem refuses to work without options, the environment's
    AWS_* settings then reach boto3)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    if replace or FileSystems._pipeline_options is None:
        FileSystems.set_options(PipelineOptions(list(beam_args or ())))
