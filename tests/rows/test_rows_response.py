"""The response-length rule has one home (rows/response.py): action_mask, else logprobs, else
tokens - prompt_length; the token columns, the strategies' view and the report count it there."""

import numpy as np
import pyarrow as pa

from rescore.transforms.rows.response import response_length_columns, response_lengths


def test_the_rule_prefers_the_mask_then_logprobs_then_tokens():
    table = pa.table({"tokens": [[1, 2, 3, 4], [5, 6]], "prompt_length": [1, 2], "logprobs": [[0.1, 0.2], [0.3]],
                      "action_mask": [[True, False, True], [True]]})
    assert response_length_columns(table.column_names) == ["action_mask"]
    lengths, mask = response_lengths(table)
    assert lengths.tolist() == [3, 1] and np.asarray(mask).tolist() == [True, False, True, True]
    assert response_lengths(table.drop_columns(["action_mask"]))[0].tolist() == [2, 1]
    only_tokens = table.select(["tokens", "prompt_length"])
    assert response_length_columns(only_tokens.column_names) == ["tokens", "prompt_length"]
    assert response_lengths(only_tokens)[0].tolist() == [3, 0] and response_lengths(only_tokens)[1] is None


def test_nulls_and_tables_without_a_column_to_count():
    table = pa.table({"tokens": pa.array([[1, 2, 3], None], pa.list_(pa.int64())), "prompt_length": pa.array([None, 0], pa.int64())})
    assert response_lengths(table)[0].tolist() == [3, 0]
    assert response_length_columns(["tokens", "reward"]) == []  # no prompt_length: nothing to count
    assert response_lengths(pa.table({"reward": [1.0, 2.0]}))[0].tolist() == [0, 0]


def test_the_report_counts_with_the_same_rule():
    from rescore.pipelines.report_data import _lengths

    table = pa.table({"tokens": [[1, 2, 3, 4]], "prompt_length": [1]})
    assert _lengths(table).tolist() == [3.0]
    assert np.isnan(_lengths(pa.table({"reward": [1.0]}))).all()
