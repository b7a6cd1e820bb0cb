"""The first read units decode before the command imports Beam and torch (pipelines/early.py,
transforms/unit_store.py: Prefetch), handed to the run, which puts it in its UnitStore: only for
a plain local run, never changing the output, and never taking a unit whose file changed after
it was decoded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data import SCHEMA_INT_TASK, random_rows, write_parquet

from rescore.pipelines.early import plain_run, prefetch_from
from rescore.transforms import input_plan, unit_store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
    "argv",
    [
        ["--input", "in/*.parquet", "--output", "out"],
        ["--input=in", "--output=out", "--strategy", "grpo", "--set", "epsilon=0.1", "--overwrite", "--quiet"],
        ["--input", "a", "--input", "b", "--output", "out", "--io_threads", "2", "--shard-rows", "100"],
    ],
)
def test_plain_runs_qualify(argv):
    assert plain_run(argv).input


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["--help"],
        ["sample", "--output", "x"],
        ["--input", "in", "--output", "out", "--config", "run.yaml"],  # a config may name other inputs
        ["--input", "in", "--output", "out", "--runner", "DataflowRunner"],  # any Beam option
        ["--input", "in", "--output", "out", "--direct_running_mode=multi_processing"],
        ["--input", "in", "--output", "out", "--incremental"],
        ["--input", "in", "--output", "out", "--teacher-model", "m"],
        ["--input", "sqlite:///b.db", "--output", "out", "--input-table", "buffer"],
        ["--input", "in", "--output"],  # a value missing
        ["--output", "out"],
    ],
)
def test_anything_else_is_not_prefetched(argv):
    assert plain_run(argv) is None


def test_nothing_is_started_for_remote_or_missing_input(tmp_path):
    for pattern in ("gs://bucket/x/*.parquet", str(tmp_path / "none-*.parquet")):
        assert prefetch_from(["--input", pattern, "--output", str(tmp_path / "out")]) is None


def _input(tmp_path) -> str:
    rows = random_rows(seed=21, batches=6)
    return write_parquet(rows, str(tmp_path / "in"), files=2, row_group_size=5, schema=SCHEMA_INT_TASK)


def _scored(out: str) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(Path(out).glob("*.parquet"))}


def _run(glob: str, out: str, *, prefetch: bool) -> tuple[dict[str, bytes], unit_store.Prefetch | None]:
    from rescore.pipelines.cli import run

    argv = ["--input", glob, "--output", out, "--strategy", "grpo", "--shard-rows", "15", "--io-threads", "2", "--quiet"]
    early = prefetch_from(argv) if prefetch else None
    assert (early is not None) is prefetch
    run(argv, prefetch=early)
    return _scored(out), early


def test_the_read_step_takes_the_prefetched_units_and_the_output_is_the_same(tmp_path):
    glob = _input(tmp_path)
    plain, _ = _run(glob, str(tmp_path / "plain"), prefetch=False)
    early, prefetch = _run(glob, str(tmp_path / "early"), prefetch=True)
    first = sorted(Path(glob).parent.glob("*.parquet"))[0]
    units = len(input_plan.planned_file_units(str(first), 15))
    assert units >= 4
    # up to PREFETCH_UNITS_PER_THREAD per read thread; one not started is read by the step
    assert prefetch.units == min(units, 2 * unit_store.PREFETCH_UNITS_PER_THREAD) and prefetch.taken >= 1
    assert len(plain) > 4 and early == plain
    assert not prefetch._futures and prefetch.slices.open() == 0  # the run's end closed it


@pytest.mark.slow
def test_a_file_rewritten_after_the_prefetch_is_read_again(tmp_path):
    glob = _input(tmp_path)
    argv = ["--input", glob, "--output", str(tmp_path / "out"), "--strategy", "grpo", "--shard-rows", "15", "--io-threads", "2", "--quiet"]
    first = prefetch_from(argv)
    queued = len(first._futures)
    assert queued == first.units >= 4
    for future in first._futures.values():  # the first file's units are decoded as it was
        future.result()
    path = sorted(Path(glob).parent.glob("*.parquet"))[0]
    table = pq.read_table(path)
    reward = pa.array([-r for r in table["reward"].to_pylist()], table.schema.field("reward").type)
    pq.write_table(table.set_column(table.schema.get_field_index("reward"), "reward", reward), path, row_group_size=5)

    from rescore.pipelines.cli import run

    run(argv, prefetch=first)
    assert (first.units, first.taken) == (queued, 0)  # the file's fingerprint changed: nothing taken
    assert _scored(str(tmp_path / "out")) == _run(glob, str(tmp_path / "again"), prefetch=False)[0]


@pytest.mark.slow
def test_the_command_prefetches_before_it_imports_beam_or_torch(tmp_path):
    glob = _input(tmp_path)
    probe = (
        "import json, sys\n"
        "from rescore.pipelines.early import prefetch_from\n"
        f"p = prefetch_from(['--input', {glob!r}, '--output', {str(tmp_path / 'o')!r}, '--shard-rows', '15', '--io-threads', '1'])\n"
        "p.wait()\n"
        "print(json.dumps({'units': p.units, 'beam': 'apache_beam' in sys.modules, 'torch': 'torch' in sys.modules}))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": ROOT}, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first = sorted(Path(glob).parent.glob("*.parquet"))[0]
    queued = min(len(input_plan.planned_file_units(str(first), 15)), unit_store.PREFETCH_UNITS_PER_THREAD)  # one read thread
    assert queued == 4
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"units": queued, "beam": False, "torch": False}


def test_after_the_imports_the_queued_units_decode_on_every_read_thread(tmp_path, monkeypatch):
    """One prefetch thread while the launcher imports; `imports_done()` adds the others (once),
    and each unit is still decoded once, exactly as the read step would (transforms/unit_store.py)."""
    import threading

    from rescore.transforms.rows.keys import light_columns

    glob = _input(tmp_path)
    first = sorted(Path(glob).parent.glob("*.parquet"))[0]
    units = input_plan.planned_file_units(str(first), 15)[:4]
    assert len(units) == 4
    held, names, real = threading.Event(), {}, unit_store.read_unit

    def decode(unit, *args, **kwargs):
        names[unit.index] = threading.current_thread().name
        if unit.index == units[0].index:
            held.wait(30)  # the first thread stays on its unit: only another thread can go on
        return real(unit, *args, **kwargs)

    monkeypatch.setattr(unit_store, "read_unit", decode)
    prefetch = unit_store.Prefetch(units, light_columns(()), threads=2)
    assert len(prefetch._more) == 1
    prefetch.imports_done()
    prefetch.imports_done()  # (the command and build_job both say so)
    assert len(prefetch._more) == 2
    for unit in units[1:]:
        assert prefetch.take(unit).equals(real(unit, light_columns(()), use_threads=False))
    held.set()
    assert prefetch.take(units[0]).equals(real(units[0], light_columns(()), use_threads=False))
    assert names[units[0].index] == "rescore-prefetch_0" and set(names.values()) == {"rescore-prefetch_0", "rescore-prefetch_1"}
    assert prefetch.taken == 4
    prefetch.close()



def test_the_decode_threads_are_not_daemons(tmp_path, monkeypatch):
    """An interpreter waits at its exit for a prefetch decode under way (and for a purge of
    Arrow's pages, transforms/jemalloc.py): a daemon thread still inside Arrow's C++ code when a
    Python caller's interpreter finalized aborted it ("terminate called without an active
    exception", seen in CI under load). The console script ends with os._exit and waits for none."""
    import threading

    from rescore.transforms import jemalloc
    from rescore.transforms.rows.keys import light_columns

    glob = _input(tmp_path)
    first = sorted(Path(glob).parent.glob("*.parquet"))[0]
    prefetch = unit_store.Prefetch(input_plan.planned_file_units(str(first), 15)[:4], light_columns(()), threads=2)
    prefetch.imports_done()
    assert len(prefetch._more) == 2 and not any(t.daemon for t in prefetch._more)
    prefetch.wait()
    prefetch.close()
    started = []
    monkeypatch.setattr(jemalloc, "purge", lambda keep=frozenset(): started.append(threading.current_thread().daemon))
    jemalloc.purge_soon()
    jemalloc.wait_purged(timeout=10)
    assert started == [False]
