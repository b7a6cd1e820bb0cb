"""files/unit_cache.py (in a run's UnitStore, transforms/unit_store.py): the write step takes the
table the first read decoded instead of reading the unit again, within a byte budget, only after
the same fingerprint check a read makes; the output is the same with the cache on or off and
with any --io-threads."""

import os
import threading
import time
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data import SCHEMA_INT_TASK, random_rows, write_parquet

from rescore.transforms import fault_injection
from rescore.transforms.files import fingerprint as fingerprints
from rescore.transforms.files import unit_cache
from rescore.transforms.files.unit_cache import UnitCache
from rescore.transforms.input_plan import plan_input
from rescore.transforms.unit_read import read_unit
from rescore.transforms.unit_store import UnitStore

LIGHT = ["batch", "task", "run", "step", "reward", "tokens", "prompt_length", "logprobs", "action_mask"]
MB = 1 << 20


def run_with(glob: str, out: str, *args: str, cache_bytes: int | None = None, ahead_bytes: int | None = None,
             before_run=None) -> tuple[UnitStore, int]:
    """A whole in-process run with the unit_cache_mb / read_ahead_mb settings of these sizes:
    (the run's UnitStore, the bytes its cache still held when the run ended, before its close)."""
    from rescore.pipelines import job as rs
    from rescore.pipelines.config import parse_args

    cfg = parse_args(["--input", glob, "--output", out, "--strategy", "grpo", *args, "--quiet"])
    cfg = replace(cfg, unit_cache_mb=None if cache_bytes is None else cache_bytes / MB,
                  read_ahead_mb=None if ahead_bytes is None else ahead_bytes / MB)
    p, plan, info, handle = rs.build_job(cfg)
    try:
        if before_run is not None:
            before_run(handle.store)
        rs._run_built(cfg, p, plan, info, handle)
        return handle.store, handle.store.cache.held
    finally:
        handle.close()


def table_of(rows: int) -> pa.Table:
    return pa.table({"x": pa.array(range(rows), pa.int64())})  # 8 bytes a row


def test_offer_keeps_what_fits_and_take_hands_it_over_once():
    cache = UnitCache(budget=8 * 100)
    a, b, c = table_of(60), table_of(40), table_of(1)
    assert cache.offer("a", a) and cache.offer("b", b)
    assert cache.held == 800
    assert not cache.offer("c", c)  # full: nothing is evicted for a later unit
    assert cache.take("b") is b and cache.held == 480
    assert cache.take("b") is None  # taken once
    assert cache.offer("c", c) and cache.take("c") is c
    assert cache.take("a") is a and cache.held == 0
    assert (cache.stats.offered, cache.stats.kept, cache.stats.hits, cache.stats.misses) == (4, 3, 3, 1)


def test_a_table_larger_than_the_budget_and_a_zero_budget_keep_nothing():
    assert not UnitCache(budget=79).offer("a", table_of(10))
    assert not UnitCache(budget=0).offer("a", table_of(1))
    assert UnitCache(budget=80).offer("a", table_of(10))


def test_the_budget_follows_the_setting_and_ignores_the_old_environment_variable(monkeypatch):
    monkeypatch.setenv("RESCORE_UNIT_CACHE_MB", "7")  # no longer read: the run setting unit_cache_mb is
    assert unit_cache.budget_bytes(0) == 0 and UnitStore(0).cache.budget == 0
    assert unit_cache.budget_bytes(1.5) == 3 << 19 and UnitStore(1.5).cache.budget == 3 << 19
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert unit_cache.budget_bytes(None) == int(min(unit_cache.DEFAULT_CAP, memory / 8)) == UnitStore().cache.budget
    assert unit_cache.DEFAULT_CAP == 3 << 30  # 3 GiB: docs/runners.md says so


@pytest.fixture
def unit(tmp_path):
    glob = write_parquet(random_rows(seed=3), str(tmp_path / "in"), files=1, row_group_size=10)
    plan = plan_input([glob])
    return plan.units[0]


def counting(store: UnitStore, calls: list) -> UnitStore:
    """`store`, its reads of units recorded in `calls` (the columns asked for)."""
    read = store.read

    def counted(unit, columns=None):
        calls.append(columns)
        return read(unit, columns)

    store.read = counted
    return store


def test_read_back_serves_the_first_read_and_reads_only_what_it_lacks(unit):
    calls = []
    store = counting(UnitStore(), calls)
    full = read_unit(unit)
    store.offer(unit, read_unit(unit))
    back = store.read_back(unit)
    assert calls == [] and back.equals(full)  # a hit: no read at all

    store.offer(unit, read_unit(unit, LIGHT))  # the light read leaves out "note"
    back = store.read_back(unit)
    assert calls == [["note"]]
    assert back.select(full.column_names).equals(full)

    assert store.read_back(unit).equals(full)  # taken: read again
    assert calls[-1] is None
    assert store.cache.stats.hits == 2 and store.cache.stats.misses == 1


