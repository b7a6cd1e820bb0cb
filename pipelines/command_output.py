"""The output directory of a subcommand that publishes files (`rescore export`, `rescore task-stats`):
the main command's ownership rules (transforms/files/ownership.py), for a command's own file names.

    claim(out, flag, names, ...)    every check, before any work (OutputError: exit 2, one line)
    stage(out, staging)             an empty staging directory inside `out`, recorded as Rescore's first
    publish(staging, out, files)    the staged files in, the command's older files out, _SUCCESS last

The rules: `--output` is a directory (or creatable), never a file, under a file, a dangling
symlink, or (through symlinks) a source or inside one: the source is never written. In `out`,
Rescore deletes only names its ledger (`_rescore_files.json`) lists: a file with one of the
command's names that Rescore did not write is refused before any work, never replaced; a
directory holding another command's Rescore output is refused; a finished one of this command's
(`_SUCCESS`) needs --overwrite. Outputs written before these commands kept a ledger are
recognised by their own JSON (`legacy`): their files with the command's names are theirs.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil

from rescore.errors import OutputError
from rescore.transforms.files import ownership
from rescore.transforms.files.layout import (
    DELTA_LOG,
    EXPORT_FILES,
    EXPORT_JSON,
    INCREMENTAL_WORK,
    LEDGER,
    LOCK,
    RESCORE_NAMES,
    SUCCESS,
    TASK_BATCH_STATS,
    TASK_STATS,
    TASK_STATS_JSON,
)

EXPORT_NAMES = (*EXPORT_FILES, EXPORT_JSON, "_staging-export")
TASK_STATS_NAMES = (TASK_STATS, TASK_BATCH_STATS, TASK_STATS_JSON, "_staging-task-stats")
COMMAND_NAMES = (*EXPORT_NAMES, *TASK_STATS_NAMES)
"""Every name a subcommand publishes: in a directory Rescore does not own, each is a clash."""


def _matches(name: str, patterns) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def _inside(path: str, directory: str) -> bool:
    try:
        return os.path.commonpath([path, directory]) == directory
    except ValueError:
        return False


def _legacy(out: str, marker: str, keys: tuple[str, ...]) -> bool:
    """A `marker` JSON file this command wrote before it kept a ledger."""
    try:
        with open(os.path.join(out, marker), encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and all(k in doc for k in keys)


def claim(out: str, flag: str, names: tuple[str, ...], *, sources: list[str], overwrite: bool, what: str,
          legacy: tuple[str, tuple[str, ...]] | None = None, directory: bool = True) -> None:
    """Every check of `out` before any work; OutputError (exit 2, one line) where the command must
    not write there. `names`: the command's file names; `sources`: the paths it reads (never
    written); `what`: the output's kind in messages ("export", "task statistics")."""
    refuse_bucket(out, flag)
    ownership.check_output_path(out, flag)  # a file, under a file, a dangling symlink, not writable
    real = os.path.realpath(out)
    for source in sources:
        if "://" in source or any(c in source for c in "*?["):
            continue
        src = os.path.realpath(source)
        if os.path.isdir(src) and (real == src or _inside(real, src)):
            raise OutputError(f"{flag} {out} is (or is inside) the source {source}, which is never written: "
                              "pick a directory of its own")
    ownership.check_not_input(out, [s for s in sources if os.path.isfile(s)])
    if directory and os.path.isdir(out):
        _claim_directory(out, flag, names, overwrite, what, legacy)


def refuse_bucket(out: str, flag: str, command: str | None = None) -> None:
    """OutputError (exit 2, one line, before any work) for an `out` in a bucket: these commands
    check, stage and publish their files with a local disk's operations (listing, rename, the
    ledger), so they write a local directory, which the user then copies (the line says how)."""
    if "://" not in out:
        return
    kind, where = out.split("://", 1)[0].lower(), out.rstrip("/")
    copy = {"gs": f"gcloud storage cp -r DIR {where}", "s3": f"aws s3 cp --recursive DIR {where}"}.get(kind)
    raise OutputError(
        f"{flag} {out}: {f'rescore {command}' if command else 'this command'} writes a local directory only (its "
        "output checks and staged publish work on a local disk): write to a local DIR, then copy it to the bucket"
        + (f" ({copy})" if copy else "")
    )


