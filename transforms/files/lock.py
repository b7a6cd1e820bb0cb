"""One run at a time per output directory: the output lock, the only one (an incremental run
into a Delta table holds it too; where it is not enforced, that run's commit against the table
version it started from is what fails a concurrent run: transforms/files/delta_table.py).

Local (and NFS) outputs: `OUTPUT/_rescore.lock` is locked with flock(2). The kernel drops the
lock when the holding process dies, however it dies (kill -9 included), so a killed run never
blocks the next one; the file itself stays and names its last holder (pid, host, start time),
which is what a refused run prints (a run that ends normally removes the file). A run that finds the lock held refuses at once (exit 2)
or, with --wait-for-lock SECONDS, polls until the holder is done or the time is up.

Google Cloud Storage (gs://, with google-cloud-storage installed: the `gcp` extra): the lock
object is created with the precondition ifGenerationMatch=0, which GCS applies atomically (one
creator wins). The holder rewrites it every HEARTBEAT_SECONDS (guarded by its generation); a
lock whose heartbeat is older than STALE_SECONDS, or whose holder is a dead pid on this host,
is deleted (guarded by the generation seen) and taken over.

S3 (s3://, boto3: the `s3` extra): the same protocol with S3's conditional writes: the lock
object is created with If-None-Match: * (S3 answers 412 to every creator but one) and refreshed
with If-Match: ETAG. Right after taking either lock the run tries to create it a second time:
a store that accepts that ignores the condition (an older S3-compatible server), and the run
refuses with one line rather than hold a lock that is not one. Other object stores: the lock is
NOT enforced; Rescore warns and runs (see docs/reliability.md).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field

from rescore.errors import LockBusy, OutputError, first_line
from rescore.transforms.files import storage
from rescore.transforms.files.layout import LOCK

HEARTBEAT_SECONDS = 60.0
STALE_SECONDS = 600.0
log = logging.getLogger("rescore")


def lock_path(output: str) -> str:
    return storage.join(output, LOCK)


def _holder(fd: int) -> str:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode() or "{}")
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError):
        return "a run that has not written its details yet"


@dataclass
class OutputLock:
    path: str
    fd: int | None = None
    created_dir: str | None = None

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            # Unlinked while still locked: a run that locked this file meanwhile sees that it is
            # no longer the one at `path` and locks the next one (see acquire).
            os.unlink(self.path)
        except OSError:
            pass
        finally:
            os.close(self.fd)
            self.fd = None
        if self.created_dir:  # a run that created the directory and published nothing leaves no trace
            _remove_if_unpublished(self.created_dir)
            try:
                os.rmdir(self.created_dir)
            except OSError:
                pass

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _info() -> dict:
    """What the lock names: its holder (pid, host, start time) and `run`, a token of this one
    acquisition. Two runs of one process started in the same second would otherwise write the
    same bytes, hence the same S3 ETag, and a conditional delete guarded by the ETag one of them
    saw would match the other's lock too."""
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run": uuid.uuid4().hex,
    }


