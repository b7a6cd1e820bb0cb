"""Where a local rescore run spends its time: imports, then each step's first start, last end
and busy seconds (summed over the threads that ran it).

    python benchmarks/timeline.py --input benchmarks/data/grpo-200000.parquet --output /tmp/tl --strategy grpo --overwrite

Takes the rescore command line. It wraps the step functions of the in-process run (read and
validate, sort and score, read back and write, finalize) and the Parquet reads and writes inside
them, runs the job once and prints one line per function, in order of first start. Busy time can
exceed the span where read units overlap (--io-threads).

Memory: a thread samples the process's resident set (/proc/self/statm) and Arrow's pool (bytes
allocated) every 10 ms; each line also gives the largest resident set seen during its span, and
the last lines the peak (and what Arrow's pool, the unit cache and file-backed pages held then);
with TIMELINE_DUMP=1 in the environment, the samples every 0.25 s.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the rescore command sets it (pipelines/cli.py)
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")  # likewise

from rescore.pipelines.cli import keep_freed_pages  # noqa: E402

keep_freed_pages()  # likewise

from rescore.pipelines.early import lean_imports, prefetch_from  # noqa: E402

PREFETCH = prefetch_from(sys.argv[1:])  # likewise: the first units decode during the imports (not timed below)
with lean_imports(sys.argv[1:]):  # likewise: a plain local run skips Beam's optional integrations and pandas
    from rescore.pipelines import cli, job  # noqa: E402,F401

if PREFETCH is not None:
    PREFETCH.imports_done()  # likewise

IMPORTED = time.perf_counter() - T0

# The step classes import torch: here, where the command imports it while it builds the job.
from rescore.transforms import finalize, read, score, unit_store, write  # noqa: E402
from rescore.transforms.files import parquet_out  # noqa: E402
from rescore.transforms.rows import output_rows  # noqa: E402

_events: list[tuple[str, float, float]] = []
_lock = threading.Lock()
_samples: list[tuple[float, int, int, int, int]] = []
"""(seconds, resident bytes, Arrow pool bytes, unit cache bytes, file-backed resident bytes) every SAMPLE_S."""
SAMPLE_S = 0.01
_PAGE = os.sysconf("SC_PAGE_SIZE")
_stores: list = []


def _sample(stop: threading.Event) -> None:
    import pyarrow as pa

    with open("/proc/self/statm", "rb") as statm:
        while not stop.wait(SAMPLE_S):
            statm.seek(0)
            fields = statm.read().split()
            resident, shared = int(fields[1]) * _PAGE, int(fields[2]) * _PAGE  # shared: file-backed pages
            held = sum(s.cache.held for s in list(_stores))
            _samples.append((time.perf_counter() - T0, resident, pa.total_allocated_bytes(), held, shared))


def _peak_in(start: float, end: float) -> int:
    return max((s[1] for s in _samples if start <= s[0] <= end), default=0)


def _keep_stores() -> None:
    inner = unit_store.UnitStore.__init__

    def init(self, *args, **kwargs):
        inner(self, *args, **kwargs)
        _stores.append(self)

    unit_store.UnitStore.__init__ = init


def _wrap(owner, name: str, label: str) -> None:
    inner = getattr(owner, name)

    @functools.wraps(inner)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            result = inner(*args, **kwargs)
            return list(result) if hasattr(result, "__next__") else result  # time a generator's work too
        finally:
            with _lock:
                _events.append((label, start - T0, time.perf_counter() - T0))

    setattr(owner, name, timed)


STEPS = [
    (read._ReadLight, "_work", "read+validate unit"),
    (unit_store, "read_unit", "  parquet read"),
    (read, "check_rows", "  check_rows"),
    (read, "light_rows", "  light_rows"),
    (score._PrepareBucket, "process", "sort+dedupe bucket"),
    (score._ScoreBucket, "process", "score bucket"),
    (write._WriteUnit, "_work", "read back+write unit"),
    (unit_store.UnitStore, "read_back", "  read back (cache/file)"),
    (output_rows, "score_columns", "  token broadcast"),
    (parquet_out, "write_table", "  parquet write"),
    (finalize._Finalize, "process", "finalize"),
]


def main(argv: list[str]) -> int:
    for owner, name, label in STEPS:
        _wrap(owner, name, label)
    _keep_stores()
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(stop,), daemon=True)
    sampler.start()
    code = cli.main(argv, prefetch=PREFETCH)
    total = time.perf_counter() - T0
    stop.set()
    sampler.join()
    mb = 1 << 20
    print(f"{'imports':24s} {0.0:6.2f} - {IMPORTED:6.2f} s  {'':29s}  peak RSS {_peak_in(0, IMPORTED) / mb:6.0f} MB")
    if PREFETCH is not None:
        print(f"{'prefetched units taken':24s} {PREFETCH.taken} of {PREFETCH.units}")
    spans: dict[str, list[float]] = {}
    for label, start, end in _events:
        span = spans.setdefault(label, [start, end, 0.0, 0])
        span[0], span[1] = min(span[0], start), max(span[1], end)
        span[2] += end - start
        span[3] += 1
    for label, (start, end, busy, calls) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        print(f"{label:24s} {start:6.2f} - {end:6.2f} s  busy {busy:6.2f} s  calls {calls:<4d}"
              f"  peak RSS {_peak_in(start, end) / mb:6.0f} MB")
    print(f"{'total (before exit)':24s} {total:6.2f} s")
    if os.environ.get("TIMELINE_DUMP"):
        last = -1.0
        for t, r, pool, held, shared in _samples:
            if t - last >= 0.25:
                last = t
                print(f"  {t:6.2f} rss {r/2**20:6.0f} anon {(r-shared)/2**20:6.0f} pool {pool/2**20:6.0f} cache {held/2**20:6.0f}")
    if _samples:
        at, resident, pool, held, shared = max(_samples, key=lambda s: s[1])
        print(f"{'peak RSS':24s} {resident / mb:6.0f} MB at {at:.2f} s: Arrow's pool {pool / mb:.0f} MB, "
              f"unit cache {held / mb:.0f} MB, file-backed {shared / mb:.0f} MB")
    return code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
