"""Reading and writing read units fast without changing the output: Overlap threads (outputs in
arrival order, bounded, failures safe), even read units, plain-encoded score columns."""

import json
import threading
import time
from pathlib import Path

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import GlobalWindow, IntervalWindow
from apache_beam.utils.timestamp import Timestamp
from data import SCHEMA_MULTI_STEP, multi_step_rows, write_parquet

from rescore.transforms.unit_threads import MAX_AUTO_THREADS, Overlap, resolve_threads


class _Tracker:
    def __init__(self):
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0
        self.finished = []

    def work(self, i, delay):
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(delay)
        with self.lock:
            self.running -= 1
            self.finished.append(i)
        if i == "boom":
            raise ValueError("boom")
        return i


def _values(outputs):
    return [(o.tag, o.value.value) if isinstance(o, TaggedOutput) else o.value for o in outputs]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_outputs_come_in_arrival_order_with_their_windows(threads):
    tracker = _Tracker()
    overlap = Overlap(threads, done=lambda r: [r, TaggedOutput("twice", 2 * r)])
    windows = [GlobalWindow(), IntervalWindow(0, 10)]
    out = []
    # Later elements finish first: the output order must not follow completion order.
    for i, delay in enumerate([0.08, 0.04, 0.0, 0.02, 0.0]):
        out += list(overlap.submit(tracker.work, i, delay, window=windows[i % 2], timestamp=Timestamp(i)))
        assert len(overlap._pending) <= threads
    out += list(overlap.drain())
    overlap.close()
    assert _values(out) == [v for i in range(5) for v in (i, ("twice", 2 * i))]
    for o in out:
        wv = o.value if isinstance(o, TaggedOutput) else o
        i = wv.value // 2 if isinstance(o, TaggedOutput) else wv.value
        assert wv.windows == (windows[i % 2],) and wv.timestamp == Timestamp(i)
    assert tracker.most <= threads
    if threads > 1:
        assert tracker.most > 1, "the work never overlapped"


def test_a_failure_is_raised_after_running_work_stops():
    tracker = _Tracker()
    overlap = Overlap(2, done=lambda r: [r])
    out = list(overlap.submit(tracker.work, "boom", 0.05, window=GlobalWindow(), timestamp=Timestamp(0)))
    out += list(overlap.submit(tracker.work, "slow", 0.3, window=GlobalWindow(), timestamp=Timestamp(0)))
    with pytest.raises(ValueError, match="boom"):
        out += list(overlap.submit(tracker.work, "queued", 0.0, window=GlobalWindow(), timestamp=Timestamp(0)))
        out += list(overlap.drain())
    # Nothing is left running behind the failure, so a retry cannot race a leftover write.
    assert tracker.running == 0 and "slow" in tracker.finished
    assert out == [] and list(overlap.drain()) == []
    overlap.close()


def test_resolve_threads():
    assert resolve_threads(3) == 3
    assert 1 <= resolve_threads(0) <= MAX_AUTO_THREADS


@pytest.mark.slow
@pytest.mark.parametrize("row_group_size", [9, 10_000], ids=["small-row-groups", "row-groups-read-in-slices"])
def test_io_threads_do_not_change_the_output(tmp_path, rescore, row_group_size):
    """Every output file is identical whether units are read and written one or three at a time,
    also where each file's one row group is read in slices of at most --shard-rows rows."""
    glob = write_parquet(multi_step_rows(3), str(tmp_path / "in"), files=3, row_group_size=row_group_size, schema=SCHEMA_MULTI_STEP)
    outs = []
    for threads in (1, 3):
        _, out = rescore(glob, "--strategy", "grpo,duplicate_informative", "--shard-rows", "20", "--io-threads", str(threads),
                         output=str(tmp_path / f"t{threads}"))
        outs.append(Path(out))
    names = sorted(p.name for p in outs[0].glob("*.parquet"))
    assert len(names) > 3 and names == sorted(p.name for p in outs[1].glob("*.parquet"))
    for name in names:
        assert pq.read_table(outs[0] / name).equals(pq.read_table(outs[1] / name)), name
    docs = [json.loads((o / "metrics.json").read_text()) for o in outs]
    assert docs[0]["totals"] == docs[1]["totals"] and docs[0]["totals"]["rows_duplicated"] > 0


def test_beam_step_emits_finished_units_from_finish_bundle():
    """In a real pipeline the last elements' outputs leave through finish_bundle."""

    class Square(beam.DoFn):
        def setup(self):
            self._overlap = Overlap(2, done=lambda r: [r])

        def process(self, x, window=beam.DoFn.WindowParam, timestamp=beam.DoFn.TimestampParam):
            yield from self._overlap.submit(lambda v: v * v, x, window=window, timestamp=timestamp)

        def finish_bundle(self):
            yield from self._overlap.drain()

        def teardown(self):
            self._overlap.close()

    from apache_beam.testing.util import assert_that, equal_to

    with beam.Pipeline(runner="FnApiRunner") as p:
        assert_that(p | beam.Create(range(7)) | beam.ParDo(Square()), equal_to([x * x for x in range(7)]))


