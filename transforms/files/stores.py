"""Object stores (gs://, s3://) before a run: the settings Beam's filesystems use in this
process, and the pre-flight check that every bucket a run reads or writes is there and
reachable with the credentials the run has.

Beam's filesystems take their settings from the pipeline options (S3: `--s3_endpoint_url`,
`--s3_access_key_id`...; GCS: the credentials Beam finds, `STORAGE_EMULATOR_HOST`); the launcher
reads and writes the output (ownership, lock, publish) before the pipeline exists, so `configure`
hands it the same options first.

`preflight` asks each store once, with the client Beam itself would build, for one object name
under each path (a list call: read permission, the bucket exists, the credentials work), and
turns what it answers into one line naming the path (ConfigError: exit 2), before any work and
without a client's minute of retries. Write permission is proven by the output lock, the
run's first write (transforms/files/lock.py), which turns a refusal into the same kind of line.
"""

from __future__ import annotations

import os

from rescore.errors import ConfigError, first_line

PREFLIGHT_SECONDS = 20.0
"""How long the pre-flight check waits for a store (its client's retries included)."""


def scheme(path: str) -> str:
    return path.split("://", 1)[0].lower() if "://" in path else ""


def split(path: str) -> tuple[str, str]:
    """(bucket, key prefix) of gs://bucket/key or s3://bucket/key; the prefix stops before the
    first glob character."""
    rest = path.split("://", 1)[1]
    bucket, _, key = rest.partition("/")
    for i, ch in enumerate(key):
        if ch in "*?[{":
            key = key[:i]
            break
    return bucket, key


def configure(beam_args: list[str]) -> None:
    """Give Beam's filesystems this run's pipeline options in this process (the launcher's own
    reads and writes: input planning, ownership, the lock, a staged door's upload)."""
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    FileSystems.set_options(PipelineOptions(beam_args))


def preflight(paths: list[tuple[str, str]], beam_args: list[str]) -> None:
    """`paths`: (flag, path) pairs. Raise ConfigError, one line naming the path, where a gs:// or
    s3:// path's store cannot be used (extra missing, no credentials, no bucket, no permission,
    store unreachable). Other schemes and local paths are left to their own checks."""
    remote = [(flag, path) for flag, path in paths if scheme(path) in ("gs", "s3")]
    if not remote:
        return
    configure(beam_args)
    from apache_beam.options.pipeline_options import PipelineOptions

    options = PipelineOptions(beam_args)
    checked: set[tuple[str, str]] = set()
    for flag, path in remote:
        bucket, prefix = split(path)
        if not bucket:
            raise ConfigError(f"{flag} {path}: no bucket name (expected {scheme(path)}://BUCKET/PATH)")
        if (scheme(path), bucket) in checked:
            continue
        checked.add((scheme(path), bucket))
        if scheme(path) == "gs":
            _check_gcs(flag, path, bucket, prefix, options)
        else:
            _check_s3(flag, path, bucket, prefix, options)


def _gcs_client(flag: str, path: str, options):
    try:
        from google.api_core import exceptions  # noqa: F401
        from google.cloud import storage as gcs  # noqa: F401
    except ImportError:
        raise ConfigError(f"{flag} {path} needs the [gcp] extra: pip install 'rescore[gcp]'") from None
    from apache_beam.internal.gcp import auth
    from apache_beam.io.gcp.gcsio import create_storage_client

    if not auth._Credentials._credentials_init:  # noqa: SLF001
        _find_gcp_credentials(flag, path, options, auth)
    return create_storage_client(options)


