"""--group-filter MODULE:FUNCTION (`group_filter`): the function's view of a group, keep / drop /
reasons, a function that raises drops its group with the error (the run goes on), a spec that
does not import is one line and exit 2 before any work."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pyarrow as pa
import pytest
import torch

from rescore.errors import ConfigError
from rescore.transforms.strategies import chain_of
from rescore.transforms.strategies.base import GroupedRows

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
    sys.modules.pop("my_group_filters", None)
    from rescore.transforms.strategies import user_filter

    user_filter._LOADED.clear()
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


def test_cli_bad_spec_exits_2_with_one_line_before_any_work(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "rescore", "--input", str(tmp_path / "none" / "*.parquet"), "--output", str(out),
         "--strategy", "grpo", "--group-filter", "no_such_module_xyz:keep", "--runner=FnApiRunner", "--quiet"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rescore: error: --group-filter no_such_module_xyz:keep: cannot import"), proc.stderr
    assert not out.exists()


def test_cli_refuses_a_second_filter():
    from rescore.pipelines.config import parse_args

    with pytest.raises(ConfigError, match="already has one \\(reward_variance\\)"):
        parse_args(["--input", "x", "--output", "y", "--strategy", "reward_variance,grpo", "--group-filter", "os:getcwd"])
    rc = parse_args(["--input", "x", "--output", "y", "--strategy", "reward_shaping,grpo", "--group-filter", "os.path:exists"])
    assert rc.strategies == ["reward_shaping", "group_filter", "grpo"] and rc.params["group_filter.function"] == "os.path:exists"


def test_group_filter_through_the_job(user_module, rescore, tmp_path):
    from data import SCHEMA_INT_TASK, by_id, read_output, write_parquet

    groups = {0: [0.0, 1.0], 1: [1.0, 1.0], 2: [1.0, 9.0], 3: [0.0, 0.5, 1.0]}
    data = [{"batch": 0, "task": t, "run": r, "step": 0, "reward": x, "tokens": [1, 2], "prompt_length": 1,
             "logprobs": [-0.5], "action_mask": [True], "note": None} for t, g in groups.items() for r, x in enumerate(g)]
    glob = write_parquet(data, str(tmp_path / "in"), files=2, schema=SCHEMA_INT_TASK)
    doc, out = rescore(glob, "--strategy", "grpo", "--group-filter", "my_group_filters:spread", "--keep-filtered")
    scored, filtered = by_id(read_output(out)), by_id(read_output(out, "filtered"))
    assert {k[1] for k in scored} == {0, 3} and {k[1] for k in filtered} == {1, 2}
    assert {k[1]: v["filter_reason"] for k, v in filtered.items()} == {
        1: "group_filter: all 2 rewards equal", 2: "group_filter: raised ValueError: reward out of range"}
    assert doc["totals"]["rows_filtered"] == 4
    assert scored[(0, 3, 2, 0)]["score"] == pytest.approx(1.0, abs=1e-5)  # GRPO over the kept group: (1 - 0.5) / 0.5
