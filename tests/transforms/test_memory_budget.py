"""transforms/memory.py and --memory-mb: one budget for what a process holds of its read units.

The plan fits units in flight, the unit cache and the read-ahead into the budget in that order
of need, never raises what the user set, and falls back to the least the run can use; the
run's steps take the plan's threads and the cache its sizes; the prefetch decodes only what its
share of the budget holds; the option is declared once (flag, YAML key, environment)."""

import pyarrow.parquet as pq
import pytest
from data import SCHEMA_INT_TASK, random_rows, write_parquet

from rescore.errors import ConfigError
from rescore.transforms import memory
from rescore.transforms.input_plan import planned_file_units
from rescore.transforms.unit_store import UnitStore, start_prefetch

MB = memory.MB


def test_the_plan_fits_units_in_flight_then_the_cache_then_the_read_ahead():
    def fitted(budget_mb, threads=4, cache=1536, ahead=256):
        p = memory.plan(budget_mb * MB, base=572 * MB, unit=160 * MB, threads=threads, cache=cache * MB, ahead=ahead * MB)
        return p.threads, p.cache // MB, p.ahead // MB, p.fits

    assert memory.LATER == 128 * MB
    # one unit in flight holds 3.5 x 160 = 560 MB beside the process's 572 + 128 MB (what it adds later)
    assert fitted(100_000) == (4, 1536, 256, True)  # room for everything: nothing lowered
    assert fitted(2048) == (2, 228, 0, True)  # 1348 MB: two units (1120), the rest cached, no read-ahead
    assert fitted(1600) == (1, 340, 0, True)  # 900 MB: one unit, 340 MB of cache
    assert fitted(1260) == (1, 0, 0, True)  # exactly one unit: no cache
    assert fitted(900) == (1, 0, 0, False)  # below one unit: the least the run can use, flagged
    assert fitted(2048, threads=1) == (1, 788, 0, True)  # one thread asked for: the rest cached
    assert fitted(2048, cache=0) == (2, 0, 0, True)  # a cache the user turned off stays off
    assert fitted(100_000, cache=10, ahead=0) == (4, 10, 0, True)  # never raised over the user's settings


def test_a_units_size_comes_from_its_footer(tmp_path):
    glob = write_parquet(random_rows(seed=1, batches=4), str(tmp_path / "in"), files=1, row_group_size=16,
                         schema=SCHEMA_INT_TASK)
    path = sorted(tmp_path.glob("in/*.parquet"))[0]
    units = planned_file_units(str(path), 32)
    meta = pq.ParquetFile(path).metadata
    first = sum(meta.row_group(g).total_byte_size for g in units[0].row_groups)
    assert memory.unit_bytes(units[0]) == units[0].size == first > 0  # the plan's figure
    from dataclasses import replace

    assert memory.unit_bytes(replace(units[0], size=0)) == first  # else read from the footer
    assert memory.largest_unit(units) == max(memory.unit_bytes(u) for u in units)
    assert glob


def test_the_prefetch_decodes_what_its_share_of_the_budget_holds(tmp_path):
    assert memory.prefetch_units(None, [10 * MB] * 8) == 8
    assert memory.prefetch_units(100, [10 * MB] * 8) == 1  # a quarter of 100 MB: one table of 15 MB
    assert memory.prefetch_units(200, [10 * MB] * 8) == 3
    assert memory.prefetch_units(1, [10 * MB] * 8) == 1  # at least the first unit
    assert memory.prefetch_units(1, []) == 0
    write_parquet(random_rows(seed=2, batches=8), str(tmp_path / "in"), files=1, row_group_size=8, schema=SCHEMA_INT_TASK)
    pattern = str(tmp_path / "in" / "*.parquet")
    everything = start_prefetch([pattern], shard_rows=8, threads=2)
    one = start_prefetch([pattern], shard_rows=8, threads=2, memory_mb=1e-6)
    try:
        assert (everything.units, one.units) == (8, 1)
    finally:
        everything.close()
        one.close()