def _find_gcp_credentials(flag: str, path: str, options, auth) -> None:
    """Look for Google credentials once, as Beam does (application default credentials), but
    without Beam's 30 s of retries where there are none: missing ones are one line naming the
    path, unless the store is an emulator (STORAGE_EMULATOR_HOST) or --no_auth asks for anonymous
    access; then Beam is told there are none (its anonymous client), so it does not search again."""
    import google.auth
    from google.auth import exceptions as auth_exceptions
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    gcp = options.view_as(GoogleCloudOptions)
    anonymous = bool(os.environ.get("STORAGE_EMULATOR_HOST")) or gcp.no_auth
    try:
        google.auth.default(scopes=gcp.gcp_oauth_scopes)
        return  # Beam finds them at once
    except auth_exceptions.DefaultCredentialsError:
        if not anonymous:
            raise ConfigError(
                f"{flag} {path}: no Google Cloud credentials found; run `gcloud auth application-default login` "
                "or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file"
            ) from None
    with auth._Credentials._credentials_lock:  # noqa: SLF001
        auth._Credentials._credentials, auth._Credentials._credentials_init = None, True  # noqa: SLF001


def _check_gcs(flag: str, path: str, bucket: str, prefix: str, options) -> None:
    from google.api_core import exceptions
    from google.api_core.retry import Retry
    from google.auth import exceptions as auth_exceptions

    client = _gcs_client(flag, path, options)
    retry = Retry(deadline=PREFLIGHT_SECONDS, initial=0.5, maximum=4.0)
    try:
        list(client.list_blobs(bucket, prefix=prefix, max_results=1, retry=retry, timeout=PREFLIGHT_SECONDS))
    except exceptions.NotFound:
        raise ConfigError(f"{flag} {path}: bucket gs://{bucket} does not exist") from None
    except (exceptions.Forbidden, exceptions.Unauthorized) as e:
        raise ConfigError(f"{flag} {path}: no permission to list gs://{bucket}: {_gcs_message(e)}; check that the "
                          "account the run reads with (on a cluster, its workers' service account) may list and read "
                          f"objects in gs://{bucket} (storage.objects.list, storage.objects.get)") from None
    except auth_exceptions.GoogleAuthError as e:
        raise ConfigError(f"{flag} {path}: Google Cloud credentials refused: {first_line(e)}") from None
    except (exceptions.GoogleAPIError, OSError) as e:
        raise ConfigError(f"{flag} {path}: Google Cloud Storage did not answer: {_gcs_message(e)}") from None


def _gcs_message(error: BaseException) -> str:
    """A google-api-core error in one line: its status and message, not the request URL."""
    import re

    message = getattr(error, "message", None) or first_line(error)
    message = re.sub(r"^(GET|POST|PUT|PATCH|DELETE|HEAD) \S+: ", "", first_line(message))
    code = getattr(error, "code", None)
    return first_line(f"{code} {message}" if code else message)


def _status_and_message(error: BaseException) -> tuple[int | None, str]:
    """The HTTP status and the store's own message of a client error: google-api-core's
    (`code`, `message`), google-resumable-media's InvalidResponse (an upload: the response, its
    JSON error), botocore's ClientError; (None, "") for anything else."""
    response = getattr(error, "response", None)
    if isinstance(response, dict):  # botocore
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        info = response.get("Error", {})
        return status, first_line(info.get("Message") or info.get("Code") or "", blank="")
    status = getattr(response, "status_code", None)
    if isinstance(status, int):  # google's clients: the HTTP response, its JSON error's message
        try:
            return status, first_line(str(response.json()["error"]["message"]), blank="")
        except Exception:  # noqa: BLE001  (not JSON)
            pass
    code = getattr(error, "code", None)
    if isinstance(code, int) and hasattr(error, "message"):  # google-api-core
        return code, _gcs_message(error).removeprefix(f"{code} ")
    if isinstance(status, int):  # google-resumable-media: the body's first line
        return status, first_line(getattr(response, "text", "") or "", blank="")
    return None, ""


