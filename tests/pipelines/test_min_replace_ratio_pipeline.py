"""duplicate_informative's min_replace_ratio through the whole job: only the batch whose
informative groups are more than the ratio is rebalanced (tests/strategies/test_min_replace_ratio.py
has the rule against SkyRL's)."""

from __future__ import annotations

import pytest
from test_min_replace_ratio import BATCHES


@pytest.mark.slow
def test_min_replace_ratio_through_the_job(rescore, tmp_path):
    from data import SCHEMA_INT_TASK, read_output, write_parquet

    rows = []
    for b, groups in enumerate(BATCHES):
        for t, g in enumerate(groups):
            rows += [{"batch": b, "task": t, "run": r, "step": 0, "reward": x, "tokens": [1, 2], "prompt_length": 1,
                      "logprobs": [-0.5], "action_mask": [True], "note": None} for r, x in enumerate(g)]
    glob = write_parquet(rows, str(tmp_path / "in"), files=2, schema=SCHEMA_INT_TASK)
    doc, out = rescore(glob, "--strategy", "grpo,duplicate_informative", "--set", "min_replace_ratio=0.3")
    got = read_output(out)
    per_batch = {b: sorted(zip(*(got.filter(pa_eq(got, b))[k].to_pylist() for k in ("source_task", "copy_index")))) for b in range(3)}
    # batch 0 rebalanced: its 2 informative groups (4 rows) copied once, back to 8 rows; batches 1, 2 whole
    assert per_batch[0] == [(0, 0), (0, 0), (0, 1), (0, 1), (2, 0), (2, 0), (2, 1), (2, 1)]
    assert per_batch[1] == [(t, 0) for t in range(4) for _ in range(2)]
    assert per_batch[2] == [(t, 0) for t in range(2) for _ in range(2)]
    assert doc["totals"]["rows_filtered"] == 4


def pa_eq(table, b):
    import pyarrow.compute as pc

    return pc.equal(table["batch"], b)
