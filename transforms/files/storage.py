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
    try:
        result = _beam()[0].match([pattern])[0]
    except Exception:  # noqa: BLE001  (Beam raises BeamIOError for a pattern that matches nothing)
        return []
    found = [(m.path, m.size_in_bytes, float(m.last_updated_in_seconds or 0.0)) for m in result.metadata_list]
    if is_local(pattern):
        found = [f for f in found if os.path.isfile(f[0])]
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
    fs, codecs = _beam()
    return pq.ParquetFile(fs.open(path, compression_type=codecs.UNCOMPRESSED), **options)


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
    fs, codecs = _beam()
    with fs.create(path, compression_type=codecs.UNCOMPRESSED) as f:
        pq.write_table(table, f, use_dictionary=use_dictionary)


def create(path: str):
    """A binary file object writing `path` (not local: an object store's upload, visible on close)."""
    fs, codecs = _beam()
    return fs.create(path, compression_type=codecs.UNCOMPRESSED)


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
    fs, codecs = _beam()
    with fs.create(path, mime_type="text/plain", compression_type=codecs.UNCOMPRESSED) as f:
        f.write(text.encode("utf-8"))


def read_text(path: str) -> str:
    if is_local(path):
        with open(path, encoding="utf-8") as f:
            return f.read()
    fs, codecs = _beam()
    with fs.open(path, compression_type=codecs.UNCOMPRESSED) as f:
        return io.TextIOWrapper(f, encoding="utf-8").read()


def exists(path: str) -> bool:
    return os.path.exists(path) if is_local(path) else _beam()[0].exists(path)


def rename(src: str, dst: str) -> None:
    if is_local(src):
        os.replace(src, dst)
    else:
        _beam()[0].rename([src], [dst])


def delete(paths: Iterable[str]) -> None:
    paths = [p for p in paths if exists(p)]
    if not paths:
        return
    if all(is_local(p) for p in paths):
        for p in paths:
            if os.path.isdir(p):
                shutil.rmtree(p)
            else:
                os.remove(p)
    else:
        _beam()[0].delete(paths)


def list_dir(directory: str, pattern: str = "*") -> list[str]:
    """The files in `directory` matching `pattern` (an object store has no directories to check)."""
    if is_local(directory) and not exists(directory):
        return []
    return [p for p, _ in match(join(directory, pattern))]
