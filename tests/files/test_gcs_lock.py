"""The output lock on GCS (transforms/files/lock.py: GcsLock): create-if-absent with generation
preconditions, on a fake bucket; exclusive, and a stale or dead holder's lock is taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest


class _FakeGcs:
    """The few google.cloud.storage calls the lock makes, with GCS's generation preconditions."""

    def __init__(self):
        import datetime

        self.objects = {}  # name -> (generation, bytes, updated)
        self.next_generation = 1
        self.datetime = datetime

    def bucket(self, _name):
        return self

    def blob(self, name):
        return _FakeBlob(self, name)

    def get_blob(self, name):
        if name not in self.objects:
            return None
        blob = _FakeBlob(self, name)
        blob.generation, _, blob.updated = self.objects[name]
        return blob


class _FakeBlob:
    def __init__(self, store, name):
        self.store, self.name, self.generation, self.updated = store, name, None, None

    def _check(self, match):
        from google.api_core import exceptions

        current = self.store.objects.get(self.name, (0,))[0]
        if match is not None and current != match:
            raise exceptions.PreconditionFailed("generation mismatch")

    def upload_from_string(self, data, if_generation_match=None):
        self._check(if_generation_match)
        self.generation = self.store.next_generation
        self.store.next_generation += 1
        now = self.store.datetime.datetime.now(self.store.datetime.timezone.utc)
        self.store.objects[self.name] = (self.generation, data.encode(), now)

    def download_as_bytes(self, if_generation_match=None):
        self._check(if_generation_match)
        return self.store.objects[self.name][1]

    def delete(self, if_generation_match=None):
        from google.api_core import exceptions

        if self.name not in self.store.objects:
            raise exceptions.NotFound("gone")
        self._check(if_generation_match)
        del self.store.objects[self.name]


def test_gcs_lock_is_exclusive_and_a_stale_one_is_taken_over():
    pytest.importorskip("google.api_core", reason="the GCS lock needs google-cloud-storage (the gcp extra)")
    import datetime

    from rescore.transforms.files.lock import GcsLock, LockBusy

    store, path = _FakeGcs(), "gs://bucket/out/_rescore.lock"
    first = GcsLock(path, store).acquire("gs://bucket/out", 0)
    with pytest.raises(LockBusy, match=f"pid {os.getpid()} on host {socket.gethostname()}"):
        GcsLock(path, store).acquire("gs://bucket/out", 0)
    # No heartbeat for 11 minutes: taken over; the old holder's release leaves the new lock alone.
    gen, data, _ = store.objects["out/_rescore.lock"]
    old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=11)
    store.objects["out/_rescore.lock"] = (gen, data, old)
    second = GcsLock(path, store).acquire("gs://bucket/out", 0)
    first.release()
    assert store.objects["out/_rescore.lock"][0] == second.generation
    second.release()
    assert "out/_rescore.lock" not in store.objects
    # A holder that is a dead process on this host: taken over at once.
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    info = {"pid": int(dead.stdout), "host": socket.gethostname(), "started": "2026-01-01T00:00:00Z"}
    _FakeBlob(store, "out/_rescore.lock").upload_from_string(json.dumps(info), if_generation_match=0)
    GcsLock(path, store).acquire("gs://bucket/out", 0).release()
