"""One memory budget for a process's read units: the run setting memory_mb (`--memory-mb N`).

What a run holds beyond the process itself (Python, Beam, torch, polars: measured here as the
resident memory when the plan is made, less what Arrow's pool holds then, plus LATER for what it
adds afterwards) is read units:

- each unit in flight in the read or write step (`--io-threads` of them at once): its decoded
  table, and in the write step the token broadcast (`advantages`, float32 per response token)
  and the encoded file the Parquet writer holds before it writes it (one row group): about
  UNIT_FACTOR times the unit's size by its file's footer (measured: benchmarks/README.md,
  issue 42);
- the unit cache (transforms/files/unit_cache.py): decoded units kept between the two reads;
- its read-ahead, on top of the cache.

`plan()` fits the three into `budget` bytes in that order of need: one unit in flight (the
least a run can do), more units in flight (time), then the cache and the read-ahead (second
reads saved), each only as far as the room left allows. A setting given explicitly
(--unit-cache-mb, --read-ahead-mb, --io-threads) is never raised, only lowered where the
budget is smaller. Nothing is refused: a budget below the process and one unit gives one unit
at a time, no cache and no read-ahead (the least memory the run can use; it may then exceed the
budget, and says so in a warning). Values never depend on it: only what is kept and how many
units are in flight.

Nothing here imports Beam (pipelines/early.py sizes the prefetch with it before Beam loads).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

MB = 1 << 20

UNIT_FACTOR = 3.5
"""Bytes one read unit in flight holds per byte of its size by the file's footer (uncompressed
Parquet): its decoded table (~1.45 times that), the token broadcast and the encoded row group
(together ~1.3 times the table): measured ~3.3 at 204,800 benchmark rows, rounded up."""

DECODED = 1.5
"""A decoded table's bytes per byte of its size by the footer (1.45 for the benchmark's data)."""

CONTAINER_SHARE = 0.8
"""Without --memory-mb, a process in a container with a memory limit (cgroup v1 or v2) takes
this share of the limit as its budget: the rest is for the page cache the limit also charges
(the input and output files) and what the estimates miss. Without a limit: no budget."""

CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
"""Where a container's memory limit shows inside it (cgroup v2, v1)."""

LATER = 128 * MB
"""What the process itself adds after the plan is made (polars' import at the first write, torch's
first operations, Beam's bundles): counted with the process. Without it a 204,800-row run under
--memory-mb 1100 peaked at 1,164 MiB."""

PREFETCH_SHARE = 0.25
"""Under a budget, the prefetch (pipelines/early.py) decodes units worth at most this share of
it (they are held until the read step takes them)."""


@dataclass(frozen=True)
class MemoryPlan:
    """What one process may hold for its read units."""

    threads: int
    """Read units in flight per step (the read and the write step's threads)."""
    cache: int
    """Bytes the unit cache may hold."""
    ahead: int
    """Bytes the read-ahead may hold on top of the cache."""
    base: int
    """The process's own resident bytes the plan was made with."""
    unit: int
    """The largest read unit's uncompressed bytes by the file footers."""
    fits: bool
    """False where the budget is below the process and one unit in flight."""


def container_limit(paths: tuple[str, ...] = CGROUP_LIMITS) -> int | None:
    """The memory limit of this process's container, in bytes; None where there is none (or it
    is above the machine's memory)."""
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        physical = None
    limits = []
    for path in paths:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and (physical is None or int(text) < physical):
            limits.append(int(text))
    return min(limits) if limits else None


def budget_mb(memory_mb: float | None) -> float | None:
    """The run's budget in MB: `memory_mb` (the run setting), else CONTAINER_SHARE of the
    container's memory limit, else None (no budget)."""
    if memory_mb is not None:
        return float(memory_mb)
    limit = container_limit()
    return None if limit is None else limit * CONTAINER_SHARE / MB


def resident_bytes() -> int:
    """This process's resident memory now (0 where it cannot be read)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError, AttributeError):  # not Linux
        return 0


def arrow_bytes() -> int:
    """Bytes Arrow's default pool holds now (decoded tables: counted by the plan, not the base)."""
    import pyarrow as pa

    return pa.total_allocated_bytes()


def hand_back_freed(keep: frozenset[int] = frozenset()) -> None:
    """Hand the freed pages Arrow's pool keeps for its next allocations back to the kernel now
    (transforms/jemalloc.py), on a thread of its own, but those of the arenas in `keep`
    (jemalloc.this_threads_arena of threads still at work). Called where a step has freed what no
    later allocation reuses: the decode buffers once the read step has read every unit, a
    written unit's table."""
    from rescore.transforms import jemalloc

    jemalloc.purge_soon(keep)


def this_threads_arena() -> int | None:
    """The allocator arena of this thread's Arrow buffers (transforms/jemalloc.py; None: not known)."""
    from rescore.transforms import jemalloc

    return jemalloc.this_threads_arena()


def process_base() -> int:
    """The process's own resident bytes: resident memory less Arrow's pool."""
    return max(0, resident_bytes() - arrow_bytes())


