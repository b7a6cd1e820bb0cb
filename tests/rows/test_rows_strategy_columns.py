"""transforms/rows/strategy_columns.py: the Arrow side of the strategies' capabilities."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from rescore.transforms.rows import strategy_columns
from rescore.transforms.rows.strategy_columns import ArrowRows
from rescore.transforms.strategies import chain_of


def test_response_layout_follows_the_contract():
    masked = pa.table({"action_mask": [[1, 0, 1], None, [0]], "logprobs": [[0.0] * 3, [0.0], [0.0]]})
    lengths, mask = ArrowRows(masked).response()
    assert lengths.tolist() == [3, 0, 1] and mask.tolist() == [1.0, 0.0, 1.0, 0.0]
    lengths, mask = ArrowRows(pa.table({"logprobs": [[0.1, 0.2], [0.3]]})).response()
    assert lengths.tolist() == [2, 1] and mask.tolist() == [1.0, 1.0, 1.0]
    lengths, _ = ArrowRows(pa.table({"tokens": [[1, 2, 3, 4], [5, 6]], "prompt_length": [1, 2]})).response()
    assert lengths.tolist() == [3, 0]
    assert ArrowRows(pa.table({"reward": [1.0, 2.0]})).response()[0].tolist() == [0, 0]


def test_mix_chord_columns_are_built_from_numpy():
    table = pa.table({
        "batch": pa.array([0, 5], pa.int64()),
        "expert": [True, False],
        "logprobs": pa.array([[np.log(0.5)], [0.0, np.log(0.25)]], pa.list_(pa.float32())),
    })
    chain = chain_of("mix_chord", {"mu_warmup_steps": 10, "mu_peak": 0.5})
    fields = strategy_columns.output_fields(chain, table.schema)
    assert [(f.name, str(f.type)) for f in fields] == [
        ("mu", "float"), ("loss_weight", "float"), ("sft_token_weights", "list<item: float>")
    ]
    mu, weight, phi = strategy_columns.output_columns(chain, table, fields)
    assert mu.to_pylist() == [0.0, 0.25]  # warm-up: step / 10 * 0.5
    assert weight.to_pylist() == [0.0, 0.75]  # expert: mu; others: 1 - mu
    assert phi.to_pylist() == [[0.25], [0.0, 0.1875]]  # p (1 - p)
    assert [f.name for f in strategy_columns.output_fields(chain, table.drop(["logprobs"]).schema)] == ["mu", "loss_weight"]


def test_masked_rows_train_on_nothing():
    table = pa.table({
        "truncate_status": ["response_truncated", "normal"],
        "reward": [1.0, 0.0],
        "logprobs": [[-0.1, -0.2], [-0.3]],
        "teacher_logprobs": [[-0.2, -0.2], [-0.1]],
        "action_mask": [[1, 1], [1]],
    })
    chain = chain_of("mask_response_truncated,on_policy_distill")
    values, score = strategy_columns.token_values(chain, table, np.zeros(2), np.zeros(2))
    np.testing.assert_allclose(values, [0.0, 0.0, 0.2])
    np.testing.assert_allclose(score, [0.0, 0.2])
    unmasked, _ = strategy_columns.token_values(chain_of("on_policy_distill"), table, np.zeros(2), np.zeros(2))
    np.testing.assert_allclose(unmasked, [-0.1, 0.0, 0.2], atol=1e-7)
    flags = pa.table({"truncate_status": pa.array([1.0, None, 0.0])})
    assert strategy_columns.masked_flags(chain.masking, flags).tolist() == [True, False, False]