def test_row_groups_split_into_even_units_under_the_cap():
    from rescore.transforms.read import split_row_groups

    assert split_row_groups([16384] * 13, 65536) == [(0, 1, 2), (3, 4, 5, 6), (7, 8, 9), (10, 11, 12)]
    assert split_row_groups([16384] * 12, 65536) == [(0, 1, 2, 3), (4, 5, 6, 7), (8, 9, 10, 11)]
    assert split_row_groups([100_000, 10, 10], 65536) == [(0,), (1, 2)]  # a big row group stands alone
    assert split_row_groups([0, 5, 0, 5], 4) == [(1,), (3,)]  # empty row groups are left out
    assert split_row_groups([], 10) == []
    rng = np.random.default_rng(0)
    for _ in range(500):
        counts = [int(c) for c in rng.integers(0, 50, size=rng.integers(0, 30))]
        cap = int(rng.integers(1, 120))
        units = split_row_groups(counts, cap)
        assert [g for u in units for g in u] == [g for g, n in enumerate(counts) if n > 0]
        sizes = [sum(counts[g] for g in u) for u in units]
        assert all(len(u) == 1 or s <= cap for u, s in zip(units, sizes))
        if counts and all(n == 16 for n in counts) and cap >= 64:  # equal row groups: units differ by at most one group
            assert max(sizes) - min(sizes) <= 16


@pytest.mark.slow
def test_score_columns_are_written_without_a_dictionary(tmp_path, rescore):
    glob = write_parquet(multi_step_rows(4), str(tmp_path / "in"), files=1, row_group_size=50, schema=SCHEMA_MULTI_STEP)
    _, out = rescore(glob, "--strategy", "grpo")
    meta = pq.ParquetFile(next(Path(out).glob("scored-*.parquet"))).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "RLE_DICTIONARY" not in encodings["advantages.list.element"]
    assert "RLE_DICTIONARY" not in encodings["returns.list.element"]
    # polars' writer (docs/output.md): zstd, no dictionary on float columns
    assert {meta.column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}


@pytest.mark.slow
def test_a_row_group_larger_than_shard_rows_is_read_in_slices(tmp_path, rescore):
    """One row group past --shard-rows: read units of consecutive slices of at most shard-rows
    rows, one file each, in input order, holding the rows a run that reads it whole writes."""
    from rescore.pipelines import job as rs
    from rescore.pipelines.config import parse_args

    rows = multi_step_rows(6)
    glob = write_parquet(rows, str(tmp_path / "in"), files=1, row_group_size=len(rows), schema=SCHEMA_MULTI_STEP)
    _, whole = rescore(glob, "--strategy", "grpo", "--shard-rows", str(len(rows)), output=str(tmp_path / "whole"))
    sliced = str(tmp_path / "sliced")
    cfg = parse_args(["--input", glob, "--output", sliced, "--strategy", "grpo", "--shard-rows", "40", "--quiet"])
    p, plan, info, unit_store = rs.build_job(cfg)  # as the command runs it, keeping the run's store to look into
    try:
        metrics = rs._run_built(cfg, p, plan, info, unit_store)
    finally:
        unit_store.close()
    slices = unit_store.store.slices
    n = -(-len(rows) // 40)
    names = sorted(p.name for p in Path(sliced).glob("scored-*.parquet"))
    assert names == [f"scored-{k:05d}-of-{n:05d}.parquet" for k in range(n)]
    sizes = [pq.read_metadata(Path(sliced) / name).num_rows for name in names]
    assert max(sizes) <= 40 and max(sizes) - min(sizes) <= 1 and sum(sizes) == len(rows)
    joined = pa.concat_tables([pq.read_table(Path(sliced) / name) for name in names])
    assert joined.equals(pq.read_table(next(Path(whole).glob("scored-*.parquet"))))
    assert metrics["totals"]["rows_read"] == len(rows) and metrics["totals"]["rows_written_original"] == len(rows)
    # The in-process run decodes each column of the row group once per read pass (read, then
    # read back): no slice decoded the rows before it again.
    columns = len(SCHEMA_MULTI_STEP.names)
    assert 0 < slices.stats.decoded_rows <= 2 * columns * len(rows)
    assert slices.open() == 0  # closed with the run's store


def test_part_bounds():
    from rescore.transforms.files.layout import part_bounds

    assert part_bounds(10, 4) == [0, 3, 6, 10]
    assert part_bounds(8, 4) == [0, 4, 8]
    assert part_bounds(3, 4) == [0, 3] and part_bounds(0, 4) == [0, 0]
