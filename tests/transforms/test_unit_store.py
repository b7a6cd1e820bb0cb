"""transforms/unit_store.py: one UnitStoreHandle per run reaches the steps (Beam's Shared idiom):
in the launcher's process every copy of it acquires the launcher's store; another process builds
its own from the run's settings (and switches to Arrow's jemalloc pool); the handle carries no
tables; runs never share a store; the finalize step's document reaches the launcher through it,
not by reading metrics.json back."""

import json
import os
import pickle
import subprocess
import sys

import pyarrow as pa
import pytest
from data import SCHEMA_INT_TASK, random_rows, write_parquet

from rescore.transforms.unit_store import UnitStore, UnitStoreHandle
from rescore.transforms.settings import StepSettings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_pickled_handle_acquires_the_launchers_store_and_carries_no_tables():
    handle = UnitStoreHandle(cache_mb=64)
    store = handle.store
    store.cache.offer("unit", pa.table({"x": pa.array(range(100_000), pa.int64())}), partial=False)
    assert store.cache.held == 800_000
    blob = pickle.dumps(handle)
    assert len(blob) < 2_000  # the Shared key and the settings, never the cached tables
    copy = pickle.loads(blob)
    assert copy.store is None and copy.acquire() is store  # a step in this process: the one store
    handle.close()
    assert store.cache.held == 0


@pytest.mark.slow  # a Python process that imports Beam: ~12 s on the shared 2-core machine
def test_another_process_builds_its_own_store_from_the_runs_settings():
    handle = UnitStoreHandle(cache_mb=3, read_ahead_mb=1)
    handle.store.published = ({"launcher": True}, "metrics.json")
    probe = (
        "import pickle, sys, json, pyarrow\n"
        "copy = pickle.loads(sys.stdin.buffer.read())\n"
        "pool = pyarrow.default_memory_pool().backend_name\n"
        "store = copy.acquire()\n"
        "print(json.dumps([store.cache.budget, store.cache.ahead, store.published, copy.acquire() is store,\n"
        "                  pool, pyarrow.default_memory_pool().backend_name]))\n"
    )
    # a worker of another runner, started by Beam's boot: no pool chosen (the `rescore` command's is not)
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])
    proc = subprocess.run([sys.executable, "-c", probe], input=pickle.dumps(handle), capture_output=True, cwd=ROOT,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    # the worker's store switches Arrow to jemalloc, keeping freed pages (unit_store.keep_freed_pages)
    *got, before, after = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    assert got == [3 << 20, 1 << 20, None, True]
    assert (before, after) == ("mimalloc", "jemalloc")  # pyarrow's default on Linux, then the worker's
    handle.close()


def test_each_run_has_a_store_of_its_own():
    first, second = UnitStoreHandle(cache_mb=1), UnitStoreHandle(cache_mb=2)
    assert first.store is not second.store
    assert pickle.loads(pickle.dumps(first)).acquire() is first.store
    assert pickle.loads(pickle.dumps(second)).acquire() is second.store
    second.store.cache.offer("u", pa.table({"x": [1, 2, 3]}), partial=False)
    first.close()
    assert second.store.cache.held > 0  # closing one run's store leaves another's alone
    second.close()
    assert UnitStore(cache_mb=0).cache.budget == 0


def test_the_launcher_takes_the_finalize_steps_document_without_reading_metrics_back(tmp_path, monkeypatch):
    from rescore.pipelines import job as rs
    from rescore.pipelines.config import parse_args

    glob = write_parquet(random_rows(seed=4, batches=3), str(tmp_path / "in"), files=1, row_group_size=8,
                         schema=SCHEMA_INT_TASK)
    out = str(tmp_path / "out")
    cfg = parse_args(["--input", glob, "--output", out, "--strategy", "grpo", "--quiet"])

    def read_back(output):
        raise AssertionError("the in-process launcher read metrics.json back")

    monkeypatch.setattr(rs, "_published_file", read_back)
    p, plan, info, handle = rs.build_job(cfg)
    try:
        doc = rs._run_built(cfg, p, plan, info, handle)
    finally:
        handle.close()
    published, where = handle.published()
    assert where == os.path.join(out, "metrics.json")
    with open(where) as f:
        assert doc == published == json.load(f)  # the document exactly as the file holds it
    assert doc["totals"]["rows_read"] == plan.num_rows > 0


def test_read_back_where_the_finalize_step_ran_elsewhere(tmp_path):
    from rescore.pipelines.job import _published_file

    out = tmp_path / "out"
    assert _published_file(str(out)) == ({}, str(out / "metrics.json"))
    out.mkdir()
    (out / "metrics.json").write_text('{"totals": {}}\n')
    assert _published_file(str(out)) == ({"totals": {}}, str(out / "metrics.json"))
    (out / "_failed").mkdir()
    (out / "_failed" / "metrics.json").write_text('{"failed": "too many rejected rows"}\n')
    assert _published_file(str(out)) == ({"failed": "too many rejected rows"}, str(out / "_failed" / "metrics.json"))


@pytest.mark.parametrize("cache_mb", [0, 0.001])
def test_a_step_without_the_runs_handle_keeps_nothing(cache_mb):
    """A shell used alone (no handle given) gets a store of its own with no cache: nothing is
    kept for a write step that would never take it."""
    from rescore.transforms.read import ReadExperiences
    from rescore.transforms.input_plan import InputPlan

    plan = InputPlan((), (), pa.schema([]), pa.int64(), ())
    step = ReadExperiences(plan, StepSettings(buckets=1), needs=())
    assert step._unit_store.store.cache.budget == 0
    assert UnitStore(cache_mb=cache_mb).cache.budget == int(cache_mb * (1 << 20))

