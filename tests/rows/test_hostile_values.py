"""Hostile values at the row layer (shared/hostile.md, docs/reliability.md): log-probs that are no
log-probabilities, sums past the float range, a std whose variance is past it, strings whose
hashes collide, a verifier's number that is no float, text that is not UTF-8."""

from __future__ import annotations

import json
import math
import zlib
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pytest

from rescore.schemas.validation import check_rows, readable_text
from rescore.transforms.rows.metrics import exact_sum, metrics_json
from rescore.transforms.rows.task_stats import mean_std, scaled, scaled_square, sqrt_fraction
from rescore.transforms.strategies import hashing

NAN, INF = math.nan, math.inf


def _table(**lists) -> pa.Table:
    n = len(next(iter(lists.values())))
    base = {"batch": [0] * n, "task": list(range(n)), "run": [0] * n, "step": [0] * n, "reward": [1.0] * n,
            "action_mask": [[1, 1]] * n, "logprobs": [[-0.5, -0.5]] * n}
    base.update(lists)
    return pa.table({k: pa.array(v, pa.list_(pa.float32()) if k.endswith(("logprobs", "logprobs_original")) else None)
                     for k, v in base.items()})


@pytest.mark.parametrize("column", ["logprobs", "logprobs_original", "ref_logprobs", "teacher_logprobs"])
def test_every_logprob_column_a_stage_reads_rejects_values_that_are_no_log_probability(column):
    values = [[-0.5, NAN], [INF, -0.5], [-0.5, -INF], [-0.5, 0.25], [-0.5, 0.0], [-1e30, -5e-324]]
    t = _table(**{column: values})
    assert check_rows(t).ok.all() or column == "logprobs"  # nothing reads them: passed through
    check = check_rows(t, needs=(column,))
    assert check.ok.tolist() == [False, False, False, False, True, True]
    assert check.reasons[0] == f"bad_logprobs: {column} contain NaN"
    assert check.reasons[1] == f"bad_logprobs: {column} contain +inf"
    assert check.reasons[2] == f"bad_logprobs: {column} contain -inf"
    assert check.reasons[3] == f"bad_logprobs: {column} holds 0.25 > 0 (a log-probability is <= 0)"


def test_a_behaviour_or_reference_column_must_line_up_with_the_response():
    t = _table(logprobs_original=[[-0.5], None, [-0.5, None], [-0.5, -0.5]])
    check = check_rows(t, needs=("logprobs", "logprobs_original"))
    assert check.ok.tolist() == [False, False, False, True]
    assert check.reasons[0] == "length_mismatch: the response has 2 tokens but logprobs_original has 1"
    assert check.reasons[1] == "null_value: logprobs_original is null"
    assert check.reasons[2] == "null_value: logprobs_original has a null element"


def test_sums_past_the_float_range_never_raise():
    assert exact_sum([1e308, 1e308]) == INF and exact_sum([-1e308, -1e308]) == -INF
    assert exact_sum([1e308, 1e308, -1e308]) == 1e308  # fsum's exact answer where it fits
    assert math.isnan(exact_sum([INF, -INF])) and exact_sum([INF, 1.0]) == INF
    assert exact_sum([0.1] * 10) == math.fsum([0.1] * 10)
    with pytest.raises(OverflowError):
        math.fsum([1e308, 1e308])  # what the publish step died of


def test_metrics_json_is_strict_and_says_which_metric_was_not_finite():
    text = metrics_json({"totals": {"a": 1.0, "kl": INF, "xs": [NAN, 2.0]}, "batches": [{"k3_kl": -INF}]})
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"metrics.json holds {c}"))
    assert doc["totals"] == {"a": 1.0, "kl": None, "xs": [None, 2.0]} and doc["batches"] == [{"k3_kl": None}]
    assert doc["non_finite_metrics"] == ["batches/0/k3_kl", "totals/kl", "totals/xs/0"]
    assert "non_finite_metrics" not in json.loads(metrics_json({"a": 1.0}))


def _stats(xs):
    return mean_std(len(xs), sum(scaled(x) for x in xs), sum(scaled_square(x) for x in xs))


def test_task_std_whose_variance_passes_the_float_range():
    assert _stats([1e200, -1e200, 0.0]) == (0.0, 1e200)  # variance 1e400 (was OverflowError)
    assert _stats([1e-200, 0.0]) == (5e-201, 1e-200 / math.sqrt(2))  # variance 5e-401 (was 0)
    assert _stats([1.7e308, -1.7e308])[1] is None  # the std itself is beyond float64
    assert _stats([0.5, 0.25, 1.0]) == (0.5833333333333334, 0.3818813079129867)  # as before
    assert sqrt_fraction(Fraction(10**400)) == 1e200 and sqrt_fraction(Fraction(0)) == 0.0


