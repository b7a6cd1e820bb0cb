"""transforms/jemalloc.py: Arrow's jemalloc pool hands the freed pages it keeps back to the kernel
when the run asks (pyarrow's own release_unused() does nothing on that pool), and nothing breaks
where the pool, the platform or the library is another."""

import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest

from rescore.transforms import jemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROBE = """
import json, os, threading
import numpy as np
import pyarrow as pa
from rescore.transforms import jemalloc

pa.jemalloc_set_decay_ms(60000) if pa.default_memory_pool().backend_name == "jemalloc" else None

def resident():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") // (1 << 20)

def freed_then(release):
    # On a thread of its own: its arena is made after the decay was set (as a read thread's is)
    out = []

    def work():
        out.append(resident())
        buffers = [pa.allocate_buffer(1 << 20) for _ in range(256)]  # 256 MiB, every page touched
        for b in buffers:
            np.frombuffer(b, dtype=np.uint8, count=b.size)[:] = 1
        out.append(resident())
        del buffers
        out.append(resident())

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    done = release()
    return out[0], out[1], out[2], resident(), done

print(json.dumps({
    "backend": pa.default_memory_pool().backend_name,
    "purge": freed_then(jemalloc.purge),
    "release_unused": freed_then(lambda: pa.default_memory_pool().release_unused()),
}))
"""


def _probe(pool: str) -> dict:
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": pool, "PYTHONPATH": os.environ.get("PYTHONPATH", ROOT)}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _has_jemalloc() -> bool:
    try:
        pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowException):
        return False
    return sys.platform.startswith("linux")


@pytest.mark.skipif(not _has_jemalloc(), reason="needs pyarrow's jemalloc pool on Linux")
def test_purge_hands_back_what_the_pool_kept():
    got = _probe("jemalloc")
    assert got["backend"] == "jemalloc"
    base, held, freed, after, done = got["purge"]
    assert done is True  # jemalloc's own mallctl was found and checked
    assert held - base > 200  # the 256 MiB were written
    if freed - base < 40:
        pytest.skip(f"the pool kept only {freed - base} MiB of the freed buffers: nothing to show")
    assert after - base < 24, got  # what the pool kept is handed back
    base, held, freed, after, _ = got["release_unused"]
    if freed - base > 40 and freed - after > 0.8 * (freed - base):
        pytest.fail("pyarrow's release_unused() now hands jemalloc's pages back: transforms/jemalloc.py's "
                    "mallctl lookup is no longer needed (keep purge(), drop the lookup)")


def test_another_pool_is_left_to_pyarrow():
    got = _probe("system")
    assert got["backend"] == "system"
    assert got["purge"][4] is False  # no mallctl looked for: release_unused() only, and no crash


def test_the_symbol_lookup_reads_only_what_is_there(tmp_path):
    not_elf = tmp_path / "x.so"
    not_elf.write_bytes(b"not an ELF file" * 10)
    assert jemalloc.symbol_in_file(str(not_elf), jemalloc.SYMBOL) is None
    lib = jemalloc._libarrow()
    if lib is None or not _has_jemalloc():
        pytest.skip("needs pyarrow's libarrow with jemalloc on Linux")
    assert jemalloc.symbol_in_file(lib, b"no_such_function_in_libarrow") is None
    found = jemalloc.symbol_in_file(lib, jemalloc.SYMBOL)
    assert found is not None and found[0] > 0 and len(found[1]) == jemalloc._CHECKED_BYTES


def test_purges_asked_for_together_run_on_one_thread(monkeypatch):
    """purge_soon: the asking step goes on at once; requests made while a purge runs are served by
    one more purge that keeps only the arenas all of them keep."""
    calls = []
    monkeypatch.setattr(jemalloc, "purge", lambda keep=frozenset(): calls.append(keep) or True)
    for _ in range(5):
        jemalloc.purge_soon()
    jemalloc.wait_purged(timeout=10)
    assert 1 <= len(calls) <= 5 and all(keep == frozenset() for keep in calls)
    calls.clear()
    jemalloc.purge_soon(frozenset({1, 2}))
    jemalloc.purge_soon(frozenset({2, 3}))
    jemalloc.wait_purged(timeout=10)
    assert calls[-1] <= {2, 3} and (calls == [{2}] or calls == [{1, 2}, {2, 3}]), calls
    assert jemalloc._wanted == [0, None] and jemalloc._keep == [None]


@pytest.mark.skipif(not _has_jemalloc(), reason="needs pyarrow's jemalloc pool on Linux")
def test_a_thread_knows_its_arena():
    probe = (
        "import json, threading\n"
        "import pyarrow as pa\n"
        "from rescore.transforms import jemalloc\n"
        "b = pa.allocate_buffer(1 << 20)\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: (pa.allocate_buffer(1 << 20), seen.append(jemalloc.this_threads_arena())))\n"
        "t.start(); t.join()\n"
        "print(json.dumps([jemalloc.this_threads_arena(), seen[0]]))\n"
    )
    env = {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "jemalloc", "PYTHONPATH": os.environ.get("PYTHONPATH", ROOT)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    main, other = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(main, int) and isinstance(other, int) and main != other  # a thread's own arena
