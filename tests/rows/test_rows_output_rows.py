"""transforms/rows/output_rows.py: the scored rows of a read unit with --audit-columns, where
some or all of its rows were rejected (rejected records carry no audit columns)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import torch

from data import SCHEMA_INT_TASK
from rescore.transforms.rows.audit import AUDIT_FIELDS, AUDIT_NAMES
from rescore.transforms.rows.outcomes import rejected_records, scored_outcomes
from rescore.transforms.rows.output_rows import output_schemas, scored_rows, unit_outcomes
from rescore.transforms.strategies import chain_of

CHAIN = chain_of("grpo")
SCHEMAS = output_schemas(SCHEMA_INT_TASK, pa.int64(), CHAIN, {}, audit_columns=True)


def _unit(n: int) -> pa.Table:
    return pa.Table.from_pylist(
        [{"batch": 0, "task": 1, "run": r, "step": 0, "reward": float(r), "tokens": [1, 2, 3], "prompt_length": 1,
          "logprobs": [-0.5, -0.5], "action_mask": [True, False], "note": f"r{r}"} for r in range(n)],
        schema=SCHEMA_INT_TASK,
    )


def _scored(rows: list[int], score: list[float]) -> pa.Table:
    """The records ScoreGroups sends for `rows` of unit 0, with audit values."""
    n = len(rows)
    light = pa.table({"unit": np.zeros(n, np.int64), "row": np.asarray(rows, np.int32), "batch": np.zeros(n, np.int64)})
    audit = {"group_size": np.full(n, n), "group_reward_mean": np.full(n, 0.5), "group_reward_std": np.full(n, 0.25),
             "batch_reward_std": np.full(n, np.nan), "baseline": np.full(n, 0.5)}
    [(unit, rec)] = scored_outcomes(light, np.ones(n, bool), np.asarray(score), None, audit=audit, audit_fields=AUDIT_FIELDS)
    assert unit == 0
    return rec


def test_a_mixed_unit_writes_the_audit_values_of_its_scored_rows():
    rec = unit_outcomes([_scored([0, 2], [-1.0, 1.0]), rejected_records(np.array([1]), pa.array([0]), ["bad_reward: x"])], 0, 3, "p")
    assert rec["group_size"].to_pylist() == [2, None, 2]  # null on the rejected row
    table, copied = scored_rows(_unit(3), rec, SCHEMAS, CHAIN, None, pa.int64(), torch.device("cpu"))
    assert table.schema == SCHEMAS.scored and len(copied) == 0
    assert table["note"].to_pylist() == ["r0", "r2"] and table["score"].to_pylist() == [-1.0, 1.0]
    assert table.select(AUDIT_NAMES).to_pylist() == [
        {"group_size": 2, "group_reward_mean": 0.5, "group_reward_std": 0.25, "batch_reward_std": None, "baseline": 0.5}
    ] * 2


def test_an_all_rejected_unit_writes_an_empty_scored_table_with_the_audit_columns():
    rec = unit_outcomes([rejected_records(np.array([1, 0]), pa.array([0, 0]), ["duplicate_id: x", "bad_reward: y"])], 0, 2, "p")
    assert not set(AUDIT_NAMES) & set(rec.column_names)  # only ScoreGroups adds them
    table, copied = scored_rows(_unit(2), rec, SCHEMAS, CHAIN, None, pa.int64(), torch.device("cpu"))
    assert table.num_rows == 0 and table.schema == SCHEMAS.scored and len(copied) == 0


def test_unwritable_rows_are_found_chunk_by_chunk_and_a_shared_column_once():
    """_unwritable checks each chunk where it is (no join of the token columns): a bad value in a
    later chunk names its row in the table, and `returns`, the very arrays of `advantages`, is
    not checked again (its rows are the same); a column of its own is."""
    import math

    import pyarrow as pa

    from rescore.transforms.rows.output_rows import _unwritable

    t = pa.list_(pa.float32())
    first = pa.array([[0.5, 1.0], [2.0]], t)
    second = pa.array([[1.0], [math.nan, 3.0, math.inf], None, [4.0]], t).slice(0, 4)
    advantages = pa.chunked_array([first, second])
    score = pa.chunked_array([pa.array([1.0, 2.0, 3.0], pa.float32()), pa.array([math.inf, 5.0, 6.0], pa.float32())])
    table = pa.table({"advantages": advantages, "returns": advantages, "score": score})
    assert _unwritable(table, ["advantages", "returns", "score"]).tolist() == [None, None, None, "advantages", None, None]
    own = pa.chunked_array([pa.array([[math.nan], [1.0], [1.0], [1.0], [1.0], [1.0]], t)])
    table = pa.table({"advantages": advantages, "returns": own, "score": score})
    assert _unwritable(table, ["advantages", "returns", "score"]).tolist() == ["returns", None, None, "advantages", None, None]
    assert _unwritable(table.slice(0, 3), ["advantages", "score"]) is None
    table = pa.table({"advantages": advantages, "returns": advantages, "score": score}).slice(2)
    assert _unwritable(table, ["advantages", "returns", "score"]).tolist() == [None, "advantages", None, None]
    assert _unwritable(table, ["score", "advantages"]).tolist() == [None, "score", None, None]
