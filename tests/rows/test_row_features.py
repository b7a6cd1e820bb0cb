"""What a stage needs from a row, as objects (issue 41): the row layer computes any Feature a
stage module defines by calling its `light`, with the read unit's valid rows, without knowing the
stage; OptionalColumn / NullableColumn cross as float64 with NaN for a missing value."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from rescore.needs import NullableColumn, OptionalColumn
from rescore.schemas.validation import check_rows
from rescore.transforms.rows.keys import light_columns, light_rows
from rescore.transforms.strategies.features import Feature, FeatureRows
from rescore.transforms.strategies.flat import TokenColumn, flat_segment_sum
from rescore.transforms.strategies.reinforce_pp import DiscountSums, token_discounts
from rescore.transforms.strategies.repetition import NgramRepeat


@dataclass(frozen=True)
class WeightedLogprobs(Feature):
    """A toy stage's feature, defined here and nowhere in the package: each row's sum of
    `weight * logprob` over its action tokens, and the masked log-probs as a token feature."""

    weight: float

    def light(self, rows: FeatureRows) -> dict:
        lp = rows.tokens("logprobs")
        mask = rows.action_values()
        values = np.asarray(lp.values, dtype=np.float64) * mask
        return {"toy_sum": self.weight * flat_segment_sum(values, lp.offsets), "toy_tokens": TokenColumn(lp.offsets - lp.offsets[0], values)}


def _table() -> pa.Table:
    """Four rows of one task; row 2's reward is NaN (rejected), row 3's response is empty."""
    return pa.table({
        "batch": [0, 0, 0, 0], "task": [1, 1, 1, 1], "run": [0, 1, 2, 3], "reward": [1.0, 0.0, float("nan"), 0.5],
        "tokens": pa.array([[5, 6, 7, 7, 7], [5, 6, 8, 9], [5, 6, 1], [5, 6]], pa.list_(pa.int64())),
        "prompt_length": [2, 2, 2, 2],
        "logprobs": pa.array([[-1.0, -0.5, -0.25], [-2.0, -1.0], [-0.1], []], pa.list_(pa.float32())),
        "action_mask": pa.array([[1, 0, 1], [1, 1], [1], []], pa.list_(pa.int8())),
        "acc": pa.array([1.0, None, 0.0, 1.0]),
    })


def test_a_feature_defined_outside_the_package_is_computed_where_the_row_is_read():
    table = _table()
    needs = ("logprobs", WeightedLogprobs(2.0), DiscountSums(0.5, "trinity"), NgramRepeat(1), OptionalColumn("acc"),
             OptionalColumn("absent"), NullableColumn("acc"))
    assert set(light_columns(needs)) >= {"logprobs", "acc", "absent"}
    check = check_rows(table, needs=needs)
    assert check.ok.tolist() == [True, True, False, True]  # a null acc is allowed: Optional / Nullable
    light = light_rows(7, table, check, task_type=pa.int64(), needs=needs)
    assert light["row"].to_pylist() == [0, 1, 3]
    assert light["x.toy_sum"].to_pylist() == [2.0 * (-1.0 - 0.25), 2.0 * (-3.0), 0.0]
    assert light["x.toy_tokens"].type == pa.large_list(pa.float64())
    assert light["x.toy_tokens"].to_pylist() == [[-1.0, -0.0, -0.25], [-2.0, -1.0], []]
    # REINFORCE++ (Trinity) discounts: c_t = gamma^(L - 1 - t) on every position, summed on action tokens
    c = token_discounts(0.5, "trinity", np.array([3]), np.array([1.0, 0.0, 1.0]), np.array([True]))
    assert c.tolist() == [0.25, 0.5, 1.0]
    assert light["x.discount_a"].to_pylist() == [1.25, 1.5, 0.0] and light["x.discount_b"].to_pylist() == [1.0625, 1.25, 0.0]
    # the response's unigrams: row 0 [7, 7, 7] repeats 2 of 3, row 1 [8, 9] none, row 3 has none
    assert light["x.ngram_repeat_1"].to_pylist() == [2 / 3, 0.0, 0.0]
    acc = light["x.acc"].to_pylist()
    assert acc[0] == 1.0 and math.isnan(acc[1]) and acc[2] == 1.0
    assert all(math.isnan(v) for v in light["x.absent"].to_pylist())


def test_a_unit_without_a_valid_row_gives_empty_feature_columns():
    table = _table().slice(2, 1)  # the NaN reward alone
    needs = (WeightedLogprobs(1.0), DiscountSums(0.9, "trinity"), NgramRepeat(2))
    check = check_rows(table, needs=needs)
    light = light_rows(0, table, check, task_type=pa.int64(), needs=needs)
    assert light.num_rows == 0
    for name in ("x.toy_sum", "x.discount_a", "x.discount_b", "x.ngram_repeat_2"):
        assert light[name].type == pa.float64()