def test_the_store_fits_its_cache_and_the_steps_threads_once_per_run(tmp_path, monkeypatch):
    write_parquet(random_rows(seed=3, batches=4), str(tmp_path / "in"), files=1, row_group_size=8, schema=SCHEMA_INT_TASK)
    path = str(sorted(tmp_path.glob("in/*.parquet"))[0])
    units = planned_file_units(path, 16)
    unit = memory.largest_unit(units)
    monkeypatch.setattr(memory, "process_base", lambda: 500 * MB)
    # room for two units in flight and one unit's worth of cache
    budget = (500 * MB + memory.LATER + 2 * int(unit * memory.UNIT_FACTOR) + unit) / MB
    store = UnitStore(cache_mb=64, read_ahead_mb=8, memory_mb=budget)
    assert store.fit(units, 4) == 2
    assert abs(store.cache.budget - unit) <= 1 and store.cache.ahead == 0
    monkeypatch.setattr(memory, "process_base", lambda: 0)  # later steps' setups: the same plan
    assert store.fit(units, 4) == 2 and store.fit(units, 1) == 1
    assert abs(store.cache.budget - unit) <= 1
    monkeypatch.setattr(memory, "container_limit", lambda: None)
    free = UnitStore(cache_mb=64, read_ahead_mb=8)  # no budget: the settings as given
    assert free.fit(units, 4) == 4 and (free.cache.budget, free.cache.ahead) == (64 * MB, 8 * MB)


def test_without_the_option_a_containers_limit_sets_the_budget(tmp_path, monkeypatch):
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    v2.write_text("max\n")  # cgroup v2 without a limit
    v1.write_text(f"{2048 * MB}\n")
    assert memory.container_limit((str(v2), str(tmp_path / "absent"))) is None
    assert memory.container_limit((str(v2), str(v1))) == 2048 * MB
    v1.write_text("9223372036854771712\n")  # cgroup v1 without a limit: above the machine's memory
    assert memory.container_limit((str(v1),)) is None
    monkeypatch.setattr(memory, "container_limit", lambda: 2048 * MB)
    assert memory.budget_mb(None) == 2048 * memory.CONTAINER_SHARE
    assert memory.budget_mb(900) == 900.0  # the option wins
    monkeypatch.setattr(memory, "container_limit", lambda: None)
    assert memory.budget_mb(None) is None


def test_the_option_is_declared_once(tmp_path, monkeypatch):
    from rescore.pipelines.config import parse_args
    from rescore.pipelines.early import plain_run
    from rescore.transforms.settings import step_settings

    base = ["--input", str(tmp_path / "x.parquet"), "--output", str(tmp_path / "o"), "--strategy", "grpo"]
    assert parse_args(base).memory_mb is None
    assert step_settings(parse_args([*base, "--memory-mb", "2048"])).memory_mb == 2048.0
    monkeypatch.setenv("RESCORE_MEMORY_MB", "1500")
    assert parse_args(base).memory_mb == 1500.0
    config = tmp_path / "run.yaml"
    config.write_text("memory_mb: 900\n")
    assert parse_args([*base, "--config", str(config)]).memory_mb == 900.0
    assert plain_run([*base, "--memory-mb", "900"]) is not None  # the prefetch still runs under a budget
    for bad in ("-1", "0"):
        with pytest.raises(ConfigError, match=rf"^--memory-mb must be a number of MB > 0, got {float(bad)}$"):
            parse_args([*base, "--memory-mb", bad])