def claim_table(out: str, flag: str, *, sources: list[str]) -> None:
    """The checks of claim() that hold for an incremental table too (what the directory holds is
    the table's to check: a Delta log of the command's own, or nothing)."""
    claim(out, flag, (), sources=sources, overwrite=True, what="", legacy=None, directory=False)


def _claim_directory(out: str, flag: str, names: tuple[str, ...], overwrite: bool, what: str,
                     legacy: tuple[str, tuple[str, ...]] | None) -> None:
    present = [n for n in sorted(os.listdir(out)) if n != LOCK]
    table = [n for n in present if n in (DELTA_LOG, INCREMENTAL_WORK)]
    if table:  # an incremental output (a run's table, task-stats --incremental): never written into
        raise OutputError(f"{flag} {out} holds another Rescore output (an incremental table: {table[0]!r}), not {what}: "
                          "pick a directory of its own")
    ledger = ownership.read_ledger(out)  # OutputError where it is not a Rescore file list
    if ledger is None and legacy is not None and _legacy(out, *legacy):
        ledger = [n for n in present if _matches(n, (*names, SUCCESS))]
    if ledger is None:
        clash = [n for n in present if _matches(n, (*COMMAND_NAMES, *RESCORE_NAMES))]
        if clash:
            raise OutputError(f"{flag} {out} holds {clash[0]!r}, which Rescore did not write; it deletes and replaces "
                              "only its own files: pick another directory or move that file away")
        return
    foreign = [n for n in ledger if not _matches(n, (*names, SUCCESS))]
    if foreign:
        raise OutputError(f"{flag} {out} holds another Rescore output ({foreign[0]!r}), not {what}: "
                          "pick a directory of its own")
    strays = [n for n in present if n not in ledger and _matches(n, (*COMMAND_NAMES, *RESCORE_NAMES))]
    if strays:
        raise OutputError(f"{flag} {out} holds {strays[0]!r}, which Rescore did not write; it deletes and replaces "
                          "only its own files: move that file away")
    if SUCCESS in present and not overwrite:
        raise OutputError(f"{out} already holds finished {what}; pass --overwrite to replace it")


def stage(out: str, staging_name: str) -> str:
    """An empty staging directory OUT/staging_name, listed in the ledger before it exists (a
    killed run leaves nothing that is not recorded as Rescore's)."""
    os.makedirs(out, exist_ok=True)
    ledger = ownership.read_ledger(out) or []
    ownership.write_ledger(out, [*ledger, staging_name])
    staging = os.path.join(out, staging_name)
    shutil.rmtree(staging, ignore_errors=True)  # ours: claim() refused an unrecorded one
    os.makedirs(staging)
    return staging


def publish(staging: str, out: str, files: list[str]) -> None:
    """Move the staged `files` in (each rename atomic) and write _SUCCESS last. The previous
    _SUCCESS goes first and the previous output's files that this one does not replace are
    deleted (only names the ledger lists), so a reader never sees two outputs under _SUCCESS."""
    old = ownership.read_ledger(out) or []
    staging_name = os.path.basename(staging)
    ownership.write_ledger(out, [*old, *files, SUCCESS])  # a crash from here on: all of it is ours
    success = os.path.join(out, SUCCESS)
    if os.path.exists(success):
        os.remove(success)
    for name in old:
        if name not in files and name not in (SUCCESS, staging_name, LEDGER):
            path = os.path.join(out, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            elif os.path.lexists(path):
                os.remove(path)
    for name in files:
        os.replace(os.path.join(staging, name), os.path.join(out, name))
    shutil.rmtree(staging, ignore_errors=True)
    ownership.write_ledger(out, [*files, SUCCESS])
    with open(success, "w"):
        pass
