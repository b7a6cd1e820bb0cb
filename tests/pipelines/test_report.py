"""`rescore report`: the charts and the HTML page of a real run, with the numbers of metrics.json."""

import json
import os

import pytest
from data import SCHEMA_MULTI_STEP, multi_step_rows, write_parquet

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from rescore.pipelines.cli import run

    d = tmp_path_factory.mktemp("report")
    rows = multi_step_rows(8, batches=4)
    rows[0]["reward"] = float("nan")
    rows[1]["logprobs"] = rows[1]["logprobs"] + [-1.0]
    glob = write_parquet(rows, str(d / "in"), files=2, row_group_size=9, schema=SCHEMA_MULTI_STEP)
    run(["--input", glob, "--output", str(d / "out"), "--runner=FnApiRunner",
         "--strategy", "reward_variance,grpo,duplicate_informative"])
    return str(d / "out")


@pytest.mark.slow
def test_report_writes_valid_pngs_and_html_with_the_metrics(finished_run, capsys):
    from rescore.pipelines.cli import main

    assert main(["report", finished_run]) == 0
    assert "report written to" in capsys.readouterr().err
    for name in ("reward", "groups", "scores", "rejects"):
        with open(os.path.join(finished_run, f"report-{name}.png"), "rb") as f:
            data = f.read()
        assert data.startswith(PNG) and len(data) > 5000, name
    page = open(os.path.join(finished_run, "report.html"), encoding="utf-8").read()
    assert page.startswith("<!doctype html>") and page.rstrip().endswith("</html>")
    pngs = [n for n in os.listdir(finished_run) if n.startswith("report-") and n.endswith(".png")]
    assert page.count('src="data:image/png;base64,') == len(pngs) >= 6  # self-contained
    doc = json.load(open(os.path.join(finished_run, "metrics.json")))
    t = doc["totals"]
    for key in ("rows_read", "rows_written", "rows_duplicated", "rows_filtered", "rows_rejected", "groups_zero_std"):
        assert f"<th>{key}</th><td>{t[key]:,}</td>" in page, key
    for reason, count in t["reject_reasons"].items():
        assert f"<th>{reason}</th><td>{count:,}</td>" in page
    for b in doc["batches"]:
        assert f"<tr><td>{b['batch']}</td><td>{b['rows_read']:,}</td>" in page
    assert doc["config_hash"][:16] in page


@pytest.mark.slow
def test_report_elsewhere_and_on_a_directory_without_a_run(finished_run, tmp_path, capsys):
    from rescore.pipelines.cli import main

    assert main(["report", finished_run, "--to", str(tmp_path / "rep")]) == 0
    assert os.path.exists(tmp_path / "rep" / "report.html")
    capsys.readouterr()
    assert main(["report", str(tmp_path / "nothing")]) == 2
    assert "holds no metrics.json" in capsys.readouterr().err