def unit_bytes(unit) -> int:
    """A read unit's size by its file's footer: the uncompressed bytes of its row groups (of a
    slice: its share of the row group's rows). The plan's own figure (`ReadUnit.size`, from the
    footer it read) where it has one; else the footer is read."""
    if getattr(unit, "size", 0):
        return unit.size
    from rescore.transforms.files import storage

    meta = storage.open_parquet(unit.path).metadata
    total = rows = 0
    for g in unit.row_groups:
        group = meta.row_group(g)
        total += group.total_byte_size
        rows += group.num_rows
    return int(total * unit.num_rows / rows) if rows else 0


def largest_unit(units) -> int:
    """The largest footer size among `units` (0 where a footer cannot be read: the plan then
    counts units as free, and the run reads and fails as it would have)."""
    try:
        return max((unit_bytes(u) for u in units), default=0)
    except Exception:  # noqa: BLE001  (the read step reports any problem with the input)
        return 0


def plan(budget: int, *, base: int, unit: int, threads: int, cache: int, ahead: int) -> MemoryPlan:
    """Fit `threads` units in flight, a `cache` and a read-ahead of `ahead` bytes (the values
    without a budget) into `budget` bytes with a process of `base` bytes and units of at most
    `unit` bytes by the footer (module docstring); LATER is counted with the process."""
    per_unit = int(unit * UNIT_FACTOR)
    room = budget - base - LATER
    fits = room >= per_unit
    if per_unit > 0:
        threads = max(1, min(threads, room // per_unit))
    room = max(0, room - threads * per_unit)
    cache = max(0, min(cache, room))
    ahead = max(0, min(ahead, room - cache)) if cache > 0 else 0
    return MemoryPlan(threads=threads, cache=cache, ahead=ahead, base=base, unit=unit, fits=fits)


def prefetch_units(budget_mb: float | None, sizes: list[int]) -> int:
    """How many of the units of footer `sizes` (in order) the prefetch may decode: all of them
    without a budget, else those whose decoded tables (DECODED times their size) fit in
    PREFETCH_SHARE of it (at least one)."""
    if budget_mb is None:
        return len(sizes)
    room, count = budget_mb * MB * PREFETCH_SHARE, 0
    for size in sizes:
        room -= size * DECODED
        if room < 0:
            break
        count += 1
    return max(1, count) if sizes else 0


GPU_LIBRARIES = re.compile(
    r"/nvidia/|/lib(?:torch_cuda|c10_cuda|caffe2_nvrtc|cublas|cudnn|cusparse|cufft|curand|cusolver|nccl|nvshmem"
    r"|nvrtc|nvJitLink|cupti|cudart|cufile|nvToolsExt)[^/]*$"
)
"""The shared libraries a CUDA build of torch loads with `import torch` even where the run never
touches a GPU (site-packages/nvidia/*, libtorch_cuda, libc10_cuda, ...)."""

MADV_DONTNEED = 4
_released = False


def release_gpu_library_pages(smaps: str = "/proc/self/smaps") -> int:
    """Drop from this process's resident set the pages of the CUDA libraries `import torch`
    loaded, for a run whose torch math is on the CPU; the bytes dropped are returned (once per
    process; 0 where there is nothing to drop, or not on Linux).

    A CUDA build of torch maps cuBLAS, NVRTC, nvJitLink, cuDNN, ... at import, and their static
    initialisers touch ~140 MB of them (torch 2.13+cu130: 136 MB of the 503 MB `import torch`
    holds), which then stay in the resident set of a process that never calls them. Only mappings
    that are read-only and hold no page of their own (smaps' `Anonymous: 0`: every resident page
    is the file's, unmodified) are dropped, with madvise(MADV_DONTNEED): the pages stay in the
    page cache, and one the process does touch again is mapped back from it at its next access,
    with the file's bytes, exactly as before. Nothing computed changes; only the resident set."""
    global _released
    if _released:
        return 0
    _released = True
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        spans: list[list[int]] = []
        current: list[int] | None = None
        with open(smaps) as f:
            for line in f:
                head = line.split(None, 6)
                if not head[0].endswith(":"):  # a mapping's first line: range perms offset dev inode [path]
                    current = None
                    if len(head) > 5 and "w" not in head[1] and GPU_LIBRARIES.search(head[5].rstrip("\n")):
                        start, end = (int(x, 16) for x in head[0].split("-"))
                        current = [start, end, 0, 0]
                        spans.append(current)
                elif current is not None and head[0] in ("Rss:", "Anonymous:"):
                    current[2 if head[0] == "Rss:" else 3] = int(head[1])
        dropped = 0
        for start, end, rss_kb, anonymous_kb in spans:
            if rss_kb and not anonymous_kb and libc.madvise(start, end - start, MADV_DONTNEED) == 0:
                dropped += rss_kb * 1024
        return dropped
    except Exception:  # noqa: BLE001  (no /proc, no libc: the pages simply stay)
        return 0
