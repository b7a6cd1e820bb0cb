"""Input fingerprints: a file the plan read must be the same file when the job reads it again.

Rescore reads each read unit twice (light rows to score, full rows to write) and plans from the
footer before either. A file rewritten in between would put scores on the wrong rows. Each input
file is fingerprinted at plan time and checked before and after every read of one of its units:

- local files: size, mtime_ns, ctime_ns, inode and device from stat(). ctime cannot be set back
  by a user (utime() changes it too), and an in-place write or a rename over the path changes
  at least one of these;
- object stores: size and the object's update time (a rewrite is a new object generation);
- everywhere: sha256 of the Parquet footer (row-group layout, sizes, offsets, column
  statistics), which changes with any rewrite of different data unless byte sizes and
  statistics all happen to match.

No data checksum: hashing the id and reward columns would cost a third read of every file; the
stat fields already change with any write, and the footer hash covers a copy that keeps them.
"""

from __future__ import annotations

import hashlib
import os
import struct
from dataclasses import dataclass


from rescore.errors import InputChanged
from rescore.transforms.files import storage


@dataclass(frozen=True)
class Fingerprint:
    stat: tuple
    """Local: (size, mtime_ns, ctime_ns, inode, device); elsewhere (size, update time)."""
    footer: str
    """sha256 of the Parquet footer ('' when the file has none)."""


def _stat(path: str) -> tuple:
    if storage.is_local(path):
        st = os.stat(path)
        return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev)
    if path.startswith("s3://"):  # one listing with the run's client (storage._s3_match)
        found = [(size, updated) for p, size, updated in storage.match_stats(path) if p == path]
        if not found:
            raise FileNotFoundError(path)
        return found[0]
    meta = storage._beam()[0].match([path])[0].metadata_list
    if not meta:
        raise FileNotFoundError(path)
    return (meta[0].size_in_bytes, meta[0].last_updated_in_seconds)


def footer_bytes(path: str, size: int) -> bytes:
    """The Parquet footer (the FileMetaData, without its length and magic) of the file at `path`
    of `size` bytes; b'' when it has none."""
    if size < 12:
        return b""
    if storage.is_local(path):
        f = open(path, "rb")
    else:
        f = storage.open_read(path)
    with f:
        f.seek(size - 8)
        tail = f.read(8)
        length = struct.unpack("<I", tail[:4])[0]
        if tail[4:] != b"PAR1" or length + 12 > size:
            return b""
        f.seek(size - 8 - length)
        return f.read(length)


def footer_hash(path: str, size: int) -> str:
    """sha256 of the Parquet footer of the file at `path` of `size` bytes ('' when it has none)."""
    footer = footer_bytes(path, size)
    return hashlib.sha256(footer).hexdigest() if footer else ""


def parse_footer(footer: bytes):
    """The pyarrow FileMetaData of footer bytes (footer_bytes): the one read of a footer serves
    both its hash and its contents (open a file with it: `storage.open_parquet(path, metadata=)`).
    Raises what pyarrow raises for a footer that is not Parquet's."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    return pq.read_metadata(pa.BufferReader(b"PAR1" + footer + struct.pack("<I", len(footer)) + b"PAR1"))


def take_with_footer(path: str) -> tuple[Fingerprint, bytes]:
    """The file's fingerprint now, and the footer bytes it hashed (one read of the footer)."""
    st = _stat(path)
    footer = footer_bytes(path, st[0])
    return Fingerprint(st, hashlib.sha256(footer).hexdigest() if footer else ""), footer


def take(path: str) -> Fingerprint:
    """The file's fingerprint now."""
    st = _stat(path)
    return Fingerprint(st, footer_hash(path, st[0]))


def same_stat(path: str, expected: Fingerprint) -> None:
    """Raise InputChanged unless stat() still matches (after a read: cheap, no footer read)."""
    try:
        now = _stat(path)
    except OSError:
        raise InputChanged(f"{path} was removed while the run read it; nothing was published") from None
    if now != expected.stat:
        raise InputChanged(_message(path, "its size or modification time"))


def verify(path: str, expected: Fingerprint) -> None:
    """Raise InputChanged unless the file is still the one the plan fingerprinted."""
    try:
        now = take(path)
    except OSError:
        raise InputChanged(f"{path} was removed or became unreadable after the run planned it; nothing was published") from None
    if now.stat != expected.stat:
        raise InputChanged(_message(path, "its size or modification time"))
    if now.footer != expected.footer:
        raise InputChanged(_message(path, "its Parquet footer"))


def _message(path: str, what: str) -> str:
    return (
        f"{path} changed while the run was reading it ({what} differs from when the run planned it); "
        "nothing was published: rerun once the input is complete"
    )
