"""Hand the freed pages Arrow's jemalloc keeps back to the kernel, now.

Arrow's jemalloc pool keeps freed pages for its next allocations for a while (the command sets
3 s: pipelines/cli.py, keep_freed_pages), per arena, and an arena is bound to the threads that
allocate in it. The pages a read unit's decode frees are reused by the same thread's next decode,
which is what the delay is for; once the read step has read every unit, the threads that decoded
them allocate nothing more, and their arenas hold those pages until their delay has run out
(jemalloc counts it only as an arena is used). At 204,800 benchmark rows that was ~450 MB of the
run's peak, in its write step (benchmarks/README.md, issue 42).

pyarrow's own way, `MemoryPool.release_unused()`, does nothing on its jemalloc pool: Arrow asks
jemalloc for `"arena.MALLCTL_ARENAS_ALL.purge"`, the macro's name where its value (4096) was meant
(the string is in libarrow.so as such), and jemalloc refuses the unknown name silently. jemalloc's
`mallctl` is in libarrow, under the name `je_arrow_mallctl`, but not exported: `purge()` finds it in
the library's own symbol table (.symtab), checks that the code at that address in this process is
the library file's code for that symbol, byte for byte, and asks for `arena.4096.purge` (all
arenas). Where anything of that does not hold (another platform, a stripped or other build of
libarrow, a pool that is not jemalloc, the address's bytes differ), `purge()` calls pyarrow's
`release_unused()` (which works on the other pools, and on a jemalloc pool where Arrow fixed it)
and that is all: the pages are then handed back as the delay runs out, as before. Which pages back
Arrow's buffers changes, never a value.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading

import numpy as np

log = logging.getLogger("rescore")

SYMBOL = b"je_arrow_mallctl"
ALL_ARENAS = 4096
"""MALLCTL_ARENAS_ALL in jemalloc 5 (its mallctl namespace): every arena at once."""
_CHECKED_BYTES = 32
"""How many bytes of the function's code are compared with the library file's."""

_SYM = np.dtype([("name", "<u4"), ("info", "u1"), ("other", "u1"), ("shndx", "<u2"), ("value", "<u8"), ("size", "<u8")])
_SHDR = np.dtype([
    ("name", "<u4"), ("type", "<u4"), ("flags", "<u8"), ("addr", "<u8"), ("offset", "<u8"), ("size", "<u8"),
    ("link", "<u4"), ("info", "<u4"), ("addralign", "<u8"), ("entsize", "<u8"),
])
_SHT_SYMTAB, _STT_FUNC = 2, 2

_lock = threading.Lock()
_resolved: list = []  # [mallctl or None], once resolved
_background = threading.Condition()
_wanted = [0, None]  # [purges asked for, the thread making them]
_keep: list = [None]  # [the arenas the next purge keeps: None, no purge asked for]


def _read(f, offset: int, size: int) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ValueError("short read")
    return data


def symbol_in_file(path: str, name: bytes) -> tuple[int, bytes] | None:
    """(the symbol's address relative to the library's load address, the first _CHECKED_BYTES of
    its code in the file) for function `name` of the 64-bit little-endian ELF file `path`, from its
    .symtab; None where the file has none such."""
    with open(path, "rb") as f:
        head = _read(f, 0, 64)
        if head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:  # ELFCLASS64, ELFDATA2LSB
            return None
        shoff = int.from_bytes(head[0x28:0x30], "little")
        shentsize, shnum = int.from_bytes(head[0x3A:0x3C], "little"), int.from_bytes(head[0x3C:0x3E], "little")
        if shentsize != _SHDR.itemsize or shnum == 0:
            return None
        sections = np.frombuffer(_read(f, shoff, shnum * shentsize), dtype=_SHDR)
        for sec in sections[sections["type"] == _SHT_SYMTAB]:
            strtab = sections[int(sec["link"])]
            names = _read(f, int(strtab["offset"]), int(strtab["size"]))
            at = names.find(b"\0" + name + b"\0")
            if at < 0:
                continue
            symbols = np.frombuffer(_read(f, int(sec["offset"]), int(sec["size"])), dtype=_SYM)
            hits = symbols[(symbols["name"] == at + 1) & ((symbols["info"] & 0xF) == _STT_FUNC)]
            if len(hits) != 1 or int(hits[0]["shndx"]) >= shnum:
                return None
            value, text = int(hits[0]["value"]), sections[int(hits[0]["shndx"])]
            code = _read(f, int(text["offset"]) + value - int(text["addr"]), _CHECKED_BYTES)
            return value, code
    return None


def _mappings(path: str) -> tuple[int | None, list[tuple[int, int]]]:
    """(where `path` is mapped in this process: its mapping of file offset 0; the readable address
    ranges it is mapped at), from /proc/self/maps."""
    real = os.path.realpath(path)
    base, readable = None, []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or os.path.realpath(fields[5].strip()) != real:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if int(fields[2], 16) == 0 and base is None:
                base = start
            if fields[1].startswith("r"):
                readable.append((start, end))
    return base, readable


def _libarrow() -> str | None:
    import pyarrow as pa

    for folder in pa.get_library_dirs():
        for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else ():
            if name.startswith("libarrow.so"):
                return os.path.join(folder, name)
    return None


def _resolve():
    """jemalloc's mallctl in this process's libarrow, checked; None where it cannot be had."""
    import pyarrow as pa

    try:
        if pa.default_memory_pool().backend_name != "jemalloc":
            return None
        path = _libarrow()
        found = symbol_in_file(path, SYMBOL) if path else None
        base, readable = _mappings(path) if found else (None, [])
        if base is None:
            return None
        address = base + found[0]
        if not any(start <= address and address + _CHECKED_BYTES <= end for start, end in readable):
            return None  # (never read an address this process has not mapped)
        if ctypes.string_at(address, _CHECKED_BYTES) != found[1]:  # not that library's code here
            return None
        return ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
        )(address)
    except (OSError, ValueError, IndexError, AttributeError, NotImplementedError):
        return None


def mallctl():
    """The checked mallctl (resolved once per process), or None."""
    with _lock:
        if not _resolved:
            _resolved.append(_resolve())
        return _resolved[0]


def _read_unsigned(ctl, name: bytes) -> int | None:
    value, size = ctypes.c_uint(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_uint))
    return value.value if ctl(name, ctypes.byref(value), ctypes.byref(size), None, 0) == 0 else None


def this_threads_arena() -> int | None:
    """The jemalloc arena this thread allocates Arrow's buffers in (None: not known)."""
    ctl = mallctl()
    return None if ctl is None else _read_unsigned(ctl, b"thread.arena")


