"""A read unit whose rows are all rejected (a file of its own holding a duplicate-id row and a
NaN-reward row, good files beside it): the run succeeds with --audit-columns, alone and with
--keep-filtered, duplication and a token-level strategy; the unit writes an empty scored file
with the run's scored schema and its rejected rows with their reasons, and the metrics count
every row."""

from __future__ import annotations

import json
import os
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from data import SCHEMA_INT_TASK, random_rows, read_output, write_parquet


def _input(tmp_path) -> tuple[str, list[dict], list[dict]]:
    """(glob, the good rows, the bad file's rows): part-0, part-1 good; part-bad all rejected."""
    good = random_rows(3)
    directory = str(tmp_path / "in")
    pattern = write_parquet(good, directory, files=2)
    twin = dict(good[0])  # its id is in part-0 as well: both copies are rejected
    nan = {**good[1], "run": 999, "reward": float("nan"), "note": "nan-reward"}
    pq.write_table(pa.Table.from_pylist([twin, nan], schema=SCHEMA_INT_TASK), os.path.join(directory, "part-bad.parquet"))
    return pattern, good, [twin, nan]


def _schema(path: str) -> pa.Schema:
    return pq.read_schema(path).remove_metadata()


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        ["--strategy", "grpo"],
        ["--strategy", "reward_variance,grpo,duplicate_informative", "--keep-filtered"],
        ["--strategy", "reinforce_plus_plus", "--keep-filtered"],  # token-level
    ],
    ids=["grpo", "duplication", "token-level"],
)
def test_an_all_rejected_unit_is_written_with_audit_columns(tmp_path, rescore, args):
    pattern, good, bad = _input(tmp_path)
    doc, out = rescore(pattern, *args, "--audit-columns")
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    bad_unit = "00002-of-00003"

    # the all-rejected unit: an empty scored file like every other unit's (audit columns
    # included), and both of its rows in its rejected file, with the schema a mixed unit's has
    empty = pq.read_table(os.path.join(out, f"scored-{bad_unit}.parquet"))
    assert empty.num_rows == 0
    assert empty.schema.remove_metadata() == _schema(os.path.join(out, "scored-00000-of-00003.parquet"))
    assert empty.schema.names[-5:] == ["group_size", "group_reward_mean", "group_reward_std", "batch_reward_std", "baseline"]
    rejected = pq.read_table(os.path.join(out, f"rejected-{bad_unit}.parquet"))
    assert rejected.schema.remove_metadata() == _schema(os.path.join(out, "rejected-00000-of-00003.parquet"))
    assert rejected["note"].to_pylist() == [bad[0]["note"], "nan-reward"]
    reasons = rejected["reject_reason"].to_pylist()
    assert reasons[0].startswith("duplicate_id: ") and reasons[0].endswith("appears 2 times")
    assert reasons[1] == "bad_reward: reward is NaN"
    # the twin's other copy is rejected in its own (mixed) unit
    mixed = pq.read_table(os.path.join(out, "rejected-00000-of-00003.parquet"))
    assert mixed["note"].to_pylist() == [bad[0]["note"]] and mixed["reject_reason"].to_pylist() == reasons[:1]

    # metrics account for every row
    totals = json.load(open(os.path.join(out, "metrics.json")))["totals"]
    assert doc["totals"] == totals
    assert totals["rows_read"] == len(good) + 2
    assert totals["rows_rejected"] == 3 and totals["reject_reasons"] == {"bad_reward": 1, "duplicate_id": 2}
    assert totals["rows_read"] == totals["rows_written_original"] + totals["rows_filtered"] + totals["rows_rejected"]

    # the written rows carry real audit values: group_size is the size of the row's group
    # among the valid rows (the twin's id is gone from it)
    valid = Counter((r["batch"], r["task"]) for r in good[1:])
    scored = read_output(out)
    original = scored if "copy_index" not in scored.column_names else scored.filter(pa.compute.equal(scored["copy_index"], 0))
    assert original.num_rows == totals["rows_written_original"] > 0
    for row in original.to_pylist():
        assert row["group_size"] == valid[(row["batch"], row["task"])]
        assert row["group_reward_mean"] is not None
