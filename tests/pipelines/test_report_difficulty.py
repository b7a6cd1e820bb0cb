"""The report's difficulty chart: group pass rates against polars, and the chart in the page."""

import os

import numpy as np
import polars as pl
import pytest

from rescore.pipelines.report import PASS_RATE_BINS, group_pass_rates


def test_group_pass_rates_match_polars():
    rng = np.random.default_rng(2)
    n = 500
    batch = rng.integers(0, 5, n)
    task = rng.choice(np.array(["a", "b", "c", "d"], dtype=object), n)
    reward = rng.choice([0.0, 0.5, 1.0], n)
    gb, rate = group_pass_rates(batch, task, reward, 0.5)
    want = (pl.DataFrame({"batch": batch, "task": task.astype(str), "reward": reward})
            .group_by("batch", "task").agg(p=(pl.col("reward") >= 0.5).mean()).sort("batch", "p"))
    got = pl.DataFrame({"batch": gb, "p": rate}).sort("batch", "p")
    assert got["batch"].to_list() == want["batch"].to_list()
    assert np.allclose(got["p"].to_numpy(), want["p"].to_numpy(), rtol=0, atol=1e-15)
    counts, _ = np.histogram(rate, bins=PASS_RATE_BINS)
    assert counts.sum() == len(rate) and counts[-1] == (rate >= 0.9).sum()  # 1.0 lands in the last bin


@pytest.mark.slow
def test_the_report_has_the_difficulty_chart(tmp_path):
    from rescore.pipelines.cli import main
    from rescore.pipelines.sample import main as sample

    assert sample(["--output", str(tmp_path / "data"), "--batches", "2", "--tasks", "3"]) == 0
    out = str(tmp_path / "out")
    assert main(["--input", str(tmp_path / "data" / "*.parquet"), "--output", out, "--strategy", "grpo", "--quiet",
                 "--runner=FnApiRunner"]) == 0
    assert main(["report", out]) == 0
    png = os.path.join(out, "report-difficulty.png")
    assert open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    assert "Task difficulty" in open(os.path.join(out, "report.html"), encoding="utf-8").read()
