"""`rescore report` over real runs: its numbers equal metrics.json, extra reward columns get a
chart, a rerun with --overwrite never leaves a stale report, a report deletes only the files a
report wrote, an incremental table is reported batch for batch as one run, and filtered files
Rescore did not write are one line."""

from __future__ import annotations

import glob
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import pytest

from batched import forked_run as _forked
from conftest import RUNNER


@pytest.mark.slow
def test_rerun_with_overwrite_removes_the_old_report(sample_input, tmp_path):
    from rescore.pipelines.cli import main

    out = str(tmp_path / "out")
    assert main(["--input", sample_input, "--output", out, RUNNER, "--quiet", "--strategy", "grpo", "--keep-filtered"]) == 0
    assert main(["report", out]) == 0
    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    assert "strategy <code>grpo</code>" in page
    assert main(["--input", sample_input, "--output", out, RUNNER, "--quiet", "--strategy", "rloo", "--overwrite"]) == 0
    left = sorted(os.listdir(out))
    assert not [n for n in left if n.startswith("report")], left  # nothing describes the old run
    assert main(["report", out]) == 0
    import json

    page = open(os.path.join(out, "report.html"), encoding="utf-8").read()
    doc = json.load(open(os.path.join(out, "metrics.json")))
    assert "strategy <code>rloo</code>" in page and "grpo" not in page
    assert f'<meta name="rescore-config-hash" content="{doc["config_hash"]}">' in page


@pytest.mark.slow
def test_report_numbers_match_metrics_json(sample_input, tmp_path):
    """The chart data: dead share from metrics.json, solved shares and sizes from the rows."""
    from rescore.pipelines.report import Bins, group_table, load_metrics, read_run
    from rescore.pipelines.cli import main

    out = str(tmp_path / "out")
    assert main(["--input", sample_input, "--output", out, RUNNER, "--quiet", "--strategy",
                 "reward_variance,grpo,duplicate_informative", "--keep-filtered"]) == 0
    doc, data = load_metrics(out), read_run(out)
    t = doc["totals"]
    assert len(data.batch) == t["rows_written_original"]  # copies left out
    assert len(data.filtered_batch) == t["rows_filtered"] == sum(data.filter_reasons.values())
    gb, sizes, lo, hi = group_table(
        np.concatenate([data.batch, data.filtered_batch]),
        np.concatenate([data.task.astype(str), data.filtered_task.astype(str)]),
        np.concatenate([data.reward, data.filtered_reward]),
    )
    assert len(gb) == t["groups"] and sizes.sum() == t["rows_read"]
    assert int((lo == hi).sum()) == t["groups_zero_std"]  # dead groups, computed both ways
    bins = Bins.of(list(range(1000)))
    assert len(bins.edges) == 40 and bins.edges[0] == (0, 24) and bins.edges[-1] == (975, 999)
    assert "40 bins of up to 25 consecutive batches" in bins.note()
    assert Bins.of([7]).edges == [(7, 7)] and Bins.of([7]).note() == ""


@pytest.mark.slow
def test_report_draws_extra_reward_columns(tmp_path):
    """A model stage or a second reward column gets its own distribution chart."""
    from rescore.pipelines.cli import main
    from rescore.pipelines.sample import make_experience

    table = make_experience(batches=2, tasks=4, runs=4, seed=2)
    rm = np.linspace(-3.0, 3.0, table.num_rows)
    table = table.append_column("rm_score", __import__("pyarrow").array(rm))
    (tmp_path / "in").mkdir()
    pq.write_table(table, str(tmp_path / "in" / "part.parquet"))
    out = str(tmp_path / "out")
    assert main(["--input", str(tmp_path / "in" / "*.parquet"), "--output", out, RUNNER, "--quiet", "--strategy", "grpo"]) == 0
    assert main(["report", out]) == 0
    from rescore.pipelines.report import read_run

    data = read_run(out)
    assert sorted(data.extra) == ["rm_score"] and sorted(data.extra["rm_score"]) == pytest.approx(rm)
    assert os.path.getsize(os.path.join(out, "report-columns.png")) > 5000
    assert "Columns: rm_score;" in open(os.path.join(out, "report.html"), encoding="utf-8").read()


