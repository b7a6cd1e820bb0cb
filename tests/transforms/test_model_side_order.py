"""The model stage's side file does not depend on the order in which Beam delivers a read unit's
records (issue 28, defect 1): a verifier's reject reasons survive whether the unit record comes
before or after the row results. Both orders are forced here, not left to chance."""

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rescore.schemas import check_rows
from rescore.transforms.models import _WriteModelColumns, side_file
from rescore.transforms.rows.model_columns import MODEL_REJECT, UNIT_RECORD, apply_model_rejects, join_model_columns, unit_side_table

FAILED = "model_reward: reward_fn v:fn raised ValueError: no answer"
UNIT = (UNIT_RECORD, 4, {3: "model_context: 40 tokens, more than the model's context of 32"})
RESULTS = [("reward_fn", 0, 1.5, None), ("reward_fn", 1, None, FAILED), ("reward_fn", 2, -0.25, None)]


def _expected():
    return {
        "reward": [1.5, None, -0.25, None],
        MODEL_REJECT: [None, FAILED, None, UNIT[2][3]],
    }


@pytest.mark.parametrize("order", list(itertools.permutations(range(4))))
def test_side_table_is_the_same_in_every_arrival_order(order):
    items = [([UNIT] + RESULTS)[i] for i in order]
    side = unit_side_table(items, ("reward",))
    assert side["row"].to_pylist() == [0, 1, 2, 3]
    assert {k: side[k].to_pylist() for k in ("reward", MODEL_REJECT)} == _expected()


@pytest.mark.parametrize("unit_first", [True, False], ids=["unit-record-first", "unit-record-last"])
def test_write_step_keeps_the_verifier_rejects_in_both_orders(tmp_path, unit_first):
    """The DoFn itself, fed the unit record first and last: the failed row is rejected with the
    verifier's reason, never scored with its logged reward."""
    items = [UNIT, *RESULTS] if unit_first else [*RESULTS, UNIT]
    staging = str(tmp_path / "_staging")
    assert list(_WriteModelColumns(staging, ("reward",)).process((7, iter(items)))) == [7]
    side = pq.read_table(side_file(staging, 7))
    assert {k: side[k].to_pylist() for k in ("reward", MODEL_REJECT)} == _expected()
    logged = pa.table({
        "batch": [0] * 4, "task": [1] * 4, "run": [0, 1, 2, 3], "step": [0] * 4, "reward": [9.0, 9.0, 9.0, 9.0],
    })
    joined = join_model_columns(logged, side)
    check = apply_model_rejects(joined, check_rows(joined))
    assert check.ok.tolist() == [True, False, True, False]
    assert check.reasons[1] == FAILED
    assert joined["reward"].to_pylist()[0] == 1.5 and joined["reward_original"].to_pylist() == [9.0] * 4


def test_two_models_failing_on_one_row_give_the_first_columns_reason_in_any_order():
    teacher = ("teacher_logprobs", 0, None, "model_context: teacher")
    reward = ("reward_fn", 0, None, "model_reward: verifier")
    unit = (UNIT_RECORD, 1, {})
    for items in itertools.permutations([unit, teacher, reward]):
        side = unit_side_table(items, ("teacher_logprobs", "reward"))
        assert side[MODEL_REJECT].to_pylist() == ["model_context: teacher"]


def test_a_unit_without_its_record_or_with_two_is_an_internal_error():
    with pytest.raises(RuntimeError, match="0 unit records"):
        unit_side_table(RESULTS, ("reward",))
    with pytest.raises(RuntimeError, match="2 unit records"):
        unit_side_table([UNIT, UNIT], ("reward",))
    with pytest.raises(RuntimeError, match="row 9"):
        unit_side_table([UNIT, ("reward_fn", 9, 1.0, None)], ("reward",))


def test_list_columns_are_null_on_rejected_rows():
    items = [("logprobs", 1, np.array([-1.0, -2.0], np.float32), None), ("logprobs", 0, None, "model_input: x"), (UNIT_RECORD, 2, {})]
    side = unit_side_table(items, ("logprobs",))
    assert side["logprobs"].to_pylist() == [None, [-1.0, -2.0]]


FAILING = '''
import math

def judge(response_tokens, run, task):
    if run == 0:
        raise ValueError("cannot parse")
    if run == 1:
        return {0: math.nan, 1: math.inf, 2: None}[task % 3]
    if run == 2:
        return "0.5"
    return float(len(response_tokens)) + task
'''


@pytest.mark.slow
@pytest.mark.parametrize("timeout", ["0", "30"], ids=["in-process", "worker-process"])
def test_a_failing_verifier_rejects_its_rows_in_the_whole_pipeline(tmp_path, monkeypatch, rescore, timeout):
    """End to end, over several read units: every row the verifier fails on (raises, NaN, inf,
    None, a string) is rejected with the reason; no row keeps its logged reward."""
    from data import read_output

    (tmp_path / "failing_verifier.py").write_text(FAILING)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [
        {"batch": b, "task": t, "run": r, "step": 0, "reward": 100.0, "tokens": list(range(1, 3 + r)), "prompt_length": 1,
         "logprobs": [-0.5] * (1 + r), "action_mask": [True] * (1 + r)}
        for b in range(2) for t in range(3) for r in range(5)
    ]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "in" / "x.parquet"), row_group_size=4)
    doc, out = rescore(str(tmp_path / "in" / "x.parquet"), "--strategy", "grpo", "--shard-rows", "4", "--max-reject-fraction", "0.9",
                       "--reward-fn", "failing_verifier:judge", "--reward-fn-timeout", timeout)
    rejected = {(r["batch"], r["task"], r["run"]): r["reject_reason"] for r in read_output(out, "rejected").to_pylist()}
    assert len(rejected) == 18 and doc["totals"]["rows_rejected"] == 18
    for (b, t, r), reason in rejected.items():
        assert reason.startswith("model_reward: reward_fn failing_verifier:judge ") and r in (0, 1, 2), reason
    scored = read_output(out).to_pylist()
    assert len(scored) == 12 and all(s["run"] in (3, 4) for s in scored)
    assert all(s["reward"] == float(s["run"] + 1 + s["task"]) and s["reward_original"] == 100.0 for s in scored)
