"""Adding an estimator is one function: a toy estimator declared and registered here, in the test
module (function_estimator.estimator, as docs/architecture.md walks it), is listed, checked,
documented and run end to end by the `rescore` command like a shipped one."""

from __future__ import annotations

import contextlib
import io
from collections import defaultdict

import numpy as np
import pytest

from data import random_rows, read_output, write_parquet
from rescore.pipelines import listings, strategy_docs
from rescore.pipelines.cli import main
from rescore.transforms.strategies import create, names, registry
from rescore.transforms.strategies.function_estimator import estimator
from rescore.transforms.strategies.registry import param
from rescore.transforms.strategies.segments import per_row, segment_max

NAME = "toy_max_gap"


def toy_max_gap(reward, offsets, *, scale: float = param(2.0, positive=True, help="multiplies the gap to the group's best reward")):
    """(n,) scale * (r - max(G)): the best row of each group scores 0, the others below it."""
    return scale * (reward - per_row(segment_max(reward, offsets), offsets))


@pytest.fixture(scope="module")
def toy():
    """The toy registered for this module only (the registry is the process's: other test
    modules must not see it)."""
    estimator(NAME, summary="scale * (r - max(G)) (a test's toy)")(toy_max_gap)
    yield toy_max_gap
    registry.unregister(NAME)


def test_the_toy_is_a_strategy_like_a_shipped_one(toy):
    assert NAME in names()
    assert create(NAME).params == {"scale": 2.0}
    with pytest.raises(registry.ConfigError, match=rf"^{NAME}: parameter 'scale' must be > 0, got -1$"):
        create(NAME, {"scale": -1})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert listings.strategies([NAME]) == 0
    assert out.getvalue().splitlines()[-2:] == ["  scale: float = 2.0", "      multiplies the gap to the group's best reward"]
    assert f"| `{NAME}` | advantage | `scale` (2.0) | scale * (r - max(G)) (a test's toy) |" in strategy_docs.strategies_table()


def test_the_toy_scores_a_run_end_to_end(toy, rescore, tmp_path):
    rows = random_rows(7, batches=2, max_tasks=4)
    doc, out = rescore(write_parquet(rows, str(tmp_path / "in")), "--strategy", NAME, "--set", "scale=0.5")
    best = defaultdict(lambda: -np.inf)
    for r in rows:
        best[r["batch"], r["task"]] = max(best[r["batch"], r["task"]], r["reward"])
    written = read_output(out).to_pylist()
    assert len(written) == len(rows) and doc["totals"]["rows_written"] == len(rows)
    for w in written:
        expected = 0.5 * (w["reward"] - best[w["batch"], w["task"]])
        assert w["advantages"] == pytest.approx([expected * m for m in w["action_mask"]], abs=1e-6)
    assert min(w["advantages"][i] for w in written for i in range(len(w["advantages"])) if w["action_mask"][i]) < 0


def test_a_bad_toy_parameter_is_exit_2_before_work(toy, tmp_path, capsys):
    assert main(["--input", str(tmp_path / "none" / "*.parquet"), "--output", str(tmp_path / "out"),
                 "--strategy", NAME, "--set", "scale=0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"rescore: error: {NAME}: parameter 'scale' must be > 0, got 0"]
    assert not (tmp_path / "out").exists()