def _beat_body(info: str, beat: int) -> bytes:
    """The lock's bytes at heartbeat `beat`: each refresh differs from the last, so its ETag
    (S3: the MD5 of the bytes) changes too, and a takeover guarded by the ETag it saw before
    the refresh is refused (If-Match) rather than deleting a live lock."""
    return json.dumps({**json.loads(info), "beat": beat}).encode()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_if_unpublished(directory: str) -> None:
    """In a directory this run created: when it holds nothing but Rescore's empty file list (the
    run stopped before it staged anything), remove that, so the directory itself goes (a failed
    run leaves no folder holding only the ledger). A run that failed after staging keeps its
    folder and `_staging/` as before: what it got to is there to look at, never published."""
    from rescore.transforms.files.layout import LEDGER

    try:
        names = set(os.listdir(directory))
        if names != {LEDGER}:
            return
        if LEDGER in names:
            with open(os.path.join(directory, LEDGER), encoding="utf-8") as f:
                if json.load(f).get("files") != []:
                    return
        for name in names:
            path = os.path.join(directory, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
    except (OSError, ValueError, AttributeError):
        pass


def _wait_or_take_over(output: str, text: bytes, updated: datetime.datetime, deadline: float,
                       wait_seconds: float, take_over) -> None:
    """An object-store lock found held (its bytes `text`, last written at `updated`): take it over
    (`take_over()` deletes it, guarded by what was seen) when it is stale or its holder is a dead
    pid on this host; else raise LockBusy naming the holder once the deadline has passed, or wait
    a second. The caller then tries to create the lock again."""
    try:
        holder = json.loads(text)
        described = f"pid {holder['pid']} on host {holder['host']}, started {holder['started']}"
    except (ValueError, KeyError, TypeError):
        holder, described = {}, "a run that has not written its details yet"
    if not isinstance(holder, dict):
        holder = {}
    age = (datetime.datetime.now(datetime.timezone.utc) - updated).total_seconds()
    dead = holder.get("host") == socket.gethostname() and not _pid_alive(int(holder.get("pid", 0) or 0))
    if age > STALE_SECONDS or dead:
        log.warning("taking over the lock of %s (%s): %s", output, described,
                    "its process is gone" if dead else f"no heartbeat for {age:.0f} s")
        take_over()
        return
    if time.monotonic() >= deadline:
        if wait_seconds > 0:
            raise LockBusy(f"{output} is still being written by another run ({described}) after waiting {wait_seconds:g} s")
        raise LockBusy(f"{output} is being written by another run ({described}); pass --wait-for-lock SECONDS to wait for it")
    time.sleep(1.0)


@dataclass
class GcsLock:
    """The lock object on GCS (see the module doc); `client` is a google.cloud.storage Client."""

    path: str
    client: object
    generation: int | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _blob(self):
        bucket, _, name = self.path[len("gs://"):].partition("/")
        return self.client.bucket(bucket).blob(name)

    def acquire(self, output: str, wait_seconds: float) -> GcsLock:
        from google.api_core import exceptions

        deadline = time.monotonic() + max(0.0, wait_seconds)
        info = json.dumps(_info())
        while True:
            blob = self._blob()
            try:
                blob.upload_from_string(info, if_generation_match=0)
                self.generation = blob.generation
                _check_gcs_atomic(self, output, info)
                self._thread = threading.Thread(target=self._beat, args=(info,), name="rescore-lock", daemon=True)
                self._thread.start()
                return self
            except exceptions.PreconditionFailed:
                pass
            except (exceptions.Forbidden, exceptions.Unauthorized) as e:
                from rescore.transforms.files.stores import refused_write

                said = refused_write(self.path, e) or f"no permission to write {self.path}: {e.code} {first_line(e.message)}"
                raise OutputError(f"--output {output}: {said}") from None
            bucket, _, name = self.path[len("gs://"):].partition("/")
            held = self.client.bucket(bucket).get_blob(name)
            if held is None:
                continue  # released meanwhile
            try:
                text = held.download_as_bytes(if_generation_match=held.generation)
            except exceptions.GoogleAPICallError:
                text = b""

            def take_over(held=held):
                try:
                    held.delete(if_generation_match=held.generation)
                except (exceptions.PreconditionFailed, exceptions.NotFound):
                    pass

            _wait_or_take_over(output, text, held.updated, deadline, wait_seconds, take_over)

    def _beat(self, info: str) -> None:
        from google.api_core import exceptions

        beat = 0
        while not self._stop.wait(HEARTBEAT_SECONDS):
            beat += 1
            blob = self._blob()
            try:
                blob.upload_from_string(_beat_body(info, beat), if_generation_match=self.generation)
                self.generation = blob.generation
            except exceptions.PreconditionFailed:
                log.error("lost the output lock %s: another run took it over", self.path)
                return
            except Exception:  # noqa: BLE001  (a transient error: try again at the next beat)
                log.warning("could not refresh the output lock %s", self.path, exc_info=True)

    def release(self) -> None:
        self._stop.set()
        if self.generation is None:
            return
        try:
            self._blob().delete(if_generation_match=self.generation)
        except Exception:  # noqa: BLE001  (taken over or gone: nothing of ours to remove)
            pass
        self.generation = None

    def __enter__(self) -> GcsLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _check_gcs_atomic(lock: GcsLock, output: str, info: str) -> None:
    """A second create-if-absent of the object just created must be refused (412): a store that
    accepts it ignores generation preconditions, and two runs would both hold the lock."""
    from google.api_core import exceptions

    try:
        lock._blob().upload_from_string(info, if_generation_match=0)
    except exceptions.PreconditionFailed:
        return
    lock._blob().delete()
    lock.generation = None
    raise OutputError(
        f"--output {output}: this Cloud Storage server ignores generation preconditions (ifGenerationMatch=0), "
        "so the output lock cannot be atomic there; Rescore does not write to it"
    )


@dataclass
class S3Lock:
    """The lock object on S3 (see the module doc): created with If-None-Match: * (a conditional
    write: one creator wins, the others get 412), refreshed with If-Match: ETAG."""

    path: str
    etag: str | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _where(self) -> tuple[str, str]:
        bucket, _, key = self.path[len("s3://"):].partition("/")
        return bucket, key

    def acquire(self, output: str, wait_seconds: float) -> S3Lock:
        from botocore.exceptions import ClientError

        client = storage.s3_client()
        bucket, key = self._where()
        deadline = time.monotonic() + max(0.0, wait_seconds)
        info = json.dumps(_info())
        while True:
            try:
                self.etag = client.put_object(Bucket=bucket, Key=key, Body=info.encode(), IfNoneMatch="*")["ETag"]
                self._check_atomic(client, output, info)
                self._thread = threading.Thread(target=self._beat, args=(info,), name="rescore-lock", daemon=True)
                self._thread.start()
                return self
            except ClientError as e:
                code = _s3_code(e)
                if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
                    from rescore.transforms.files.stores import refused_write

                    said = (refused_write(self.path, e) if code in ("AccessDenied", "403") else None) or (
                        f"no permission to write {self.path} ({code})")
                    raise OutputError(f"--output {output}: {said}") from None
                if code in ("NotImplemented", "501"):
                    raise self._not_atomic(output) from None
                if code not in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                    raise
            try:
                held = client.get_object(Bucket=bucket, Key=key)
            except ClientError as e:
                if storage.not_found(e):
                    continue  # released meanwhile
                raise
            _wait_or_take_over(output, held["Body"].read(), held["LastModified"], deadline, wait_seconds,
                               lambda etag=held["ETag"]: self._delete_if(client, etag))

    def _not_atomic(self, output: str) -> OutputError:
        return OutputError(
            f"--output {output}: this S3 endpoint does not honour conditional writes (If-None-Match), so the "
            "output lock cannot be atomic there; Rescore does not write to it (AWS S3 and MinIO honour them)"
        )

    def _check_atomic(self, client, output: str, info: str) -> None:
        """A second create-if-absent must be refused (412): a store that accepts it ignores
        If-None-Match, and two runs would both hold the lock."""
        from botocore.exceptions import ClientError

        bucket, key = self._where()
        try:
            client.put_object(Bucket=bucket, Key=key, Body=info.encode(), IfNoneMatch="*")
        except ClientError as e:
            if _s3_code(e) in ("PreconditionFailed", "412", "ConditionalRequestConflict", "409"):
                return
            raise
        client.delete_object(Bucket=bucket, Key=key)
        self.etag = None
        raise self._not_atomic(output)

    def _delete_if(self, client, etag: str) -> None:
        """Delete the lock object if it is still the one with `etag` (a takeover or a release):
        a conditional delete (If-Match: S3 answers 412 where another run has written the lock
        since), after a HEAD for a store that ignores the condition (there a takeover racing
        another's can still delete the other's new lock)."""
        from botocore.exceptions import ClientError

        bucket, key = self._where()
        try:
            if client.head_object(Bucket=bucket, Key=key)["ETag"] == etag:
                client.delete_object(Bucket=bucket, Key=key, IfMatch=etag)
        except ClientError:
            pass

    def _beat(self, info: str) -> None:
        from botocore.exceptions import ClientError

        client = storage.s3_client()
        bucket, key = self._where()
        beat = 0
        while not self._stop.wait(HEARTBEAT_SECONDS):
            beat += 1
            try:
                self.etag = client.put_object(Bucket=bucket, Key=key, Body=_beat_body(info, beat), IfMatch=self.etag)["ETag"]
            except ClientError as e:
                if _s3_code(e) in ("PreconditionFailed", "412", "NoSuchKey", "404"):
                    log.error("lost the output lock %s: another run took it over", self.path)
                    return
                log.warning("could not refresh the output lock %s", self.path, exc_info=True)
            except Exception:  # noqa: BLE001  (a transient error: try again at the next beat)
                log.warning("could not refresh the output lock %s", self.path, exc_info=True)

    def release(self) -> None:
        self._stop.set()
        if self.etag is None:
            return
        try:
            self._delete_if(storage.s3_client(), self.etag)
        except Exception:  # noqa: BLE001  (taken over or gone: nothing of ours to remove)
            pass
        self.etag = None

    def __enter__(self) -> S3Lock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _s3_code(error) -> str:
    response = getattr(error, "response", {}) or {}
    return str(response.get("Error", {}).get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode") or "")


def acquire(output: str, wait_seconds: float = 0.0) -> OutputLock | GcsLock | S3Lock:
    """Take the output's lock or raise LockBusy naming the holder (after `wait_seconds`)."""
    path = lock_path(output)
    if output.startswith("gs://"):
        try:
            from google.cloud import storage as gcs
        except ImportError:
            gcs = None
        if gcs is not None:
            try:
                client = storage.gcs_client()  # the credentials and project Beam's GcsIO uses
            except Exception as e:  # noqa: BLE001  (no credentials or project: the run could not write either)
                raise LockBusy(f"cannot lock {output} on GCS: {first_line(e)}") from None
            return GcsLock(path, client).acquire(output, wait_seconds)
    if output.startswith("s3://"):
        try:
            import boto3  # noqa: F401  (the [s3] extra is installed)
        except ImportError:
            raise OutputError(f"--output {output} needs the [s3] extra: pip install 'rescore[s3]'") from None
        return S3Lock(path).acquire(output, wait_seconds)
    if not storage.is_local(output):
        log.warning(
            "%s is on an object store: the output lock is not enforced there; make sure no other "
            "run writes to this output at the same time",
            output,
        )
        return OutputLock(path)
    created = None
    try:
        if not os.path.isdir(output):
            os.makedirs(output, exist_ok=True)
            created = output
    except OSError as e:
        raise LockBusy(f"cannot create --output {output}: {e.strerror or e}") from None
    deadline = time.monotonic() + max(0.0, wait_seconds)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise LockBusy(f"cannot write to --output {output}: {e.strerror or e}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                os.close(fd)
                raise
            holder = _holder(fd)
            for _ in range(10):  # the holder has just taken it: give it a moment to sign
                if not holder.startswith("a run that has not"):
                    break
                time.sleep(0.1)
                holder = _holder(fd)
            os.close(fd)
            if time.monotonic() >= deadline:
                if wait_seconds > 0:
                    raise LockBusy(f"{output} is still being written by another run ({holder}) after waiting {wait_seconds:g} s")
                raise LockBusy(
                    f"{output} is being written by another run ({holder}); pass --wait-for-lock SECONDS to wait for it"
                )
            time.sleep(0.2)
            continue
        # The file we locked must still be the one at `path` (a holder never unlinks it, but a
        # user might): otherwise lock the new file.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        info = _info()
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        return OutputLock(path, fd, created)
