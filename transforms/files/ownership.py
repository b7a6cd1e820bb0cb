"""What Rescore owns in an output directory, and how a finished run replaces the last one.

`OUTPUT/_rescore_files.json` records the file names Rescore published there (and marks the
directory as one Rescore writes to). Cleanup only ever deletes names it lists, `_staging/` and
`_failed/`: a file Rescore did not write is never deleted. Outputs written before this file
existed are recognised by their Rescore `metrics.json`.

An --overwrite run leaves the previous finished run (its `_SUCCESS` included) untouched while it
runs; only when every new file is staged and every row is accounted for does it swap: drop the
old `_SUCCESS`, delete the old run's files, move the new ones in, then metrics.json and a new
`_SUCCESS`. A run that fails before that point leaves the previous output readable and intact.
On a local disk the old files are opened before their names are replaced or deleted and closed
on a thread of their own once the swap is done: the kernel frees their cached pages there, not
in the rename on the publish's path.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
import threading

from rescore.errors import OutputError
from rescore.transforms.files import storage
from rescore.transforms.files.layout import (
    DATA_NAMES,
    DELTA_LOG,
    FAILED,
    LEDGER,
    LOCK,
    METRICS,
    REJECTED_FILES,
    RESCORE_NAMES,
    STAGING,
    SUCCESS,
    Kind,
    other_output,
    other_output_message,
)


def _names(output: str) -> list[str]:
    return storage.child_names(output)


def read_ledger(output: str) -> list[str] | None:
    path = storage.join(output, LEDGER)
    if not storage.exists(path):
        return None
    try:
        files = json.loads(storage.read_text(path))["files"]
        if isinstance(files, list) and all(isinstance(f, str) and "/" not in f for f in files):
            return files
    except (ValueError, KeyError, TypeError):
        pass
    raise OutputError(f"{path} is not a Rescore file list; remove it if this directory is not a Rescore output")


def write_ledger(output: str, files) -> None:
    names = sorted(set(files) - {LEDGER, LOCK})
    storage.write_text(storage.join(output, LEDGER), json.dumps({"files": names}, indent=1) + "\n")


def _rescore_metrics(output: str) -> bool:
    """A metrics.json written by Rescore (outputs from before the ledger existed)."""
    path = storage.join(output, METRICS)
    try:
        return "rescore_version" in json.loads(storage.read_text(path))
    except (OSError, ValueError, TypeError):
        return False


def check_output_path(output: str, flag: str = "--output") -> None:
    """`output` (a local directory to write) must be a writable directory or creatable: not a
    file, not under a file, not a dangling symlink (OutputError, exit 2 before anything runs)."""
    if not storage.is_local(output):
        return
    if os.path.lexists(output) and not os.path.exists(output):
        raise OutputError(f"{flag} {output} is a symlink to a path that does not exist")
    if os.path.exists(output) and not os.path.isdir(output):
        raise OutputError(f"{flag} {output} is a file, not a directory")
    if os.path.isdir(output):
        if not os.access(output, os.W_OK | os.X_OK):
            raise OutputError(f"{flag} {output} is not writable")
        return
    problem = creation_problem(output)
    if problem:
        raise OutputError(f"{flag} {output}: {problem}")


def creation_problem(path: str) -> str | None:
    """Why the local `path` (which does not exist) cannot be created, or None: its nearest
    existing ancestor is a file, or a directory this process cannot write."""
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        return f"{parent} is a file, not a directory"
    if parent and not os.access(parent, os.W_OK | os.X_OK):
        return f"{parent} is not writable, so {path} cannot be created"
    return None


def check_not_input(output: str, files) -> None:
    """Refuse an --output that is (through symlinks) the directory of an input file."""
    if storage.is_local(output):
        out = os.path.realpath(output)
    else:
        out = output.rstrip("/")
    for path in files:
        if storage.is_local(path):
            parent = os.path.dirname(os.path.realpath(path))
            same = parent == out or os.path.realpath(path) == out
        else:
            same = path.rsplit("/", 1)[0] == out
        if same:
            raise OutputError(f"--output {output} holds input file {path}; write to a directory of its own")


def prepare(output: str, overwrite: bool) -> None:
    """Check the output directory and clear what an earlier unfinished run of ours left.

    Raises OutputError for a directory holding a finished run (without --overwrite) or files
    with Rescore's names that Rescore did not write.
    """
    names = [n for n in _names(output) if n != LOCK]
    if DELTA_LOG in names:  # even with --overwrite: replacing a table by a one-shot run is not that
        raise OutputError(
            f"--output {output} is an incremental table ({DELTA_LOG}): write one-shot runs to a directory of their own"
        )
    found = other_output(names, Kind.SCORED)
    if found:  # even with --overwrite: a scored run never replaces another command's output
        raise OutputError(other_output_message(output, found))
    ledger = read_ledger(output)
    legacy = ledger is None and _rescore_metrics(output)
    if ledger is None and not legacy:
        clash = [n for n in names if any(fnmatch.fnmatch(n, p) for p in RESCORE_NAMES)]
        if clash:
            raise OutputError(
                f"--output {output} holds {clash[0]!r}, which Rescore did not write; it deletes only its own "
                "files: pick another directory or move that file away"
            )
        write_ledger(output, [])
        return
    if ledger is None:  # an output from before the ledger: its Rescore-named files are ours
        ledger = [n for n in names if any(fnmatch.fnmatch(n, p) for p in RESCORE_NAMES)]
        write_ledger(output, ledger)
    strays = [n for n in names if n not in ledger and any(fnmatch.fnmatch(n, p) for p in DATA_NAMES)]
    if strays:  # it would be read with the run's files, and deleting it is not ours to do
        raise OutputError(
            f"--output {output} holds {strays[0]!r}, which Rescore did not write; it deletes only its own "
            "files: move that file away"
        )
    leftovers = [storage.join(output, n) for n in (STAGING, FAILED) if n in names]
    if SUCCESS in names:
        if not overwrite:
            raise OutputError(f"{output} already holds a finished run (_SUCCESS); pass --overwrite to replace it")
        # Replaced only at the end, by publish(): a failing run leaves it as it is.
    else:
        leftovers += [storage.join(output, n) for n in ledger if n in names]
    if leftovers:
        storage.delete(leftovers)


def publish(output: str, staged: list[str], metrics_text: str, failed: bool) -> str:
    """Move the staged files into `output` (see the module doc); returns where metrics went.

    A failed run (reject budget) publishes its rejected files and metrics.json, never scored
    rows or _SUCCESS; when a finished earlier run is there, into OUTPUT/_failed/ so the finished
    run stays intact."""
    staging = storage.join(output, STAGING)
    finished = storage.exists(storage.join(output, SUCCESS))
    keep = [p for p in staged if not (failed and not fnmatch.fnmatch(p.rsplit("/", 1)[-1], REJECTED_FILES))]
    target = storage.join(output, FAILED) if failed and finished else output
    new_names = [p.rsplit("/", 1)[-1] for p in keep]
    old = read_ledger(output) or []
    replaced: list[int] = []
    try:
        if target == output:
            write_ledger(output, [*old, *new_names, METRICS])  # a crash from here on: all of it is ours
            if finished:
                storage.delete([storage.join(output, SUCCESS)])
            gone = [storage.join(output, n) for n in old if n not in new_names and n != METRICS]
            replaced += _hold(gone)
            storage.delete(gone)
        elif storage.is_local(target):
            os.makedirs(target, exist_ok=True)
        for path in keep:
            final = storage.join(target, path.rsplit("/", 1)[-1])
            if storage.exists(path):
                replaced += _hold([final])
                storage.rename(path, final)
            elif not storage.exists(final):  # a retried finalize has already moved it
                raise RuntimeError(f"staged output {path} is missing")
        metrics = storage.join(target, METRICS)
        storage.write_text(metrics, metrics_text)
        storage.delete([staging])
        if target == output:
            write_ledger(output, [*new_names, METRICS, *([] if failed else [SUCCESS])])
        if not failed:
            storage.write_text(storage.join(output, SUCCESS), "")
        return metrics
    finally:
        _close_soon(replaced)


def _hold(paths: list[str]) -> list[int]:
    """Descriptors of the local files among `paths` that exist: opened before their names are
    replaced or deleted, so that the kernel frees the old files' cached pages when these are
    closed (_close_soon, off the publish's path), not in the rename or unlink. An --overwrite run
    of 1,024,000 benchmark rows replaced 16 files of ~60 MB: ~0.4 s of one core in os.replace."""
    held = []
    for path in paths:
        if not storage.is_local(path):
            continue
        try:  # never blocks (a FIFO put there), never follows a link (what it names is not ours)
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
        except OSError:  # not there, not readable, a link: replaced or deleted as before
            continue
        try:
            regular = stat.S_ISREG(os.fstat(fd).st_mode)
        except OSError:
            regular = False
        if regular:
            held.append(fd)
        else:
            os.close(fd)
    return held


def _close_soon(fds: list[int]) -> None:
    """Close `fds` on a thread of its own (not a daemon: an interpreter that exits waits for it;
    a process that ends first has them closed by the kernel)."""
    if fds:
        threading.Thread(target=lambda: [os.close(fd) for fd in fds], name="rescore-free-replaced", daemon=False).start()
