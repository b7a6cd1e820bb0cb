"""One run at a time per output directory: the output lock.

Local (and NFS) outputs: `OUTPUT/_rescore.lock` is locked with flock(2). The kernel drops the
lock when the holding process dies, however it dies (kill -9 included), so a killed run never
blocks the next one; the file itself stays and names its last holder (pid, host, start time),
which is what a refused run prints (a run that ends normally removes the file). A run that finds the lock held refuses at once (exit 2)
or, with --wait-for-lock SECONDS, polls until the holder is done or the time is up.

Object stores (gs://, s3://) have no flock and Beam's FileSystems have no create-if-absent, so
there the lock is NOT enforced: Rescore warns and runs. Schedule one writer per output prefix
there (see docs/reliability.md).
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import time
from dataclasses import dataclass

from transforms import storage

LOCK = "_rescore.lock"
log = logging.getLogger("rescore")


class LockBusy(ValueError):
    """Another run holds the output lock (or the output cannot be written at all). One-line
    message naming the holder; exit 2."""


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
            try:
                os.rmdir(self.created_dir)
            except OSError:
                pass

    def __enter__(self) -> OutputLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def acquire(output: str, wait_seconds: float = 0.0) -> OutputLock:
    """Take the output's lock or raise LockBusy naming the holder (after `wait_seconds`)."""
    path = lock_path(output)
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
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
        return OutputLock(path, fd, created)
