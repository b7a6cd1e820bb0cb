"""The `rescore` console script (see rescore.pipelines.rescore.cli for why it starts this way)."""

import gc
import os
import platform
import sys


DECAY_ENV = "RESCORE_ARROW_DECAY_MS"
DEFAULT_DECAY_MS = 3000
"""How long Arrow's jemalloc keeps freed pages for the next allocation before handing them back
to the kernel. pyarrow's default, 0, hands every freed page back at once: the parquet reader's
growing buffers then land on fresh pages the kernel must zero, and a 1,024,000-row run took ~3.0M
page faults (~9 s of system time). 3 s spans the time between one read unit's buffers being
freed and the next unit's decode: ~1.8M faults, ~2.5 s less system time, peak memory +~2 %
(benchmarks/README.md). Only which pages are reused changes, never a value."""


def keep_freed_pages() -> None:
    """Set Arrow's jemalloc decay (RESCORE_ARROW_DECAY_MS, default 3000 ms) before pyarrow makes
    its first arena; nothing where Arrow's default pool is another allocator."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL") != "jemalloc":
        return
    chosen = os.environ.get(DECAY_ENV, "").strip()
    try:
        decay = int(chosen) if chosen else DEFAULT_DECAY_MS
    except ValueError:
        sys.stderr.write(f"rescore: error: {DECAY_ENV} must be a whole number of milliseconds (-1: never), got {chosen!r}\n")
        raise SystemExit(2) from None
    import pyarrow as pa  # the job imports it anyway; the decay must be set before any allocation

    try:
        pa.jemalloc_set_decay_ms(decay)
    except (NotImplementedError, pa.ArrowException):  # a pyarrow built without jemalloc
        pass


def main() -> None:
    # Before torch loads OpenMP: idle intra-op threads sleep instead of spinning. Spinning threads
    # took the cores the I/O threads decode and encode on (a 200k-row run: ~3 CPU-s, and scoring
    # 13 s instead of 0.1 s on a loaded machine). The thread count, hence every result, is unchanged.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Before numpy loads its OpenBLAS: Rescore does no numpy linear algebra, and OpenBLAS's
    # worker threads spin ~0.1 CPU-s after numpy's import, on the core the prefetch decodes on
    # during the imports. Values are unchanged. x86-64 only, where torch's BLAS is MKL: on ARM
    # torch may use OpenBLAS itself, and the model stage's matrix products need its threads.
    if platform.machine().lower() in ("x86_64", "amd64"):
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    # Before pyarrow makes its default memory pool: jemalloc hands freed decode buffers back to
    # the next read instead of fresh pages the kernel must zero (a 204,800-row run: ~0.9 CPU-s,
    # ~5 % wall, lower peak memory than pyarrow's default mimalloc). Values are unchanged.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    gc.disable()
    keep_freed_pages()
    from rescore.pipelines.early import prefetch_from

    prefetch = prefetch_from(sys.argv[1:])  # the first read units decode while Beam and torch import
    from rescore.pipelines import rescore

    rescore.cli(prefetch=prefetch)
