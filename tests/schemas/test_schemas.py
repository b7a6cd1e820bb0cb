"""File-level schema checks and row-level validation."""

import numpy as np
import pyarrow as pa
import pytest

from rescore.schemas import (
    SchemaError,
    check_rows,
    output_schema,
    rejected_schema,
    unify,
    validate_file_schema,
)
from rescore.schemas.lists import flat_list
from rescore.transforms.strategies.flat import flat_segment_sum as segment_sum

BASE = pa.schema([("batch", pa.int64()), ("task", pa.int64()), ("run", pa.int64()), ("reward", pa.float64())])


def test_missing_required_column_names_file_and_column():
    with pytest.raises(SchemaError, match=r"^a\.parquet: missing required column 'reward'; the file's columns: batch, task, run$"):
        validate_file_schema("a.parquet", BASE.remove(3))
    # a near miss is named: `rewards` for `reward`
    renamed = BASE.remove(3).append(pa.field("rewards", pa.float64()))
    with pytest.raises(SchemaError, match=r"^a\.parquet: missing required column 'reward' \(the file has 'rewards': should it "
                       r"be named 'reward'\?\); the file's columns: batch, task, run, rewards$"):
        validate_file_schema("a.parquet", renamed)


@pytest.mark.parametrize(
    "field, message",
    [
        (pa.field("reward", pa.string()), "column 'reward' has type string, expected a float"),
        (pa.field("run", pa.float64()), "column 'run' has type double, expected an integer"),
        (pa.field("task", pa.float32()), "column 'task' has type float, expected an integer or a string"),
    ],
)
def test_wrong_type_is_refused(field, message):
    schema = BASE.set(BASE.get_field_index(field.name), field)
    with pytest.raises(SchemaError, match=message):
        validate_file_schema("b.parquet", schema)


def test_compatible_types_are_accepted():
    schema = pa.schema(
        [
            ("batch", pa.int32()),
            ("task", pa.large_string()),
            ("run", pa.int16()),
            ("reward", pa.float32()),
            ("logprobs", pa.large_list(pa.float32())),
            ("action_mask", pa.list_(pa.int8())),
            ("tokens", pa.list_(pa.int32())),
            ("prompt_length", pa.int32()),
            ("extra", pa.struct([("x", pa.int8())])),
        ]
    )
    assert validate_file_schema("c.parquet", schema) == []


def test_strategy_needs_are_checked():
    with pytest.raises(SchemaError, match="missing column 'logprobs', which the chosen strategy needs"):
        validate_file_schema("d.parquet", BASE, needs=("logprobs",))


def test_tokens_without_prompt_length_is_refused():
    with pytest.raises(SchemaError, match="'tokens' needs 'prompt_length'"):
        validate_file_schema("e.parquet", BASE.append(pa.field("tokens", pa.list_(pa.int64()))))


def test_output_schemas_add_score_columns_and_replace_old_ones():
    old = BASE.append(pa.field("score", pa.float64()))
    out = output_schema(old)
    assert out.names == ["batch", "task", "run", "reward", "advantages", "returns", "score"]
    assert out.field("advantages").type == pa.list_(pa.float32())
    assert out.field("score").type == pa.float32()
    assert rejected_schema(old).names[-1] == "reject_reason"


def test_unify_refuses_mixed_task_types():
    strings = BASE.set(1, pa.field("task", pa.string()))
    with pytest.raises(SchemaError, match="task.*integer in a.*string in b"):
        unify([("a", BASE), ("b", strings)])
    wide = unify([("a", BASE.set(0, pa.field("batch", pa.int32()))), ("b", BASE.append(pa.field("x", pa.int8())))])
    assert wide.field("batch").type == pa.int64() and "x" in wide.names


def _table(**cols):
    n = len(next(iter(cols.values())))
    base = {"batch": [0] * n, "task": [1] * n, "run": list(range(n)), "reward": [1.0] * n}
    base.update(cols)
    return pa.table(base)


