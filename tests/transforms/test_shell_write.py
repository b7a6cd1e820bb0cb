"""WriteScored on a TestPipeline: each read unit's records are joined back to its rows, read
again; scored rows (with their copies and token advantages), filtered and rejected rows are
staged, and each unit's row metrics counted."""

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing.util import assert_that, equal_to
from shell_data import MASK, gathered, grpo, pipeline, write_experience

from rescore.transforms.copies import CopyPlans
from rescore.transforms.read import plan_input
from rescore.transforms.rows.outcomes import DUPLICATED, FILTERED, REJECTED, SCORED, records
from rescore.transforms.strategies import build_chain
from rescore.transforms.write import WriteScored
from rescore.transforms.settings import StepSettings


def test_write_scored_stages_every_row_of_each_unit(tmp_path):
    plan = plan_input([write_experience(tmp_path / "in")], shard_rows=4)
    chain = build_chain(["reward_variance", "grpo", "duplicate_informative"], {})
    b0, b1 = grpo([1.0, 0.0, 0.0, 1.0]), grpo([0.0, 2.0])
    unit_records = [
        (0, records(np.arange(4), [0] * 4, SCORED, b0)),
        (1, records([0, 1], [0, 0], FILTERED, reason=["filtered_by: reward_variance"] * 2)),
        (1, records([2, 3], [1, 1], SCORED, b1)),
        (2, records([0], [1], REJECTED, reason=["null_value: reward is null"], has_score=False)),
    ]
    out = tmp_path / "out"

    def written(items):
        files = dict(items)
        assert sorted(files) == [0, 1, 2]
        names = {unit: [p.rsplit("/", 1)[-1] for p in paths] for unit, paths in files.items()}
        # unit 0: 4 rows + 4 copies, past --shard-rows 4: two parts
        assert names[0] == ["scored-00000-of-00003-part-000.parquet", "scored-00000-of-00003-part-001.parquet"]
        assert names[1] == ["scored-00001-of-00003.parquet", "filtered-00001-of-00003.parquet"]
        assert names[2] == ["scored-00002-of-00003.parquet", "rejected-00002-of-00003.parquet"]
        scored = pa.concat_tables([pq.read_table(p) for unit in (0, 1, 2) for p in files[unit] if "/scored-" in p])
        rows = list(zip(*(scored[c].to_pylist() for c in ("batch", "task", "run", "copy_index", "source_task"))))
        assert rows == [
            *((0, 1, r, 0, 1) for r in range(4)), *((0, 3, r, 1, 1) for r in range(4)),  # copies: task 1 + 1 * stride 2
            (1, 1, 0, 0, 1), (1, 1, 1, 0, 1),
        ]
        scores = [*b0, *b0, *b1]
        assert scored["score"].to_pylist() == np.float32(scores).tolist()
        mask = np.array(MASK, np.float32)
        assert scored["advantages"].to_pylist() == [(np.float32(s) * mask + 0.0).tolist() for s in scores]
        assert scored["returns"].to_pylist() == scored["advantages"].to_pylist()
        filtered = pq.read_table(files[1][1])
        assert filtered["run"].to_pylist() == [0, 1] and filtered["task"].to_pylist() == [2, 2]
        rejected = pq.read_table(files[2][1])
        assert rejected["task"].to_pylist() == [3] and rejected["reject_reason"].to_pylist() == ["null_value: reward is null"]
        return True

    def counts(tables):
        total = {}
        for t in tables:
            for batch, status, rows in zip(t["batch"].to_pylist(), t["status"].to_pylist(), t["rows"].to_pylist()):
                total[(batch, status)] = total.get((batch, status), 0) + rows
        return sorted(total.items())

    with pipeline() as p:
        copies = CopyPlans(
            plans=p | "Plans" >> beam.Create([(0, (2, pa.table({"task": pa.array([1], pa.int64()), "copies": [1]})))]),
            metrics=p | "NoMetrics" >> beam.Create([]),
        )
        result = (
            p | beam.Create(unit_records)
            | WriteScored(plan, str(out), chain, copies, StepSettings(device="cpu", shard_rows=4, keep_filtered=True, io_threads=1))
        )
        assert_that(result.files | "Files" >> gathered(written), equal_to([True]), label="CheckFiles")
        assert_that(
            result.metrics | "Counts" >> gathered(counts),
            equal_to([[((0, SCORED), 4), ((0, FILTERED), 2), ((0, DUPLICATED), 4), ((1, SCORED), 2), ((1, REJECTED), 1)]]),
            label="CheckMetrics",
        )