@pytest.mark.slow
def test_report_deletes_only_the_files_a_report_wrote(forked, sample_input, tmp_path):
    """Other report-*.png files (beside the data or in --to) and a foreign report.html stay."""
    from rescore.pipelines.cli import main

    out = str(tmp_path / "out1")
    assert main(["--input", sample_input, "--output", out, RUNNER, "--quiet", "--strategy", "grpo"]) == 0
    docs = tmp_path / "mydocs"
    docs.mkdir()
    (docs / "report-q3-summary.png").write_text("x")
    with open(os.path.join(out, "report-mine.png"), "w") as f:
        f.write("mine")
    for args in (["report", out, "--to", str(docs)], ["report", out], ["report", out]):  # twice: a rerun too
        assert main(args) == 0
    assert (docs / "report-q3-summary.png").read_text() == "x"
    assert open(os.path.join(out, "report-mine.png")).read() == "mine"
    assert os.path.getsize(docs / "report-reward.png") > 1000 and os.path.getsize(os.path.join(out, "report-reward.png")) > 1000
    (docs / "report.html").write_text("<html>my own page</html>")
    p = _forked(forked, "report", out, "--to", str(docs))
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2 and len(lines) == 1 and lines[0].startswith("rescore: error: ")
    assert "is not a Rescore report" in lines[0]
    assert (docs / "report.html").read_text() == "<html>my own page</html>"
    assert (docs / "report-q3-summary.png").read_text() == "x"


@pytest.mark.slow
def test_report_on_an_incremental_table(forked, sample_input, tmp_path):
    """`rescore report TABLE`: each batch's metrics from the committed run that last scored it;
    two incremental runs (the second adds batches) report what one one-shot run over the same
    input reports, batch for batch and in total."""
    import shutil

    from rescore.pipelines.report import load_metrics
    from rescore.pipelines.cli import main

    src = tmp_path / "in"
    src.mkdir()
    for path in glob.glob(sample_input):
        shutil.copy(path, src)
    table = str(tmp_path / "inc")
    args = [RUNNER, "--quiet", "--strategy", "grpo"]
    assert main(["--input", str(src / "*.parquet"), "--output", table, *args, "--incremental"]) == 0
    first = pq.read_table(sorted(glob.glob(str(src / "*.parquet")))[0])
    later = first.set_column(first.schema.get_field_index("batch"), "batch", pa.compute.add(first["batch"], 100))
    pq.write_table(later, src / "later.parquet")
    assert main(["--input", str(src / "*.parquet"), "--output", table, *args, "--incremental"]) == 0
    assert main(["--input", str(src / "*.parquet"), "--output", str(tmp_path / "once"), *args]) == 0
    once = json.load(open(tmp_path / "once" / "metrics.json"))
    doc = load_metrics(table)
    assert doc["incremental_runs"] == 2 and doc["table_version"] == 1
    assert [b["batch"] for b in doc["batches"]] == [b["batch"] for b in once["batches"] if b["batch"] is not None]
    assert doc["batches"] == [b for b in once["batches"] if b["batch"] is not None]
    for key in ("rows_read", "rows_written", "rows_rejected", "groups", "groups_filtered"):
        assert doc["totals"][key] == once["totals"][key], key
    assert doc["totals"]["group_advantages/reward_mean/mean"] == pytest.approx(once["totals"]["group_advantages/reward_mean/mean"])
    p = _forked(forked, "report", table)
    assert p.returncode == 0, p.stderr
    page = open(os.path.join(table, "report.html"), encoding="utf-8").read()
    assert f"{len(doc['batches'])} batches" in page and os.path.getsize(os.path.join(table, "report-reward.png")) > 1000


@pytest.mark.slow
def test_report_on_filtered_files_rescore_did_not_write_is_one_line(forked, sample_input, tmp_path):
    from rescore.pipelines.cli import main

    out = str(tmp_path / "out")
    assert main(["--input", sample_input, "--output", out, RUNNER, "--strategy", "grpo", "--quiet"]) == 0
    import pyarrow as pa

    pq.write_table(pa.table({"batch": [0]}), os.path.join(out, "filtered-00000-of-00001.parquet"))  # no filter_reason
    p = _forked(forked, "report", out)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"rescore: error: {out}: its filtered-*.parquet lack task, reward, filter_reason: not files Rescore wrote"
    ]