def test_bad_rows_get_reasons():
    t = _table(
        reward=[1.0, float("nan"), float("inf"), None, 2.0, 0.0, 1.0],
        logprobs=[[0.1], [0.1], [0.1], [0.1], [0.1, 0.2], None, [0.3]],
        action_mask=pa.array([[1], [1], [1], [1], [1], [1], [2]], pa.list_(pa.int8())),
    )
    check = check_rows(t)
    assert check.ok.tolist() == [True, False, False, False, False, False, False]
    r = check.reasons
    assert r[1] == "bad_reward: reward is NaN"
    assert r[2] == "bad_reward: reward is +inf"
    assert r[3] == "null_value: reward is null"
    assert r[4] == "length_mismatch: action_mask has 1 tokens but logprobs has 2"
    assert r[5] == "null_value: logprobs is null"
    assert r[6] == "bad_action_mask: action_mask values must be 0 or 1"
    assert check.response_length.tolist() == [1, 0, 0, 0, 0, 0, 0]


def test_tokens_and_prompt_length_give_the_response_length():
    t = _table(
        tokens=[[1, 2, 3, 4], [1, 2], [1, 2, 3]],
        prompt_length=[1, 3, 1],
        logprobs=[[0.0, 0.0, 0.0], [0.0], [0.0]],
    )
    check = check_rows(t)
    assert check.ok.tolist() == [True, False, False]
    assert check.reasons[1].startswith("bad_prompt_length: prompt_length 3 outside 0..2")
    assert check.reasons[2] == "length_mismatch: logprobs has 1 tokens but tokens - prompt_length has 2"
    assert check.response_length.tolist() == [3, 0, 0]


def test_nan_logprobs_only_matter_when_the_strategy_ranks():
    t = _table(reward=[1.0, 2.0], logprobs=[[float("nan")], [-0.1]])
    assert check_rows(t).ok.all()
    check = check_rows(t, needs=("logprobs",))
    assert check.ok.tolist() == [False, True] and check.reasons[0] == "bad_logprobs: logprobs contain NaN"


def test_flat_list_handles_slices_and_nulls():
    arr = pa.array([[1, 2], None, [3], [], [4, 5, 6]], pa.list_(pa.int64())).slice(1)
    fl = flat_list(arr)
    assert fl.valid.tolist() == [False, True, True, True]
    assert fl.lengths.tolist() == [0, 1, 0, 3]
    assert fl.values.to_pylist() == [3, 4, 5, 6]
    assert segment_sum(fl.values.to_numpy().astype(float), fl.offsets).tolist() == [0.0, 3.0, 0.0, 15.0]


def test_segment_sum_is_position_independent():
    rng = np.random.default_rng(0)
    row = rng.random(37).astype(np.float32).astype(np.float64)
    values = np.concatenate([rng.random(5), row, rng.random(11), row])
    offsets = np.array([0, 5, 42, 53, 90])
    sums = segment_sum(values, offsets)
    assert sums[1] == sums[3]


def test_null_list_elements_are_null_value_rejections(tmp_path):
    from rescore.schemas.validation import check_rows

    table = pa.table({
        "batch": [0, 0, 0, 0], "task": [1, 1, 1, 1], "run": [0, 1, 2, 3], "reward": [1.0, 0.0, 0.5, 0.2],
        "tokens": pa.array([[1, 2, None], [1, 2, 3], [1, 2, 3], [1, 2, 3]], pa.list_(pa.int64())),
        "prompt_length": [1, 1, 1, 1],
        "logprobs": pa.array([[-0.1, -0.2], [None, -0.1], [-0.1, -0.1], [-0.1, -0.1]], pa.list_(pa.float32())),
    })
    used = check_rows(table, needs=("logprobs",))
    assert used.ok.tolist() == [False, False, True, True]
    assert used.reasons[0] == "null_value: tokens has a null element"
    assert used.reasons[1].startswith("null_value: logprobs has a null element")
    unused = check_rows(table)  # logprobs the strategy does not read are passed through
    assert unused.ok.tolist() == [False, True, True, True]