def test_string_keys_are_not_crc32_and_codes_are_exact():
    assert zlib.crc32(b"buckeroo") == zlib.crc32(b"plumless")  # a real CRC-32 pair
    assert hashing.string_key("buckeroo") != hashing.string_key("plumless")
    codes = hashing.exact_codes(["plumless", "buckeroo", "response_truncated"])
    assert codes[2] == hashing.string_key("response_truncated") and len(set(codes.tolist())) == 3


def test_codes_stay_exact_where_the_keys_collide(monkeypatch):
    """With a 32-bit key (CRC-32, as before) the pair shares a key; the codes do not."""
    real = hashing.string_key
    crc = lambda text: int(zlib.crc32(text.encode())) + 1  # noqa: E731
    monkeypatch.setattr(hashing, "string_key", crc)
    codes = hashing.exact_codes(["plumless", "buckeroo", "plumless\0"])
    assert len(set(codes.tolist())) == 3 and 0 not in codes.tolist()
    assert codes[1] == crc("buckeroo")  # the first in sorted order keeps its key
    monkeypatch.setattr(hashing, "string_key", real)


def test_a_status_that_only_shares_the_truncated_key_is_not_truncated(monkeypatch):
    target = hashing.string_key("response_truncated")
    monkeypatch.setattr(hashing, "string_key", lambda text: target if text in ("response_truncated", "impostor") else 7)
    codes = hashing.exact_codes(["impostor"])
    assert codes[0] != target


def test_group_string_codes_follow_the_strings_not_the_hash(monkeypatch):
    from rescore.transforms.rows.keys import string_codes

    monkeypatch.setattr(hashing, "string_key", lambda text: int(zlib.crc32(text.encode())) + 1)
    codes = string_codes(pa.chunked_array([pa.array(["buckeroo", None, "plumless"]), pa.array(["buckeroo"])]))
    assert codes[0] == codes[3] != codes[2] and codes[1] == 0


def test_a_verifier_number_that_is_no_float_is_one_rejected_row():
    from rescore.transforms.verifier import RewardFn, call_reward_fn

    big = RewardFn("mod:big", lambda: 10**400, ())
    assert call_reward_fn(big, {}) == (None, "model_reward: reward_fn mod:big returned a int that is not a float64 (OverflowError)")
    assert call_reward_fn(RewardFn("mod:ok", lambda: 10**300 // 10**299, ()), {}) == (10.0, None)


def test_text_that_is_not_utf8_is_a_rejected_row_written_readable():
    bad = pa.array([b"ok", b"bad\xff", None], pa.binary()).view(pa.string())
    t = pa.table({"batch": [0, 0, 0], "task": bad, "run": [0, 1, 2], "step": [0, 0, 0], "reward": [1.0, 1.0, 1.0]})
    check = check_rows(t)
    assert check.ok.tolist() == [True, False, False]  # (a null task: null_value)
    assert check.reasons[1] == "bad_task: task is not valid UTF-8 (b'bad\\xff')"
    assert readable_text(t)["task"].to_pylist() == ["ok", "bad\ufffd", None]
    assert np.array_equal(readable_text(t)["run"].to_numpy(), t["run"].to_numpy())


def test_metrics_json_writes_numpy_scalars_as_the_walk_does():
    """metrics_json's fast path (no NaN or infinity: json.dumps at once) gives the text its walk
    gives: numpy scalars as Python numbers, tuples as lists; one NaN takes the walk, listed."""
    import numpy as np

    from rescore.transforms.rows.metrics import metrics_json

    doc = {"a": np.float32(0.1), "b": np.int64(3), "c": [np.float64(1e300), (1, 2)], "d": {"e": 0.5}}
    assert metrics_json(doc) == (
        '{\n  "a": 0.10000000149011612,\n  "b": 3,\n  "c": [\n    1e+300,\n    [\n      1,\n      2\n    ]\n  ],\n'
        '  "d": {\n    "e": 0.5\n  }\n}\n'
    )
    doc["d"]["e"] = np.float32("nan")
    assert json.loads(metrics_json(doc))["d"] == {"e": None} and json.loads(metrics_json(doc))["non_finite_metrics"] == ["d/e"]
