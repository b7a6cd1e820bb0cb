"""Scheduled, incremental rescoring: score only the input files a previous run has not.

    OUTPUT/
      _manifest.json              every input file already scored: path, size, mtime, run
      run=20261122T030000/        one finished run: scored-*, rejected-*, metrics.json, _SUCCESS
      run=20261123T030000/        the next day's new files only

A run lists the input, keeps the files the manifest does not hold (or whose size or mtime has
changed since), scores them into a new run directory, and adds them to the manifest only after
that directory has its _SUCCESS. A failed run leaves the manifest as it was, so the next run
picks the same files up again (and removes the failed run's directory).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timezone

from transforms import storage
from transforms.read import InputError

log = logging.getLogger("rescore")

MANIFEST = "_manifest.json"
RUN_PREFIX = "run="


@dataclass(frozen=True)
class InputFile:
    path: str
    size: int
    mtime: float

    def entry(self, run: str) -> dict:
        return {"size": self.size, "mtime": self.mtime, "run": run}


@dataclass(frozen=True)
class Selection:
    new: list[InputFile]
    already: int
    changed: list[str]


def manifest_path(output: str) -> str:
    return storage.join(output, MANIFEST)


def load_manifest(output: str) -> dict[str, dict]:
    path = manifest_path(output)
    if not storage.exists(path):
        return {}
    try:
        doc = json.loads(storage.read_text(path))
        return dict(doc["files"])
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(f"{path} is not a Rescore manifest ({e}); move it away to start over") from None


def list_inputs(patterns: list[str]) -> list[InputFile]:
    files: dict[str, InputFile] = {}
    for pattern in patterns:
        found = storage.match_stats(pattern)
        if not found:
            raise InputError(f"no input files match {pattern!r}")
        for path, size, mtime in found:
            files[path] = InputFile(path, size, mtime)
    return [files[p] for p in sorted(files)]


def select(files: list[InputFile], manifest: dict[str, dict]) -> Selection:
    """The files to score: not in the manifest, or changed (size or mtime) since they were."""
    new, changed = [], []
    for f in files:
        seen = manifest.get(f.path)
        if seen is None:
            new.append(f)
        elif seen.get("size") != f.size or seen.get("mtime") != f.mtime:
            new.append(f)
            changed.append(f.path)
    return Selection(new, len(files) - len(new), changed)


def run_name(now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    return f"{RUN_PREFIX}{now.strftime('%Y%m%dT%H%M%S')}"


def record(output: str, run: str, files: list[InputFile]) -> None:
    """Add `files` to the manifest (after the run's _SUCCESS); written whole, then renamed."""
    manifest = load_manifest(output)
    manifest.update({f.path: f.entry(run) for f in files})
    doc = {"version": 1, "files": dict(sorted(manifest.items()))}
    storage.write_text(manifest_path(output), json.dumps(doc, indent=1) + "\n")


def remove_failed_runs(output: str, manifest: dict[str, dict]) -> list[str]:
    """Delete run directories without _SUCCESS that the manifest does not name (local outputs;
    elsewhere they are left, and readers skip them for want of _SUCCESS)."""
    if not storage.is_local(output) or not os.path.isdir(output):
        return []
    finished = {entry.get("run") for entry in manifest.values()}
    removed = []
    for name in sorted(os.listdir(output)):
        path = os.path.join(output, name)
        if name.startswith(RUN_PREFIX) and os.path.isdir(path) and name not in finished:
            if not os.path.exists(os.path.join(path, "_SUCCESS")):
                storage.delete([path])
                removed.append(path)
    return removed
