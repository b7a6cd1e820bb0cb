"""The score step on numpy (transforms/host_math.py; on unless RESCORE_HOST_MATH=0): which runs take it,
and that they write what the torch path writes, file for file."""

import json
import os

import pytest

from data import random_rows, write_parquet
from rescore.errors import ConfigError
from rescore.transforms import device as devices
from rescore.transforms import host_math
from rescore.transforms.settings import StepSettings
from rescore.transforms.strategies import chain_of


@pytest.mark.parametrize(
    ("strategy", "params", "settings", "expected"),
    [
        ("grpo", {}, {}, True),
        ("grpo", {"std_threshold": 0.1, "epsilon": 0.0}, {}, True),
        ("grpo", {"std_cal_level": "batch"}, {}, True),
        ("grpo", {"rank_penalty": 0.25}, {}, False),
        ("correct_bias", {}, {}, False),
        ("rloo", {}, {}, False),  # no numpy implementation
        ("reward_variance,grpo", {}, {}, False),  # a filter before it
        ("grpo", {}, {"audit_columns": True}, False),
        ("grpo", {}, {"keep_filtered": True}, False),
        ("grpo", {}, {"device": "cuda"}, False),
    ],
)
def test_which_runs_score_on_numpy(monkeypatch, strategy, params, settings, expected):
    monkeypatch.setenv(host_math.SWITCH, "1")
    assert host_math.eligible(chain_of(strategy, params), StepSettings(**settings)) is expected
    monkeypatch.setenv(host_math.SWITCH, "0")
    assert host_math.eligible(chain_of(strategy, params), StepSettings(**settings)) is False


def test_a_bad_switch_is_a_config_error(monkeypatch):
    monkeypatch.setenv(host_math.SWITCH, "yes")
    with pytest.raises(ConfigError, match=r"^RESCORE_HOST_MATH must be 0 or 1, got 'yes'$"):
        host_math.eligible(chain_of("grpo"), StepSettings())


def test_a_bad_switch_is_one_line_and_exit_2_before_any_work(monkeypatch, tmp_path, capsys):
    from conftest import RUNNER
    from rescore.pipelines.cli import main

    inputs = write_parquet(random_rows(1, batches=1), str(tmp_path / "in"), files=1)
    monkeypatch.setenv(host_math.SWITCH, "yes")
    code = main(["--input", inputs, "--output", str(tmp_path / "out"), "--strategy", "grpo", RUNNER])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and lines == ["rescore: error: RESCORE_HOST_MATH must be 0 or 1, got 'yes'"]
    assert not (tmp_path / "out").exists()


def test_the_device_is_decided_without_torch_where_it_is_not_imported(monkeypatch):
    import sys

    assert devices.host_only("cpu") is True and devices.host_only("cuda") is False
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.setattr("glob.glob", lambda pattern: [])
    assert devices.host_only("auto") is True
    monkeypatch.setattr("glob.glob", lambda pattern: ["/dev/nvidia0"] if pattern.startswith("/dev/nvidia") else [])
    assert devices.host_only("auto") is False  # a GPU device: torch decides, on the torch path


def _files(out):
    found = {}
    for name in sorted(os.listdir(out)):
        with open(os.path.join(out, name), "rb") as f:
            found[name] = f.read()
    doc = json.loads(found.pop("metrics.json"))
    doc.pop("output", None)
    return found, doc


@pytest.mark.parametrize("option", ["std_threshold=0.5", "std_cal_level=batch"])
def test_numpy_scores_write_what_torch_writes(monkeypatch, tmp_path, rescore, option):
    """Every file byte for byte and metrics.json (but its output path): scored and filtered
    rows (std_threshold drops groups of one and of a std <= 0.5), the batch std, zero-spread
    groups, -0.0, a reward of 1e300 (its group scaled: segments._group_scale)."""
    rows = random_rows(3, batches=3, max_tasks=9, max_runs=7)
    rows[0]["reward"], rows[1]["reward"] = -0.0, 1e300  # negative zero, a huge value
    inputs = write_parquet(rows, str(tmp_path / "in"))
    outputs = {}
    for switch in ("0", "1"):
        monkeypatch.setenv(host_math.SWITCH, switch)
        _, out = rescore(inputs, "--strategy", "grpo", "--device", "cpu", "--set", option, output=str(tmp_path / switch))
        outputs[switch] = _files(out)
    assert outputs["1"] == outputs["0"]
    files, doc = outputs["1"]
    assert any(n.startswith("scored-") for n in files)
    assert doc["totals"]["rows_written"] > 0
    assert doc["totals"]["rows_filtered"] > 0 if option.startswith("std_threshold") else doc["params"]["grpo"]["std_cal_level"] == "batch"
