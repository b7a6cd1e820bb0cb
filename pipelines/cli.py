"""The `rescore` console script (see rescore.pipelines.rescore.cli for why it starts this way)."""

import gc
import os


def main() -> None:
    # Before torch loads OpenMP: idle intra-op threads sleep instead of spinning. Spinning threads
    # took the cores the I/O threads decode and encode on (a 200k-row run: ~3 CPU-s, and scoring
    # 13 s instead of 0.1 s on a loaded machine). The thread count, hence every result, is unchanged.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # Before pyarrow makes its default memory pool: jemalloc hands freed decode buffers back to
    # the next read instead of fresh pages the kernel must zero (a 204,800-row run: ~0.9 CPU-s,
    # ~5 % wall, lower peak memory than pyarrow's default mimalloc). Values are unchanged.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
    gc.disable()
    from rescore.pipelines import rescore

    rescore.cli()