def test_a_unit_without_a_fingerprint_is_never_kept(unit):
    bare = replace(unit, fingerprint=None)
    store = UnitStore()
    store.offer(bare, read_unit(bare))
    assert store.cache.held == 0


def rewrite(path: str) -> None:
    """Same rows, same row count, rewards reversed (as in tests/pipelines/test_inputs_changed_mid_run.py)."""
    table = pq.read_table(path)
    reward = pa.array(table["reward"].to_pylist()[::-1])
    pq.write_table(table.set_column(table.schema.get_field_index("reward"), "reward", reward), path, row_group_size=10)


def test_a_file_rewritten_between_the_reads_fails_as_a_read_would(unit):
    store = UnitStore()
    store.offer(unit, read_unit(unit, LIGHT))
    rewrite(unit.path)
    with pytest.raises(fingerprints.InputChanged) as hit:
        store.read_back(unit)
    assert store.cache.stats.hits == 1  # it was the cached table that was refused
    with pytest.raises(fingerprints.InputChanged) as read:
        read_unit(unit)
    assert str(hit.value) == str(read.value) and "changed while the run was reading it" in str(hit.value)


def test_a_touched_file_is_refused_too(unit):
    store = UnitStore()
    store.offer(unit, read_unit(unit))
    os.utime(unit.path, ns=(1, 1))
    with pytest.raises(fingerprints.InputChanged):
        store.read_back(unit)


def scored_files(out: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(out).glob("*.parquet"))}


@pytest.mark.slow
def test_output_is_byte_identical_with_the_cache_on_or_off_and_any_io_threads(tmp_path):
    rows = random_rows(seed=8, batches=5)
    glob = write_parquet(rows, str(tmp_path / "in"), files=3, row_group_size=6, schema=SCHEMA_INT_TASK)
    outputs = {}
    for budget, threads in ((0, 1), (None, 1), (None, 2), (None, 4), (0, 4)):
        out = str(tmp_path / f"out-{budget}-{threads}")
        store, held = run_with(glob, out, "--io-threads", str(threads), "--shard-rows", "20", cache_bytes=budget)
        outputs[(budget, threads)] = scored_files(out)
        if budget is None:
            assert store.cache.stats.hits == store.cache.stats.kept > 3 and held == 0  # every unit taken back
        else:
            assert store.cache.stats.hits == 0
    first = outputs[(0, 1)]
    assert len(first) > 3
    assert all(files == first for files in outputs.values())


def unit_table(rows: int, seed: int = 0) -> pa.Table:
    """A read unit's shape: scalars, an int8 mask and int32 tokens per row."""
    return pa.table({
        "tokens": pa.array([[seed + i] * 8 for i in range(rows)], pa.list_(pa.int32())),
        "reward": pa.array([float(i) for i in range(rows)]),
        "action_mask": pa.array([[1] * 8 for _ in range(rows)], pa.list_(pa.int8())),
    })


def test_columns_cheap_to_hold_are_kept_for_every_unit_whole_units_on_top():
    tables = [unit_table(100, seed=k) for k in range(4)]
    tier = tables[0].select(["reward", "action_mask"]).nbytes  # scalars, then the narrowest list values
    whole = tables[0].nbytes
    cache = UnitCache(budget=whole + 4 * tier)
    cache.expect("run", 400)
    kept = [cache.offer(k, t) for k, t in enumerate(tables)]
    assert kept == [True] * 4
    assert cache.take(0).column_names == tables[0].column_names  # the first unit whole
    for k in (1, 2, 3):  # the rest as the columns that cost most to decode for their size
        assert cache.take(k).column_names == ["reward", "action_mask"]
    assert (cache.stats.partial, cache.held) == (3, 0)


def test_the_reserve_keeps_room_for_later_units_and_a_new_plan_starts_afresh():
    tables = [unit_table(100, seed=k) for k in range(4)]
    tier = tables[0].select(["reward", "action_mask"]).nbytes
    cache = UnitCache(budget=4 * tier)  # the cheap columns of every unit, no room for a whole one
    assert tables[0].nbytes < 4 * tier  # a whole unit alone would fit: the reserve is what refuses it
    for plan in ("run", "next run"):
        cache.expect(plan, 400)
        cache.expect(plan, 400)  # the same plan again (another DoFn instance): nothing changes
        assert all(cache.offer((plan, k), t) for k, t in enumerate(tables))
        assert [cache.take((plan, k)).column_names for k in range(4)] == [["reward", "action_mask"]] * 4
    assert cache.stats.partial == 8 and cache.held == 0
    # Without a plan the first unit decides the columns, and a unit is kept whole where it fits.
    bare = UnitCache(budget=4 * tier)
    assert bare.offer("a", tables[0]) and bare.take("a").column_names == tables[0].column_names