def refused_write(path: str, error: BaseException) -> str | None:
    """One line for a write to `path` that the store refused for want of permission (401, 403),
    naming the path and what to check; None for any other error (left as it is). A refused
    upload otherwise reads `(403, 'Expected one of', <HTTPStatus.OK: 200>, ...)`."""
    status, message = _status_and_message(error)
    if status not in (401, 403):
        return None
    said = f"{status} {message}".strip()
    bucket = split(path)[0] if "://" in path else ""
    if scheme(path) == "gs":
        return (f"no permission to write {path} ({said}): check that the account the run writes with (on a cluster, "
                f"its workers' service account) may create and delete objects in gs://{bucket} "
                "(storage.objects.create, storage.objects.delete) and that no retention policy or object hold forbids it")
    if scheme(path) in ("s3", "s3a"):
        return (f"no permission to write {path} ({said}): check that the credentials the run writes with (on a "
                f"cluster, its workers') allow s3:PutObject and s3:DeleteObject on s3://{bucket}")
    return f"no permission to write {path} ({said})"


def s3_client(options):
    """boto3's S3 client exactly as Beam's S3 filesystem builds it from `options`."""
    from apache_beam.io.aws.clients.s3.boto3_client import Client

    return Client(options=options).client


def _check_s3(flag: str, path: str, bucket: str, prefix: str, options) -> None:
    try:
        import boto3  # noqa: F401
        import botocore.exceptions as bexc
    except ImportError:
        raise ConfigError(f"{flag} {path} needs the [s3] extra: pip install 'rescore[s3]'") from None
    from botocore.config import Config

    client = s3_client(options)
    quick = client.meta.config.merge(Config(connect_timeout=5, read_timeout=PREFLIGHT_SECONDS,
                                            retries={"max_attempts": 2, "mode": "standard"}))
    import boto3.session

    session = boto3.session.Session()
    client = session.client("s3", config=quick, endpoint_url=client.meta.endpoint_url,
                            region_name=client.meta.region_name,
                            **_s3_credentials(client))
    try:
        client.list_objects_v2(Bucket=bucket, Prefix=prefix, MaxKeys=1)
    except bexc.NoCredentialsError:
        raise ConfigError(
            f"{flag} {path}: no AWS credentials found; set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or "
            "AWS_PROFILE), or pass --s3_access_key_id and --s3_secret_access_key"
        ) from None
    except bexc.ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        message = first_line(e.response.get("Error", {}).get("Message", "") or code)
        if code == "NoSuchBucket":
            raise ConfigError(f"{flag} {path}: bucket s3://{bucket} does not exist") from None
        if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"):
            raise ConfigError(f"{flag} {path}: AWS credentials refused ({code}): {message}") from None
        if code in ("AccessDenied", "AllAccessDisabled", "403") or e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 403:
            raise ConfigError(f"{flag} {path}: no permission to list s3://{bucket} ({code}): {message}; check that the "
                              f"credentials the run reads with allow s3:ListBucket and s3:GetObject on s3://{bucket}") from None
        raise ConfigError(f"{flag} {path}: S3 answered {code or 'an error'}: {message}") from None
    except bexc.BotoCoreError as e:
        raise ConfigError(f"{flag} {path}: S3 did not answer: {first_line(e)}") from None


def _s3_credentials(client) -> dict:
    creds = client._request_signer._credentials  # noqa: SLF001  (the ones Beam's client resolved)
    if creds is None:
        return {}
    frozen = creds.get_frozen_credentials()
    return {"aws_access_key_id": frozen.access_key, "aws_secret_access_key": frozen.secret_key,
            "aws_session_token": frozen.token}


def refuse_database_in_a_bucket(inputs: list[str], input_table) -> None:
    """A SQL buffer is read through a database driver: SQLite opens a file on a local disk, and no
    driver opens one in a bucket. One line, before any work, rather than SQLAlchemy's error."""
    if not input_table:
        return
    for path in inputs:
        if scheme(path) in ("gs", "s3"):
            raise ConfigError(
                f"--input {path}: --input-table reads a SQL buffer through its database URL, and SQLite cannot "
                "open a file in a bucket; copy it to a local disk first and pass --input sqlite:///PATH"
            )


def run_paths(inputs: list[str], output: str, input_table=None) -> list[tuple[str, str]]:
    """The (flag, path) pairs a one-shot or incremental run reads and writes."""
    pairs = [("--output", output)]
    if not input_table:
        pairs += [("--input", i) for i in inputs]
    return pairs

