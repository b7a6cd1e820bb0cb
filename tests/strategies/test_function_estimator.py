"""Estimators declared as one function (function_estimator.py): inputs named from GroupedRows'
fields and checked where they register, needs implied by the inputs, the audit baseline
function, pickling; and the shipped ones converted to it keep their scores and audit baselines."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import torch

from rescore.transforms.strategies import GroupedRows, create, names, registry
from rescore.transforms.strategies.function_estimator import FunctionEstimator, estimator
from rescore.transforms.strategies.registry import param

F64 = torch.float64


def grouped(rewards, sizes, *, tokens=None, mean_logprob=None):
    n = len(rewards)
    return GroupedRows(
        reward=torch.tensor(rewards, dtype=F64),
        offsets=torch.tensor([0, *np.cumsum(sizes).tolist()]),
        batch=torch.zeros(n, dtype=torch.int64),
        run=torch.arange(n),
        step=torch.zeros(n, dtype=torch.int64),
        action_tokens=torch.tensor(tokens if tokens is not None else [1] * n),
        mean_logprob=None if mean_logprob is None else torch.tensor(mean_logprob, dtype=F64),
    )


def length_weighted(reward, offsets, action_tokens, mean_logprob, *, power: float = param(1.0, help="exponent of the token count")):
    """A test's toy: r * tokens^power + mean_logprob, reading four inputs in its own order."""
    return reward * action_tokens.to(F64) ** power + mean_logprob


def toy_baseline(reward, group_mean, *, power: float):
    return group_mean * power


@pytest.fixture
def toy():
    estimator("toy_length_weighted", summary="a test's toy", needs=("acc",), baseline=toy_baseline)(length_weighted)
    yield length_weighted
    registry.unregister("toy_length_weighted")


def test_inputs_are_passed_by_name_and_imply_their_columns(toy):
    s = create("toy_length_weighted", {"power": 2.0})
    assert isinstance(s, FunctionEstimator) and s.needs == ("logprobs", "acc")
    rows = grouped([1.0, 2.0, 3.0], [2, 1], tokens=[1, 2, 3], mean_logprob=[-0.5, -0.25, 0.0])
    out = s.score(rows, None)
    assert out.score.tolist() == [0.5, 7.75, 27.0]
    assert out.keep.tolist() == [True] * 3
    assert out.group_mean.tolist() == [1.5, 0.0] and out.group_std.tolist() == pytest.approx([math.sqrt(0.5), 1.0])
    assert s.audit_baseline(rows, np.array([1.5, 1.5, 0.0])).tolist() == [3.0, 3.0, 0.0]
    assert length_weighted.__kwdefaults__ == {"power": 1.0}  # called directly: the plain default


def test_the_generated_classes_pickle_by_name(toy):
    s = create("toy_length_weighted", {"power": 0.5})
    assert type(s).__qualname__ == "length_weighted.strategy"
    assert pickle.loads(pickle.dumps(s)) == s
    for name in ("reinforce", "constant", "opmd", "asymre", "dr_grpo", "opo", "grpo_passk", "maxrl"):
        shipped = create(name)
        assert isinstance(shipped, FunctionEstimator), name
        again = pickle.loads(pickle.dumps(shipped))
        assert type(again) is type(shipped) and again.params == shipped.params


@pytest.mark.parametrize(
    "fn, kwargs, message",
    [
        (lambda reward, rewards: reward, {}, r"takes positional inputs named from reward, offsets, .*\('rewards' is not an input\)"),
        (lambda *, w=param(1.0, help="w"): w, {}, r"\(it reads no input\)"),
        (lambda reward, *args: reward, {}, r"takes named inputs and parameters, not \*args"),
        (lambda reward, *, w=param(1.0): reward, {}, r"^strategy 'bad_toy': parameter 'w' has no help"),
        (lambda reward, *, w=param(1.0, help="w"): reward, {"baseline": lambda reward, *, v: reward},
         r"baseline <lambda> takes 'v', which is not one of its parameters"),
        (lambda reward, *, w=param(1.0, help="w"): reward, {"baseline": lambda score: score},
         r"\('score' is not an input\)"),
    ],
)
def test_a_bad_declaration_is_refused_where_it_registers(fn, kwargs, message):
    fn.__annotations__.update({k: float for k in (fn.__kwdefaults__ or {})})
    with pytest.raises(TypeError, match=message):
        estimator("bad_toy", summary="", **kwargs)(fn)
    assert "bad_toy" not in names()


def test_the_converted_estimators_keep_their_scores_and_audit_baselines():
    rows = grouped([1.0, 3.0, 2.0, 5.0, 0.5, 0.5], [3, 1, 2], tokens=[1, 3, 0, 2, 4, 4])
    mean = np.array([2.0, 2.0, 2.0, 5.0, 0.5, 0.5])  # the group mean per row, as the audit step hands it

    def run(name, params=None):
        s = create(name, params)
        return s.score(rows, None).score.tolist(), s.audit_baseline(rows, mean).tolist()

    assert run("reinforce") == ([1.0, 3.0, 2.0, 5.0, 0.5, 0.5], [0.0] * 6)
    score, baseline = run("constant", {"weight": 0.5})
    assert score == [0.5] * 6 and all(math.isnan(b) for b in baseline)
    assert run("opmd") == ([-1.0, 1.0, 0.0, 5.0, 0.0, 0.0], [2.0, 2.0, 2.0, 0.0, 0.5, 0.5])
    score, baseline = run("opmd", {"opmd_baseline": "logavgexp", "tau": 0.5})
    b = 0.5 * (math.log(math.exp(2) + math.exp(6) + math.exp(4)) - math.log(3))
    assert score == pytest.approx([1.0 - b, 3.0 - b, 2.0 - b, 5.0, 0.0, 0.0]) and baseline == pytest.approx([b, b, b, 0.0, 0.5, 0.5])
    assert run("asymre") == (pytest.approx([-0.9, 1.1, 0.1, 5.0, 0.1, 0.1]), pytest.approx([1.9, 1.9, 1.9, 0.0, 0.4, 0.4]))
    # opo: (1*1 + 3*3 + 2*0) / 4 = 2.5 in the first group
    assert run("opo") == ([-1.5, 0.5, -0.5, 5.0, 0.0, 0.0], [2.5, 2.5, 2.5, 0.0, 0.5, 0.5])
    score, baseline = run("grpo_passk", {"norm_adv_by_std_in_grpo": False})
    assert score == [0.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert baseline[1] == 2.0 and baseline[4] == 0.5 and sum(math.isnan(v) for v in baseline) == 4
