"""What an incremental run scores: the input files as identified between runs, the batches each
holds, and the selection of new, changed and deleted files and the batches they touch.

Each input file's footer is read ONCE (list_inputs): its bytes give the content fingerprint the
bookkeeping records (sha256 of the footer), the plan's fingerprint, and the parsed footer
(`InputFile.metadata`) that the batches, the row-group selection, the type check and the plan
read instead of opening the file again. No Beam.
"""

from __future__ import annotations

import bisect
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa

from rescore.errors import InputError, first_line
from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import storage
from rescore.transforms.files.delta_table import State

log = logging.getLogger("rescore")


def canonical(path: str) -> str:
    """The one name of a file however it was spelt: the real path (symlinks, `.`, `..` and
    relative paths resolved) for local files; for URLs the scheme and host in lower case and
    the path with `.`/`..` segments and repeated slashes removed."""
    if storage.is_local(path):
        return os.path.realpath(path)
    parts = urlsplit(path)
    segments: list[str] = []
    for seg in parts.path.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if segments:
                segments.pop()
            continue
        segments.append(seg)
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), "/" + "/".join(segments), "", ""))


@dataclass(frozen=True)
class InputFile:
    key: str
    """canonical location: the file's identity"""
    path: str
    """a path this run can open (as matched)"""
    size: int
    mtime: float
    footer: str = ""
    """sha256 of the Parquet footer (what the bookkeeping records)"""
    fingerprint: fingerprints.Fingerprint | None = field(default=None, compare=False)
    """taken with that one read of the footer: the plan's fingerprint of the file"""
    metadata: Any = field(default=None, compare=False, repr=False)
    """the parsed footer (pyarrow FileMetaData; None where it did not parse)"""

    def same_content(self, entry: dict) -> bool:
        return (entry.get("size"), entry.get("mtime"), entry.get("footer")) == (self.size, self.mtime, self.footer)

    @property
    def schema(self) -> pa.Schema | None:
        """The file's Arrow schema, from its footer (None where the footer did not parse)."""
        return None if self.metadata is None else self.metadata.schema.to_arrow_schema()


def list_inputs(patterns: list[str], *, footers: bool = True) -> list[InputFile]:
    """Every file the patterns match, once per canonical location, sorted by it; with `footers`,
    each footer read once: its hash, the fingerprint and the parsed footer."""
    found: dict[str, InputFile] = {}
    for pattern in patterns:
        matched = storage.match_stats(pattern)
        if not matched:
            raise InputError(f"no input files match {pattern!r}")
        for path, size, mtime in matched:
            key = canonical(path)
            found.setdefault(key, InputFile(key, path, size, mtime))
    files = [found[k] for k in sorted(found)]
    if not footers or not files:
        return files

    def digest(f: InputFile) -> InputFile:
        try:
            fp, raw = fingerprints.take_with_footer(f.path)
        except OSError as e:
            raise InputError(f"{f.path}: cannot read its footer ({e.strerror or e})") from None
        try:
            metadata = fingerprints.parse_footer(raw) if raw else None
        except Exception:  # noqa: BLE001  (not Parquet: reported, or skipped, where its batches are read)
            metadata = None
        return replace(f, size=fp.stat[0], footer=fp.footer, fingerprint=fp, metadata=metadata)

    with ThreadPoolExecutor(max_workers=min(16, len(files))) as pool:
        return list(pool.map(digest, files))


# --- batches held by a file ---------------------------------------------------------------