def resume_after_read_ahead(pause, cache) -> None:
    """Once the write step has paused before its first read back, let the read-ahead finish, then resume."""
    until(lambda: (pause / "paused").exists(), timeout=60)
    cache.join_ahead(10)
    (pause / "resume").touch()


@pytest.mark.slow
def test_output_is_byte_identical_when_units_are_kept_as_some_of_their_columns(tmp_path, monkeypatch):
    rows = random_rows(seed=9, batches=5)
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=6, schema=SCHEMA_INT_TASK)
    plan = plan_input([glob], shard_rows=20)
    first = read_unit(plan.units[0], LIGHT)
    per_row = first.select(["batch", "task", "run", "step", "reward", "prompt_length", "action_mask"]).nbytes / first.num_rows
    budget = first.nbytes + int(per_row * plan.num_rows) + 64  # first unit whole, the others in part
    outputs = {}
    for name, size, ahead in (("off", 0, 0), ("part", budget, 0), ("ahead", budget, 1000 * MB)):
        release = None
        if name == "ahead":  # the write step waits until the read-ahead is done: no race to the first take
            pause = tmp_path / "pause"
            pause.mkdir()
            monkeypatch.setenv(fault_injection.ENV, f"pause_readback:{pause}")
            fault_injection.refresh()

            def before_run(store):
                nonlocal release
                release = threading.Thread(target=resume_after_read_ahead, args=(pause, store.cache))
                release.start()
        out = str(tmp_path / name)
        store, held = run_with(glob, out, "--io-threads", "1", "--shard-rows", "20", cache_bytes=size, ahead_bytes=ahead,
                               before_run=before_run if name == "ahead" else None)
        cache = store.cache
        if name == "ahead":
            release.join(10)
            monkeypatch.delenv(fault_injection.ENV)
            fault_injection.refresh()  # disarmed for whatever runs next in this process
        outputs[name] = scored_files(out)
        if size:
            assert cache.stats.partial > 0 and cache.stats.kept > cache.stats.partial
            assert cache.stats.hits == cache.stats.kept and held == 0
            # Read ahead: every partial entry completed before the write step began (or none).
            assert cache.stats.ahead == (cache.stats.partial if name == "ahead" else 0)
    assert len(plan.units) > 3 and len(outputs["off"]) > 3
    assert outputs["part"] == outputs["off"] and outputs["ahead"] == outputs["off"]


def completing(calls, tables, gate=None, fail=()):
    """A `complete` for entry k: the whole table k (what with_columns would build), counted;
    waits for `gate` first where given, and raises for the entries in `fail`."""
    def complete_for(k):
        def complete(part):
            calls.append(k)
            if gate is not None:
                gate.wait(10)
            if k in fail:
                raise OSError(f"unit {k}: the disk went away")
            assert part.column_names == ["reward", "action_mask"]
            return tables[k]
        return complete
    return complete_for


def partial_cache(tables, ahead, **kw):
    """A cache that keeps every unit in part (no room for a whole one), read-ahead `ahead`."""
    tier = tables[0].select(["reward", "action_mask"]).nbytes
    cache = UnitCache(budget=len(tables) * tier, ahead=ahead)
    cache.expect("run", sum(t.num_rows for t in tables))
    return cache


def test_read_ahead_completes_partial_entries_in_unit_order_once_every_unit_is_offered():
    tables = [unit_table(100, seed=k) for k in range(4)]
    lacks = tables[0].nbytes - tables[0].select(["reward", "action_mask"]).nbytes
    cache = partial_cache(tables, ahead=2 * lacks)  # room over the budget for two completions
    calls = []
    complete_for = completing(calls, tables)
    for k in (2, 0, 3, 1):  # offered out of order, as read threads finish
        assert cache.offer(k, tables[k], order=k, complete=complete_for(k))
        if k != 1:
            assert calls == []  # not before the last unit is offered: the read step is not over
    cache.join_ahead(10)
    assert calls == [0, 1]  # in unit order, as far as budget + ahead allows
    assert cache.held == sum(t.nbytes for t in tables[:2]) + 2 * tables[0].select(["reward", "action_mask"]).nbytes
    assert cache.held <= cache.budget + cache.ahead
    assert [cache.take(k).equals(tables[k]) for k in (0, 1)] == [True, True]  # whole, no read
    assert [cache.take(k).column_names for k in (2, 3)] == [["reward", "action_mask"]] * 2  # the rest as kept
    assert (cache.stats.ahead, cache.stats.waits, cache.held) == (2, 0, 0)


