"""File access through Beam's FileSystems, so the same code reads and writes local paths,
gs:// and the other schemes Beam knows; local paths take the fast direct route."""

from __future__ import annotations

import glob
import io
import os
import shutil
import stat
from collections.abc import Iterable

import pyarrow as pa
import pyarrow.parquet as pq


def _beam():
    """Beam's FileSystems and CompressionTypes, imported where a path is not local: local files
    take the direct route, and the process may read them before Beam is imported at all (the
    first read units decode while the launcher imports Beam and torch, pipelines/early.py)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    if FileSystems._pipeline_options is None:  # a reader (load_scored, show): the environment's settings
        from rescore.transforms.files.store_options import use_beam_options

        use_beam_options([], replace=False)
    return FileSystems, CompressionTypes


def is_local(path: str) -> bool:
    return "://" not in path


def join(base: str, *parts: str) -> str:
    return _beam()[0].join(base, *parts) if not is_local(base) else os.path.join(base, *parts)


def match_stats(pattern: str) -> list[tuple[str, int, float]]:
    """(path, size in bytes, modification time in seconds) of every file the pattern matches,
    sorted by path. A local directory matches the *.parquet files directly inside it."""
    if is_local(pattern) and os.path.isdir(pattern):
        pattern = os.path.join(pattern, "*.parquet")
    if pattern.startswith("s3://"):
        return _s3_match(pattern)
    try:
        result = _beam()[0].match([pattern])[0]
    except Exception:  # noqa: BLE001  (Beam raises BeamIOError for a pattern that matches nothing)
        return []
    found = [(m.path, m.size_in_bytes, float(m.last_updated_in_seconds or 0.0)) for m in result.metadata_list]
    if is_local(pattern):
        found = [f for f in found if os.path.isfile(f[0])]
    return sorted(found)


def _s3_match(pattern: str) -> list[tuple[str, int, float]]:
    """match_stats on S3 with Beam's glob rules (FileSystem.translate_pattern: `*` stays within a
    name, `**` crosses `/`) and one listing with the run's client: Beam's S3 filesystem builds a
    boto3 client for each exists() and metadata() of a match, a second or more each."""
    import re

    from apache_beam.io.filesystem import FileSystem

    if pattern.endswith("/"):
        pattern += "*"
    bucket, key = _bucket_key(pattern)
    prefix = re.match(r"^[^[*?]*", key).group(0)
    wanted = re.compile(FileSystem.translate_pattern(pattern))
    found = []
    try:
        for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                path = f"s3://{bucket}/{o['Key']}"
                if wanted.match(path):
                    found.append((path, int(o["Size"]), o["LastModified"].timestamp()))
    except Exception as e:  # noqa: BLE001  (as Beam's match: a bucket not there matches nothing)
        if not_found(e):
            return []
        raise
    return sorted(found)


def odd_matches(pattern: str) -> list[tuple[str, str]]:
    """(path, what it is) of every local path the pattern matches that is not a regular file
    (after symlinks): a dangling symlink, a directory, a FIFO, a device, a socket. match() leaves
    these out; the input plan must not drop them silently, nor open one (a FIFO would block)."""
    if not is_local(pattern):
        return []
    if os.path.isdir(pattern):
        pattern = os.path.join(pattern, "*.parquet")
    if glob.has_magic(pattern):
        candidates = glob.glob(pattern, recursive=True)
    else:
        candidates = [pattern] if os.path.lexists(pattern) else []
    odd = []
    for path in sorted(candidates):
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            odd.append((path, "a dangling symlink"))
            continue
        except OSError as e:
            odd.append((path, f"not accessible ({e.strerror})"))
            continue
        if stat.S_ISREG(mode):
            continue
        kind = (
            "a directory" if stat.S_ISDIR(mode) else "a FIFO (named pipe)" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
            else "not a regular file"
        )
        odd.append((path, kind))
    return odd


def match(pattern: str) -> list[tuple[str, int]]:
    """(path, size in bytes) of every file the pattern matches, sorted by path."""
    return [(p, size) for p, size, _ in match_stats(pattern)]


STREAM_BUFFER = 1 << 22
"""Bytes read at a time from a column chunk by a streaming ParquetFile."""


def open_parquet(path: str, *, streaming: bool = False, metadata: pq.FileMetaData | None = None) -> pq.ParquetFile:
    """`path` as a ParquetFile. streaming: column chunks are read in pieces of STREAM_BUFFER
    bytes as they are decoded, instead of a row group's chunks whole before the first value
    (pyarrow's pre-buffering): a reader that decodes a large row group a slice at a time holds
    one piece per column, not the row group. metadata: the file's footer, already read
    (fingerprint.parse_footer): not read again."""
    options = {"buffer_size": STREAM_BUFFER, "pre_buffer": False} if streaming else {}
    if metadata is not None:
        options["metadata"] = metadata
    if is_local(path):
        return pq.ParquetFile(path, memory_map=False, **options)
    return pq.ParquetFile(open_read(path), **options)


def open_read(path: str):
    """A seekable binary file reading `path` (not local: S3 through the run's one client, other
    stores through Beam's filesystems)."""
    if path.startswith("s3://"):
        return io.BufferedReader(_S3Read(path), buffer_size=1 << 20)
    fs, codecs = _beam()
    return fs.open(path, compression_type=codecs.UNCOMPRESSED)


def dictionary_columns(schema: pa.Schema, plain: Iterable[str]) -> list[str]:
    """The Parquet column paths of `schema` ('tokens.list.element' for a list column) except
    those under the top-level columns `plain`: the `use_dictionary` list that dictionary-encodes
    every column but those."""
    sink = pa.BufferOutputStream()
    pq.write_table(schema.empty_table(), sink)
    parquet_schema = pq.ParquetFile(pa.BufferReader(sink.getvalue())).schema
    plain = set(plain)
    paths = [parquet_schema.column(i).path for i in range(len(parquet_schema))]
    return [p for p in paths if p.split(".", 1)[0] not in plain]


def write_parquet(table: pa.Table, path: str, *, use_dictionary: bool | list[str] = True) -> None:
    """Write `table` to `path` in one go (callers write to a staging name, then rename)."""
    if is_local(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        pq.write_table(table, path, use_dictionary=use_dictionary)
        return
    with create(path) as f:
        pq.write_table(table, f, use_dictionary=use_dictionary)


def create(path: str):
    """A binary file object writing `path` (not local: an object store's upload, visible on close;
    a write the store refuses for want of permission is an OSError whose one line names the path
    and what to check)."""
    if path.startswith("s3://"):
        return _Refusals(_S3Upload(path), path)
    fs, codecs = _beam()
    return _Refusals(fs.create(path, compression_type=codecs.UNCOMPRESSED), path)


class _Refusals:
    """A store's upload file whose write and close turn a refusal (401, 403) into one line
    (stores.refused_write); anything else passes through."""

    def __init__(self, upload, path: str):
        self._upload, self._path = upload, path

    def _guarded(self, call, *args):
        try:
            return call(*args)
        except Exception as e:
            from rescore.transforms.files.stores import refused_write

            line = refused_write(self._path, e)
            if line is None:
                raise
            raise PermissionError(line) from e

    def write(self, data) -> int:
        return self._guarded(self._upload.write, data)

    def close(self) -> None:
        self._guarded(self._upload.close)

    def __getattr__(self, name):
        return getattr(self._upload, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Object stores: the calls Beam's filesystems make in a way a store cannot take are made here
# with the same client Beam builds from the run's options (transforms/files/stores.py):
# - S3: Beam's writer is always a multipart upload, and S3 refuses to complete one with no part,
#   so an empty object (_SUCCESS, a progress mark) cannot be written through it. Here: one
#   PutObject below SINGLE_PUT_BYTES, boto3's managed multipart upload above.
# - GCS: Beam renames and deletes through the JSON API's batch endpoint; here, one call per
#   object (rewrite, then delete), which every GCS server answers, and a "directory" (a prefix)
#   is deleted object by object.

_clients: dict[object, object] = {}


def _options():
    from apache_beam.io.filesystems import FileSystems
    from apache_beam.options.pipeline_options import PipelineOptions

    return FileSystems._pipeline_options or PipelineOptions([])  # noqa: SLF001  (what Beam's filesystems use)


def s3_client():
    """boto3's S3 client built as Beam's S3 filesystem builds it (the run's --s3_* options)."""
    from apache_beam.io.aws.clients.s3.boto3_client import Client

    from apache_beam.options.pipeline_options import S3Options

    o = _options().view_as(S3Options)
    key = ("s3", o.s3_endpoint_url, o.s3_access_key_id, o.s3_secret_access_key, o.s3_session_token, o.s3_region_name,
           o.s3_disable_ssl, o.s3_verify)  # one client for as long as the settings stay the same
    if key not in _clients:
        _clients[key] = Client(options=_options()).client
    return _clients[key]


def gcs_client():
    """google-cloud-storage's client built as Beam's GcsIO builds it (its credentials, project)."""
    from apache_beam.io.gcp.gcsio import create_storage_client

    key = f"gs:{id(_options())}"
    if key not in _clients:
        _clients[key] = create_storage_client(_options())
    return _clients[key]


def _bucket_key(path: str) -> tuple[str, str]:
    bucket, _, key = path.split("://", 1)[1].partition("/")
    return bucket, key


SINGLE_PUT_BYTES = 64 << 20
"""S3 objects smaller than this are written by one PutObject; larger ones by a multipart upload."""


class _S3Read(io.RawIOBase):
    """A seekable read-only file over the object `path`: ranged GETs with the run's one client
    (Beam's S3 reader builds a client per file)."""

    def __init__(self, path: str):
        self.path = path
        self._bucket, self._key = _bucket_key(path)
        self._size = s3_client().head_object(Bucket=self._bucket, Key=self._key)["ContentLength"]
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else self._pos + offset if whence == 1 else self._size + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._size - self._pos)
        if n <= 0:
            return 0
        body = s3_client().get_object(Bucket=self._bucket, Key=self._key,
                                      Range=f"bytes={self._pos}-{self._pos + n - 1}")["Body"].read()
        buffer[:len(body)] = body
        self._pos += len(body)
        return len(body)


class _S3Upload(io.RawIOBase):
    """A write-only file whose bytes become the object `path` at close (boto3's upload_fileobj)."""

    def __init__(self, path: str):
        import tempfile

        self.path = path
        self._buffer = tempfile.SpooledTemporaryFile(max_size=64 << 20)

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._buffer.write(data)

    def tell(self) -> int:
        return self._buffer.tell()

    def close(self) -> None:
        if self.closed:
            return
        try:
            size = self._buffer.tell()
            self._buffer.seek(0)
            bucket, key = _bucket_key(self.path)
            if size < SINGLE_PUT_BYTES:  # one request (boto3's managed upload starts a thread pool a call)
                s3_client().put_object(Bucket=bucket, Key=key, Body=self._buffer.read())
            else:
                s3_client().upload_fileobj(self._buffer, bucket, key)
        finally:
            self._buffer.close()
            super().close()


def write_text(path: str, text: str) -> None:
    if is_local(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return
    if path.startswith("s3://"):  # one PUT: the object appears whole or not at all
        bucket, key = _bucket_key(path)
        s3_client().put_object(Bucket=bucket, Key=key, Body=text.encode("utf-8"))
        return
    fs, codecs = _beam()
    with fs.create(path, mime_type="text/plain", compression_type=codecs.UNCOMPRESSED) as f:
        f.write(text.encode("utf-8"))


def not_found(error: BaseException) -> bool:
    """An object store's answer that the object (or its bucket) is not there: google-cloud-
    storage's NotFound, boto3's 404 / NoSuchKey, Beam's S3 filesystem's own messages."""
    if isinstance(error, FileNotFoundError):
        return True
    code = getattr(error, "code", None)
    if code == 404 and type(error).__name__ == "NotFound":
        return True
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if status == 404 or response.get("Error", {}).get("Code") in ("NoSuchKey", "NoSuchBucket", "404"):
            return True
    return type(error).__name__ == "S3ClientError" and getattr(error, "code", None) == 404


def read_text(path: str) -> str:
    """The text of `path`; FileNotFoundError where it does not exist, on every scheme (an
    object store's client raises its own NotFound)."""
    if is_local(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    if path.startswith("s3://"):
        bucket, key = _bucket_key(path)
        client = s3_client()
        try:
            return client.get_object(Bucket=bucket, Key=key)["Body"].read().decode("utf-8")
        except client.exceptions.NoSuchKey:
            raise FileNotFoundError(path) from None
    fs, codecs = _beam()
    try:
        with fs.open(path, compression_type=codecs.UNCOMPRESSED) as f:
            return io.TextIOWrapper(f, encoding="utf-8").read()
    except Exception as e:  # noqa: BLE001  (each store's client has its own NotFound)
        if not_found(e) or not_found(e.__cause__ or e.__context__ or e):
            raise FileNotFoundError(path) from e
        raise


def exists(path: str) -> bool:
    if is_local(path):
        return os.path.exists(path)
    if path.startswith("s3://"):  # the run's one client (Beam's filesystem builds one a call)
        bucket, key = _bucket_key(path)
        try:
            s3_client().head_object(Bucket=bucket, Key=key)
            return True
        except Exception as e:  # noqa: BLE001  (botocore's ClientError: 404 is "not there")
            if not_found(e):
                return False
            raise
    return _beam()[0].exists(path)


def rename(src: str, dst: str) -> None:
    if is_local(src):
        os.replace(src, dst)
    elif src.startswith("gs://") and dst.startswith("gs://"):
        client = gcs_client()
        (sb, sk), (db, dk) = _bucket_key(src), _bucket_key(dst)
        source = client.bucket(sb).blob(sk)
        target = client.bucket(db).blob(dk)
        token, _, _ = target.rewrite(source)
        while token is not None:
            token, _, _ = target.rewrite(source, token=token)
        source.delete()
    elif src.startswith("s3://") and dst.startswith("s3://"):
        client = s3_client()
        (sb, sk), (db, dk) = _bucket_key(src), _bucket_key(dst)
        client.copy({"Bucket": sb, "Key": sk}, db, dk)  # managed: multipart copy above 5 GB
        client.delete_object(Bucket=sb, Key=sk)
    else:
        _beam()[0].rename([src], [dst])


def _object_store_delete(path: str) -> None:
    """Delete the object `path` and every object under `path`/ (a "directory")."""
    bucket, key = _bucket_key(path)
    key = key.rstrip("/")
    if path.startswith("gs://"):
        from google.api_core import exceptions

        client = gcs_client()
        for blob in [*client.list_blobs(bucket, prefix=key + "/"), client.bucket(bucket).blob(key)]:
            try:
                blob.delete()
            except exceptions.NotFound:
                pass
        return
    if path.startswith("s3://"):
        client = s3_client()
        keys = [key]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key + "/"):
            keys += [o["Key"] for o in page.get("Contents", [])]
        for i in range(0, len(keys), 1000):
            client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})
        return
    fs = _beam()[0]
    if fs.exists(path):
        fs.delete([path])


def delete(paths: Iterable[str]) -> None:
    """Delete files and directories (with what they hold); a path that is not there is skipped."""
    paths = list(paths)
    local = [p for p in paths if is_local(p) and os.path.exists(p)]
    for p in local:
        if os.path.isdir(p):
            shutil.rmtree(p)
        else:
            os.remove(p)
    for p in paths:
        if not is_local(p):
            _object_store_delete(p)


def list_dir(directory: str, pattern: str = "*") -> list[str]:
    """The files in `directory` matching `pattern`. On an object store a directory is a name
    prefix, not an object: there is nothing to ask exists() about, the listing says it all."""
    if not is_local(directory):
        return [p for p, _ in match(join(directory, pattern))]
    return [p for p, _ in match(join(directory, pattern))] if exists(directory) else []


def child_names(directory: str) -> list[str]:
    """The names directly in `directory`, files and directories alike, sorted ([] where it does
    not exist). On an object store: the first path component of every object under the prefix
    (`_staging` for `_staging/x.parquet`), as a local listing shows the directory."""
    if is_local(directory):
        return sorted(os.listdir(directory)) if os.path.isdir(directory) else []
    bucket, key = _bucket_key(directory)
    prefix = key.rstrip("/") + "/" if key.strip("/") else ""
    if directory.startswith("gs://"):
        found = (b.name for b in gcs_client().list_blobs(bucket, prefix=prefix))
    elif directory.startswith("s3://"):
        found = (o["Key"] for page in s3_client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
                 for o in page.get("Contents", []))
    else:
        found = (p.split("://", 1)[1].partition("/")[2] for p, _ in match(join(directory, "**")))
    return sorted({name[len(prefix):].split("/", 1)[0] for name in found if name.startswith(prefix) and name != prefix})