def batch_ranges(values: list[int]) -> list[list[int]]:
    """Sorted distinct ints as [lo, hi] ranges (compact in the bookkeeping)."""
    out: list[list[int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1][1] = v
        else:
            out.append([v, v])
    return out


def expand(ranges: list[list[int]]) -> set[int]:
    return {v for lo, hi in ranges for v in range(lo, hi + 1)}


def _batch_leaf(pf) -> int | None:
    """The Parquet leaf column index of an integer `batch` column (None if there is none)."""
    if "batch" not in pf.schema_arrow.names or not pa.types.is_integer(pf.schema_arrow.field("batch").type):
        return None
    for i in range(pf.metadata.num_columns):
        if pf.metadata.schema.column(i).path == "batch":
            return i
    return None


def file_batches(path: str, metadata=None) -> list[int]:
    """The distinct non-null `batch` values of a file: from the footer where a row group's
    statistics are exact (min == max), else from the row group's `batch` column. `metadata`:
    its footer, already read (InputFile.metadata)."""
    pf = storage.open_parquet(path, metadata=metadata)
    leaf = _batch_leaf(pf)
    if leaf is None:
        return []  # no usable batch column: the pipeline rejects the file or its rows, with reasons
    values: set[int] = set()
    for g in range(pf.num_row_groups):
        rg = pf.metadata.row_group(g)
        if rg.num_rows == 0:
            continue
        stats = rg.column(leaf).statistics
        if stats is not None and stats.has_min_max and stats.min == stats.max:
            values.add(int(stats.min))
            continue
        column = pf.read_row_group(g, columns=["batch"])["batch"]
        values.update(int(v) for v in column.drop_null().unique().to_pylist())
    return sorted(values)


def row_group_may_hold(path: str, batches: set[int], metadata=None) -> list[int]:
    """Row counts of the file's row groups, 0 for those whose `batch` statistics show they
    hold none of `batches` (groups without statistics are kept). `metadata`: its footer, already
    read (InputFile.metadata)."""
    pf = storage.open_parquet(path, metadata=metadata)
    counts = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
    leaf = _batch_leaf(pf)
    if leaf is None or not batches:
        return counts
    ordered = sorted(batches)
    for g in range(pf.num_row_groups):
        stats = pf.metadata.row_group(g).column(leaf).statistics
        if stats is None or not stats.has_min_max:
            continue
        lo, hi = int(stats.min), int(stats.max)
        i = bisect.bisect_left(ordered, lo)
        if i == len(ordered) or ordered[i] > hi:
            counts[g] = 0
    return counts


# --- selection ------------------------------------------------------------------------------


@dataclass
class Selection:
    current: list[InputFile]
    new: list[InputFile]
    changed: list[InputFile]
    deleted: list[str]
    batches: dict[str, list[int]]
    """batches held now by every new or changed file, by key"""
    touched: set[int]
    sources: list[InputFile]
    """current files holding rows of a touched batch"""

    @property
    def nothing_new(self) -> bool:
        return not (self.new or self.changed or self.deleted)


def select(files: list[InputFile], state: State, *, rebuild: bool = False, skip_bad_files: bool = False) -> Selection:
    """New, changed and deleted files against the bookkeeping `state`, the batches they touch,
    and every current file holding rows of a touched batch (`rebuild`: every batch)."""
    previous = state.files
    new = [f for f in files if f.key not in previous]
    changed = [f for f in files if f.key in previous and not f.same_content(previous[f.key])]
    present = {f.key for f in files}
    deleted = sorted(k for k in previous if k not in present)
    fresh = files if rebuild else new + changed

    def batches_of(f: InputFile):
        try:
            return file_batches(f.path, f.metadata)
        except Exception as e:  # noqa: BLE001  (pyarrow raises several types for foreign files)
            if skip_bad_files:
                return e
            raise InputError(f"{f.path}: not a readable Parquet file ({first_line(e)})") from None

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(fresh)))) as pool:
        found = list(pool.map(batches_of, fresh))
    batches: dict[str, list[int]] = {}
    for f, b in zip(fresh, found):
        if isinstance(b, Exception):
            log.warning("skipping %s: not a readable Parquet file", f.path)
            continue
        batches[f.key] = b
    touched: set[int] = set()
    for b in batches.values():
        touched.update(b)
    for f in changed:
        touched |= expand(previous[f.key]["batches"])
    for key in deleted:
        touched |= expand(previous[key]["batches"])
    if rebuild:
        for entry in previous.values():
            touched |= expand(entry["batches"])

    def held(f: InputFile) -> set[int]:
        if f.key in batches:
            return set(batches[f.key])
        return expand(previous[f.key]["batches"]) if f.key in previous else set()

    sources = [f for f in files if held(f) & touched]
    return Selection(files, new, changed, deleted, batches, touched, sources)
