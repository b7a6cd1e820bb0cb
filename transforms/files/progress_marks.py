"""Progress marks: empty files a run's steps drop under OUTPUT/_staging/_progress/ as they finish
their work, so the driver's progress line (pipelines/progress.py) counts the work of THIS run,
step by step, on any runner (in-process, multi-process, Flink, Dataflow: every worker can write
the staging directory). They are removed with `_staging/` when the run publishes; a failed run's
are removed when it fails (progress_marks.clear), or with the staging by the next run. A mark is a name only:

    read-UUUUU-R     read unit UUUUU was read and validated: R rows passed validation
    score-B-R        shuffle bucket B was scored: R rows (with its duplicate-id rejects)
    write-UUUUU      read unit UUUUU's files were staged

Names are deterministic, so a retried bundle writes the same mark again, never a second one.
Writing a mark never fails the run.
"""

from __future__ import annotations

import os

from rescore.transforms.files import storage

PROGRESS = "_progress"


def progress_dir(staging: str) -> str:
    return storage.join(staging, PROGRESS)


def read_mark(unit: int, rows: int) -> str:
    return f"read-{unit:05d}-{rows}"


def score_mark(bucket, rows: int) -> str:
    return f"score-{bucket}-{rows}"


def write_mark(unit: int) -> str:
    return f"write-{unit:05d}"


def mark(directory: str | None, name: str) -> None:
    """Drop the empty file `directory/name` (nothing when `directory` is None)."""
    if directory is None:
        return
    try:
        path = storage.join(directory, name)
        if storage.is_local(path):
            os.makedirs(directory, exist_ok=True)
            with open(path, "wb"):
                pass
        else:
            storage.create(path).close()
    except Exception:  # noqa: BLE001  (progress must never break the run)
        pass


def clear(staging: str) -> None:
    """After a failed run: remove its marks, and `staging` itself when the marks were all it held
    (a run that failed before the write step staged anything leaves no `_staging/` behind). Local
    outputs only; elsewhere the next run clears them with the rest of the staging."""
    if not storage.is_local(staging):
        return
    import shutil

    shutil.rmtree(progress_dir(staging), ignore_errors=True)
    try:
        os.rmdir(staging)  # only if empty: a staged file is the failed run's, kept as before
    except OSError:
        pass


def count(directory: str) -> tuple[dict[int, int], int, set[int]]:
    """What the marks say: ({read unit: valid rows}, rows scored, {written units})."""
    read: dict[int, int] = {}
    scored: dict[str, int] = {}
    written: set[int] = set()
    for path in storage.list_dir(directory, "*"):
        name = path.rstrip("/").rsplit("/", 1)[-1]
        kind, _, rest = name.partition("-")
        try:
            if kind == "read":
                unit, rows = rest.split("-")
                read[int(unit)] = int(rows)
            elif kind == "score":
                bucket, rows = rest.rsplit("-", 1)
                scored[bucket] = int(rows)
            elif kind == "write":
                written.add(int(rest))
        except ValueError:
            continue
    return read, sum(scored.values()), written