def test_a_run_under_a_budget_below_one_unit_writes_the_same_files_with_one_unit_at_a_time(tmp_path, monkeypatch, caplog):
    """The run honours the plan: its steps take one unit at a time and the cache keeps nothing,
    it warns that the budget is below what one unit needs, and every file is the same."""
    from rescore.pipelines import job as rs
    from rescore.pipelines.config import parse_args

    glob = write_parquet(random_rows(seed=5, batches=3), str(tmp_path / "in"), files=2, row_group_size=8,
                         schema=SCHEMA_INT_TASK)
    fitted = []
    real_fit = UnitStore.fit

    def fit(self, units, threads):
        fitted.append(real_fit(self, units, threads))
        return fitted[-1]

    monkeypatch.setattr(UnitStore, "fit", fit)
    monkeypatch.setattr(memory, "container_limit", lambda: None)  # the free run has no budget, in a container too

    def run(out, *extra):
        cfg = parse_args(["--input", glob, "--output", str(tmp_path / out), "--strategy", "grpo", "--quiet",
                          "--io-threads", "2", "--shard-rows", "8", *extra])
        p, plan, info, handle = rs.build_job(cfg)
        try:
            rs._run_built(cfg, p, plan, info, handle)
            return handle.store
        finally:
            handle.close()

    free = run("free", "--unit-cache-mb", "64")
    assert len(fitted) >= 2 and set(fitted) == {2} and free.cache.stats.kept > 0 and free.memory is None  # read and write
    fitted.clear()
    with caplog.at_level("WARNING", logger="rescore"):
        tight = run("tight", "--unit-cache-mb", "64", "--memory-mb", "1")
    assert len(fitted) >= 2 and set(fitted) == {1} and tight.cache.budget == 0 and tight.cache.stats.kept == 0
    assert tight.memory is not None and not tight.memory.fits
    assert any("is below what this process needs for one read unit" in r.getMessage() for r in caplog.records)
    names = sorted(p.name for p in (tmp_path / "free").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "tight").iterdir()) and any(n.startswith("scored") for n in names)
    for name in names:
        if name.endswith(".parquet"):
            assert (tmp_path / "free" / name).read_bytes() == (tmp_path / "tight" / name).read_bytes(), name


def test_wide_rows_make_smaller_read_units_by_the_footer(tmp_path, monkeypatch):
    """A read unit holds at most UNIT_BYTES by its file's footer: rows of long responses make
    more, smaller units (the input decides, never the machine); narrow rows keep --shard-rows."""
    from rescore.transforms import input_plan

    assert input_plan.unit_rows(65536, 204_800, 204_800 * 1967) == 65536  # the benchmark's 256-token rows
    assert input_plan.unit_rows(65536, 24_576, 24_576 * 26_540) == input_plan.UNIT_BYTES // 26_540  # 4k-token rows
    assert input_plan.unit_rows(65536, 10, 10 << 40) == input_plan.UNIT_MIN_ROWS == 1024  # huge rows: not one unit per row
    assert input_plan.unit_rows(8, 10, 10 << 40) == 8 and input_plan.unit_rows(8, 0, 0) == 8
    write_parquet(random_rows(seed=6, batches=4), str(tmp_path / "in"), files=1, row_group_size=16, schema=SCHEMA_INT_TASK)
    path = str(sorted(tmp_path.glob("in/*.parquet"))[0])
    meta = pq.ParquetFile(path).metadata
    per_row = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups)) / meta.num_rows
    assert [u.num_rows for u in planned_file_units(path, 1 << 16)] == [meta.num_rows]
    monkeypatch.setattr(input_plan, "UNIT_BYTES", int(per_row * 8.5))  # eight rows' worth
    monkeypatch.setattr(input_plan, "UNIT_MIN_ROWS", 1)
    units = planned_file_units(path, 1 << 16)
    assert max(u.num_rows for u in units) == 8 and units[0].rows == (0, 8) and sum(u.num_rows for u in units) == meta.num_rows
    assert [(u.num_rows, u.rows) for u in input_plan.plan_input([path]).units] == [(u.num_rows, u.rows) for u in units]


def _mapping_rss_kb(start: int) -> int:
    """The resident kB of this process's mapping that starts at `start` (/proc/self/smaps)."""
    found = False
    for line in open("/proc/self/smaps"):
        head = line.split()
        if not head[0].endswith(":"):
            found = int(head[0].split("-")[0], 16) == start
        elif found and head[0] == "Rss:":
            return int(head[1])
    raise AssertionError("no such mapping")


