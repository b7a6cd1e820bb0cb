"""--group-filter MODULE:FUNCTION (`group_filter`): the function's view of a group, keep / drop /
reasons, a function that raises drops its group with the error (the run goes on), a spec that
does not import is one line and exit 2 before any work."""

from __future__ import annotations

import sys
import textwrap

import pyarrow as pa
import pytest
import torch

from rescore.errors import ConfigError
from rescore.transforms.strategies import chain_of
from rescore.transforms.strategies.base import GroupedRows

USER_MODULE = '''
import numpy as np
SEEN = []

def spread(group):
    SEEN.append(group)
    if group["reward"].max() > 5:
        raise ValueError("reward out of range\\nsecond line")
    if np.ptp(group["reward"]) == 0:
        return False, f"all {len(group['reward'])} rewards equal"
    return bool(group["reward"].mean() < 0.9)

def not_a_bool(group):
    return "yes"
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_group_filters.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("my_group_filters", None)  # the module as this test wrote it
    return tmp_path


def rows(groups):
    reward, offsets = [], [0]
    for g in groups:
        reward += g
        offsets.append(offsets[-1] + len(g))
    n = len(reward)
    i64 = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    return GroupedRows(reward=torch.tensor(reward, dtype=torch.float64), offsets=i64(offsets), batch=i64([3] * n),
                       run=i64(list(range(n))), step=i64([0] * n), action_tokens=i64([2] * n), response_length=i64([4] * n),
                       task_key=i64([7] * n), columns={"q": torch.tensor([float(i) for i in range(n)], dtype=torch.float64)})


def test_keep_drop_reasons_and_errors(user_module):
    import my_group_filters

    r = rows([[0.0, 1.0], [1.0, 1.0], [1.0, 9.0], [1.0, 0.9]])
    plan = chain_of("group_filter,grpo", {"function": "my_group_filters:spread", "columns": ["q"]})
    s = plan.score(r)
    assert s.keep.tolist() == [True, True, False, False, False, False, False, False]
    first = my_group_filters.SEEN[0]
    assert first["batch"] == 3 and first["task_key"] == 7 and first["run"].tolist() == [0, 1]
    assert first["reward"].tolist() == [0.0, 1.0] and first["q"].tolist() == [0.0, 1.0] and first["response_length"].tolist() == [4, 4]
    f = plan.stage("filter")
    reasons = f.drop_reasons(r, s.keep.numpy() | True, [2, 4, 6], None)
    assert reasons == [
        "group_filter: all 2 rewards equal",
        "group_filter: raised ValueError: reward out of range",
        "group_filter: my_group_filters:spread dropped the group",
    ]
    bad = chain_of("group_filter", {"function": "my_group_filters:not_a_bool"})
    assert not bad.score(r).keep.any()
    assert bad.stage("filter").drop_reasons(r, None, [0], None) == ["group_filter: returned str, expected bool or (bool, reason)"]
    assert chain_of("group_filter").score(r).keep.all()  # no function: every group kept


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_colon", "--group-filter expects module:function, got 'no_colon'"),
        ("no_such_module_xyz:f", "--group-filter no_such_module_xyz:f: cannot import no_such_module_xyz (ModuleNotFoundError"),
        ("my_group_filters:missing", "--group-filter my_group_filters:missing: my_group_filters has no function 'missing'"),
    ],
)
def test_bad_spec_is_a_config_error(user_module, spec, message):
    with pytest.raises(ConfigError) as e:
        chain_of("group_filter,grpo", {"function": spec})
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_cli_refuses_a_second_filter():
    from rescore.pipelines.config import parse_args

    with pytest.raises(ConfigError, match="already has one \\(reward_variance\\)"):
        parse_args(["--input", "x", "--output", "y", "--strategy", "reward_variance,grpo", "--group-filter", "os:getcwd"])
    rc = parse_args(["--input", "x", "--output", "y", "--strategy", "reward_shaping,grpo", "--group-filter", "os.path:exists"])
    assert rc.strategies == ["reward_shaping", "group_filter", "grpo"] and rc.params["group_filter.function"] == "os.path:exists"