def purge(keep: frozenset[int] = frozenset()) -> bool:
    """Hand the freed pages Arrow's pool keeps back to the kernel now (module docstring): those
    of every arena but the arenas in `keep` (threads still at work, whose next allocations reuse
    their own freed pages). True where jemalloc's arenas were purged; False where only pyarrow's
    release_unused() was called."""
    import pyarrow as pa

    ctl = mallctl()
    if ctl is not None:
        if not keep:
            if ctl(f"arena.{ALL_ARENAS}.purge".encode(), None, None, None, 0) == 0:
                return True
        else:
            arenas = _read_unsigned(ctl, b"arenas.narenas")
            if arenas is not None:
                for i in range(arenas):
                    if i not in keep:  # (an arena never used answers an error: nothing to purge)
                        ctl(f"arena.{i}.purge".encode(), None, None, None, 0)
                return True
    pa.default_memory_pool().release_unused()
    return False


def purge_soon(keep: frozenset[int] = frozenset()) -> None:
    """purge(keep) on a thread of its own, so that the step asking for it goes on at once (handing
    ~400 MB back takes ~0.1 s of madvise calls). Requests while one runs make one more purge
    after it, not one each (keeping only the arenas every one of them keeps)."""
    with _background:
        _wanted[0] += 1
        _keep[0] = frozenset(keep) if _keep[0] is None else _keep[0] & frozenset(keep)
        if _wanted[1] is None:
            # Not a daemon: an interpreter that exits waits for the purge under way (a daemon
            # thread in jemalloc's code at exit could abort the process); it takes ~0.1 s
            _wanted[1] = threading.Thread(target=_purging, name="rescore-purge")
            _wanted[1].start()


def _purging() -> None:
    while True:
        with _background:
            if _wanted[0] == 0:
                _wanted[1] = None
                _background.notify_all()
                return
            _wanted[0], keep, _keep[0] = 0, _keep[0] or frozenset(), None
        try:
            purge(keep)
        except Exception:  # noqa: BLE001  (never fails a run: the pages are handed back by the decay)
            log.debug("purging Arrow's freed pages failed", exc_info=True)


def wait_purged(timeout: float | None = None) -> None:
    """Until no purge is asked for or running (tests)."""
    with _background:
        _background.wait_for(lambda: _wanted[1] is None, timeout)