def test_gpu_library_pages_leave_the_resident_set_and_read_back_unchanged(tmp_path, monkeypatch):
    """A CPU run drops the pages torch's CUDA libraries hold (transforms/device.py): only read-only
    mappings of those libraries with no page of their own; what is touched again reads the file."""
    import ctypes
    import mmap

    if not open("/proc/self/smaps").readline():
        pytest.skip("no /proc/self/smaps")
    pages = 64
    data = bytes(range(256)) * (pages * mmap.PAGESIZE // 256)
    gpu = tmp_path / "nvidia" / "cublas" / "lib" / "libcublasLt.so.13"  # as a CUDA build of torch installs it
    gpu.parent.mkdir(parents=True)
    gpu.write_bytes(data)
    other = tmp_path / "libtorch_cpu.so"  # a library the CPU math runs in: kept
    other.write_bytes(data)
    copied = tmp_path / "nvidia" / "cudnn" / "libcudnn.so.9"  # a CUDA library's page the process wrote: kept
    copied.parent.mkdir(parents=True)
    copied.write_bytes(data)
    maps = []
    for path, access in ((gpu, mmap.ACCESS_READ), (other, mmap.ACCESS_READ), (copied, mmap.ACCESS_COPY)):
        with open(path, "r+b") as f:
            maps.append(mmap.mmap(f.fileno(), 0, access=access))
    maps[2][0] = 7  # copy-on-write: a page of the process's own
    for m in maps:
        sum(m[k * mmap.PAGESIZE] for k in range(pages))  # touch every page
    starts = {}
    for line in open("/proc/self/smaps"):
        head = line.split()
        if not head[0].endswith(":") and len(head) > 5:
            starts.setdefault(head[5], int(head[0].split("-")[0], 16))
    starts = [starts[str(gpu)], starts[str(other)], starts[str(copied)]]
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    assert libc.mprotect(starts[2], len(data), 1) == 0  # read-only now, as a library's relocated data is
    before = [_mapping_rss_kb(s) for s in starts]
    assert before == [pages * mmap.PAGESIZE // 1024] * 3

    monkeypatch.setattr(memory, "_released", False)
    dropped = memory.release_gpu_library_pages()
    assert dropped >= before[0] * 1024  # this file's pages (and those of any CUDA library torch loaded)
    assert [_mapping_rss_kb(s) for s in starts] == [0, before[1], before[2]]
    assert maps[0][:] == data and maps[1][:] == data  # touched again: the file's bytes
    assert maps[2][0] == 7 and maps[2][1:] == data[1:]  # the page the process wrote is its own still
    assert memory.release_gpu_library_pages() == 0  # once per process
    for m in maps:
        m.close()


def test_the_pages_are_dropped_only_where_the_math_runs_on_the_cpu(monkeypatch):
    """device.release_gpu_pages: cpu, or auto without a GPU; never where this process works on a
    GPU already, nor before torch is imported (a stand-in torch here: no import of the real one)."""
    import sys
    import types

    from rescore.transforms import device

    calls = []
    monkeypatch.setattr(memory, "release_gpu_library_pages", lambda: calls.append(1) or 0)
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    device.release_gpu_pages("cpu")
    assert calls == []  # torch not imported: the step that resolves the device drops them
    state = {"available": False, "initialized": False}
    cuda = types.SimpleNamespace(is_available=lambda: state["available"], is_initialized=lambda: state["initialized"])
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))

    def dropped(choice):
        calls.clear()
        device.release_gpu_pages(choice)
        return bool(calls)

    assert (dropped("cpu"), dropped("auto"), dropped("cuda")) == (True, True, False)
    state["available"] = True  # a GPU: auto takes it
    assert (dropped("cpu"), dropped("auto"), dropped("cuda")) == (True, False, False)
    state["initialized"] = True  # the model stage works on it already
    assert (dropped("cpu"), dropped("auto"), dropped("cuda")) == (False, False, False)