def until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_read_ahead_stops_at_the_first_take_and_a_take_waits_for_the_read_in_flight():
    tables = [unit_table(100, seed=k) for k in range(4)]
    cache = partial_cache(tables, ahead=10 * tables[0].nbytes)  # room for all of them
    calls, gate = [], threading.Event()
    complete_for = completing(calls, tables, gate=gate)
    for k in range(4):
        cache.offer(k, tables[k], order=k, complete=complete_for(k))
    until(lambda: calls == [0])  # the first completion is in flight
    taken = []
    writer = threading.Thread(target=lambda: taken.append(cache.take(0)))
    writer.start()
    until(lambda: cache.stats.waits == 1)  # the take waits for the read in flight...
    assert taken == []  # ...instead of reading the unit itself
    gate.set()
    writer.join(10)
    cache.join_ahead(10)
    assert taken[0].equals(tables[0]) and cache.stats.waits == 1
    assert calls == [0]  # the write step began: nothing more is read ahead
    assert cache.take(1).column_names == ["reward", "action_mask"] and cache.stats.ahead == 1


def test_a_failed_read_ahead_leaves_the_entry_as_it_was_and_zero_turns_it_off():
    tables = [unit_table(100, seed=k) for k in range(3)]
    cache = partial_cache(tables, ahead=10 * tables[0].nbytes)
    calls = []
    complete_for = completing(calls, tables, fail=(0,))
    for k in range(3):
        cache.offer(k, tables[k], order=k, complete=complete_for(k))
    cache.join_ahead(10)
    assert calls == [0, 1, 2] and cache.stats.ahead == 2
    assert cache.take(0).column_names == ["reward", "action_mask"]  # the write step reads it itself
    assert cache.take(1).equals(tables[1]) and cache.take(2).equals(tables[2])

    off = partial_cache(tables, ahead=0)
    calls.clear()
    for k in range(3):
        off.offer(k, tables[k], order=k, complete=complete_for(k))
    off.join_ahead(10)
    assert calls == [] and off.stats.ahead == 0


def test_the_read_ahead_follows_its_setting(monkeypatch):
    monkeypatch.setenv("RESCORE_READ_AHEAD_MB", "5")  # no longer read: the run setting read_ahead_mb is
    assert UnitCache(budget=6 << 28).ahead == 1 << 28  # a sixth of the budget: docs/runners.md says so
    assert UnitStore(6 << 8).cache.ahead == 1 << 28
    assert UnitStore(1 << 10, 0).cache.ahead == 0
    assert UnitStore(1 << 10, 2).cache.ahead == 2 << 20


def light_unit_store(unit, ahead: int) -> UnitStore:
    """A store with room for the first read of `unit` in part only (its scalars)."""
    first = read_unit(unit, LIGHT)
    scalars = first.select(["batch", "task", "run", "step", "reward", "prompt_length"]).nbytes
    store = UnitStore((scalars + 8) / MB, ahead / MB)
    store.cache.expect("run", unit.num_rows)
    return store


def test_read_ahead_reads_what_the_first_read_had_and_the_write_step_the_rest(unit):
    store = light_unit_store(unit, ahead=1 << 30)
    cache = store.cache
    first = read_unit(unit, LIGHT)  # the first read leaves out the "note" column
    store.offer(unit, first)
    cache.join_ahead(10)
    assert cache.stats.partial == 1 and cache.stats.ahead == 1
    held = cache._entries[unit_cache.unit_key(unit)]
    assert sorted(held.column_names) == sorted(first.column_names)  # no more than it had
    assert cache.held == held.nbytes <= cache.budget + cache.ahead
    calls = []
    back = counting(store, calls).read_back(unit)
    assert calls == [["note"]]  # the write step reads only what the first read left out
    full = read_unit(unit)
    assert back.select(full.column_names).equals(full)


def test_read_ahead_stays_within_budget_and_ahead(unit):
    first = read_unit(unit, LIGHT)
    store = light_unit_store(unit, ahead=1)  # too little room for any completion
    cache = store.cache
    store.offer(unit, first)
    cache.join_ahead(10)
    assert cache.stats.partial == 1 and cache.stats.ahead == 0 and cache.held <= cache.budget


def test_read_back_of_a_unit_read_ahead_checks_the_file_as_a_read_would(unit):
    store = light_unit_store(unit, ahead=1 << 30)
    cache = store.cache
    store.offer(unit, read_unit(unit, LIGHT))
    cache.join_ahead(10)
    assert cache.stats.partial == 1 and cache.stats.ahead == 1
    rewrite(unit.path)
    with pytest.raises(fingerprints.InputChanged):
        store.read_back(unit)
