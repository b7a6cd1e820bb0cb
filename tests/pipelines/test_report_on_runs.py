"""What a new user hits first (issue 20): help and usage, the summary's wording and wall time,
+0.0 under a zero mask, "did you mean", the progress line, a report that never goes stale."""

from __future__ import annotations

import glob
import io
import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import pytest
import torch

from batched import ForkedRuns
from conftest import RUNNER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rescore", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """`rescore` processes forked from one child that imported Rescore once (batched.py), each
    with its own exit status, stdout and stderr; `_cli` where the process's start-up matters."""
    with ForkedRuns(tmp_path_factory.mktemp("forked")) as runs:
        yield runs


def _forked(runs: ForkedRuns, *args: str) -> subprocess.CompletedProcess:
    code, err = runs.run(list(args))
    return subprocess.CompletedProcess(["rescore", *args], code, runs.stdout(), err)


@pytest.fixture(scope="module")
def bare(forked):
    """A bare `rescore`: the usage lines (one process for the tests that read them)."""
    return _forked(forked)


def test_bare_rescore_prints_usage_with_every_command(bare):
    p = bare
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.startswith("usage: rescore")
    for command in ("rescore sample --output DIR", "rescore report OUTPUT_DIR", "rescore --input"):
        assert command in p.stderr


def test_help_mentions_sample_and_report(forked):
    p = _forked(forked, "--help")
    assert p.returncode == 0
    assert "rescore sample --output DIR" in p.stdout and "rescore report OUTPUT_DIR" in p.stdout
    assert "--keep-filtered" in p.stdout and "--audit-columns" in p.stdout


def test_set_typo_says_did_you_mean(forked, tmp_path):
    p = _forked(forked, "--input", str(tmp_path / "x.parquet"), "--output", str(tmp_path / "o"), "--strategy", "grpo",
             "--set", "epsilonn=1")
    assert p.returncode == 2
    assert p.stderr.strip().splitlines() == [
        "rescore: error: unknown parameter 'epsilonn' for strategy 'grpo' (did you mean 'epsilon'?); "
        "valid parameters: epsilon, rank_penalty, std_cal_level, std_threshold"
    ]


def test_zero_mask_gives_positive_zero():
    from rescore.transforms.strategies.tokens import token_advantages

    out = token_advantages(torch.tensor([-1.5, 2.0], dtype=torch.float64), torch.tensor([3, 2]), torch.tensor([0, 1, 0, 0, 1]))
    assert out.tolist() == [0.0, -1.5, 0.0, 0.0, 2.0]
    assert not torch.signbit(out[[0, 2, 3]]).any()  # +0.0, never -0.0


def test_plural_and_process_seconds():
    from rescore.pipelines.wording import plural, process_seconds

    assert [plural(1, "file"), plural(2, "file"), plural(1_000, "read unit"), plural(1, "batch", "batches")] == [
        "1 file", "2 files", "1,000 read units", "1 batch"]
    assert plural(0, "batch", "batches") == "0 batches"
    # counts from when this process first imported rescore, and goes on counting
    first = process_seconds()
    time.sleep(0.05)
    assert 0 < first < process_seconds()


@pytest.fixture(scope="module")
def sample_input(tmp_path_factory):
    from rescore.pipelines.sample import make_experience

    d = tmp_path_factory.mktemp("frictions")
    # 64 rows in 4 row groups: 4 read units
    pq.write_table(make_experience(batches=2, tasks=8, runs=4, seed=1), str(d / "part-0.parquet"), row_group_size=16)
    return str(d / "*.parquet")


def test_summary_reads_unambiguously_and_counts_start_up(sample_input, tmp_path):
    out = str(tmp_path / "out")
    # --log-level INFO: the progress line ("planned ... in 1 file") goes to a non-terminal stderr only then
    p = _cli("--input", sample_input, "--output", out, RUNNER, "--strategy", "reward_variance,grpo,duplicate_informative",
             "--log-level", "INFO")
    assert p.returncode == 0, p.stderr
    import json

    t = json.load(open(os.path.join(out, "metrics.json")))["totals"]
    assert t["rows_duplicated"] > 0
    lines = p.stderr.splitlines()
    written = next(line for line in lines if line.lstrip().startswith("rows written"))
    assert written.endswith(f"({t['rows_written_original']:,} originals + {t['rows_duplicated']:,} copies)")
    assert t["rows_written"] == t["rows_written_original"] + t["rows_duplicated"]
    filtered = next(line for line in lines if line.lstrip().startswith("rows filtered"))
    assert "not written" in filtered
    # "1 file", never "1 files"; the run started before Beam was imported: the wall time counts it
    assert "in 1 file " in p.stderr and "1 files" not in p.stderr and "1 read units" not in p.stderr
    wall = float(next(line for line in lines if "wall time" in line).split()[2].rstrip("s"))
    assert wall >= 1.0  # importing Beam and torch alone takes longer than that


def test_progress_counts_this_runs_marks_not_an_earlier_runs_files(tmp_path, caplog):
    """An --overwrite rerun: the finished earlier run's scored files are in the output; the line
    counts only the marks this run's steps dropped (transforms/files/progress_marks.py)."""
    from rescore.pipelines.progress import Progress
    from rescore.transforms.files import progress_marks

    caplog.set_level(logging.INFO)  # a non-terminal stream gets the plan line at once only at INFO

    out = tmp_path / "out"
    marks = out / "_staging" / "_progress"
    marks.mkdir(parents=True)
    for name in ("scored-00000-of-00004.parquet", "scored-00001-of-00004.parquet", "_SUCCESS"):
        (out / name).write_bytes(b"")  # the earlier run
    for name in (progress_marks.read_mark(0, 25), progress_marks.read_mark(2, 20), progress_marks.score_mark(7, 30),
                 progress_marks.write_mark(2)):
        (marks / name).write_bytes(b"")
    stream = io.StringIO()
    progress = Progress(str(out), 4, 100, 1, stream=stream, interval=0.05)
    assert progress.counts() == (2, 30, 100, 1)  # two units read; 30 of the 100 planned rows scored
    with progress:
        time.sleep(0.3)
        for name in (progress_marks.read_mark(1, 25), progress_marks.read_mark(3, 25)):
            (marks / name).write_bytes(b"")
        time.sleep(0.3)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "rescore: planned 100 rows in 1 file (4 read units); running"
    # read 2/4 (50%), scored 30/100 (30%), written 1/4 (25%): 35%
    assert lines[1].startswith("rescore: 100 rows in 1 file: read 2/4 units, scored 30/100 rows, written 1/4 units (35%)")
    # every unit read: 95 rows passed validation, 30 of them scored
    assert any(line.startswith("rescore: 100 rows in 1 file: read 4/4 units, scored 30/95 rows, written 1/4 units (52%)")
               for line in lines), lines
    assert lines[-1].startswith("rescore: 100 rows in 1 file: read 4/4 units, scored 95/95 rows, written 4/4 units (100%)")


def test_progress_advances_with_multi_processing(sample_input, tmp_path):
    out = str(tmp_path / "mp")
    p = _cli("--input", sample_input, "--output", out, RUNNER, "--strategy", "grpo", "--shard-rows", "16",
             "--direct_running_mode=multi_processing", "--direct_num_workers=2", "--log-level", "INFO", timeout=400)
    assert p.returncode == 0, p.stderr
    progress = [line for line in p.stderr.splitlines() if ", written " in line]
    assert len(glob.glob(os.path.join(out, "scored-*.parquet"))) == 4
    assert progress and progress[-1].split(": ")[2].startswith("read 4/4 units, scored "), p.stderr
    assert "written 4/4 units (100%)" in progress[-1], p.stderr


def test_rerun_with_overwrite_removes_the_old_report(sample_input, tmp_path):
    from rescore.pipelines.rescore import main

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


def test_report_numbers_match_metrics_json(sample_input, tmp_path):
    """The chart data: dead share from metrics.json, solved shares and sizes from the rows."""
    from rescore.pipelines.report import Bins, group_table, load_metrics, read_run
    from rescore.pipelines.rescore import main

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


def test_report_draws_extra_reward_columns(tmp_path):
    """A model stage or a second reward column gets its own distribution chart."""
    from rescore.pipelines.rescore import main
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


def test_report_deletes_only_the_files_a_report_wrote(forked, sample_input, tmp_path):
    """Other report-*.png files (beside the data or in --to) and a foreign report.html stay."""
    from rescore.pipelines.rescore import main

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


def test_report_on_an_incremental_table(forked, sample_input, tmp_path):
    """`rescore report TABLE`: each batch's metrics from the committed run that last scored it;
    two incremental runs (the second adds batches) report what one one-shot run over the same
    input reports, batch for batch and in total."""
    import shutil

    from rescore.pipelines.report import load_metrics
    from rescore.pipelines.rescore import main

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


def test_every_usage_line_parses(bare, tmp_path, monkeypatch):
    """Each command the bare `rescore` lists exists, with options its parser accepts."""
    import argparse
    import re

    from rescore.pipelines import config, export, report, sample, show, task_stats

    text = bare.stderr
    lines = [line.strip() for line in text[text.index("commands:"):].splitlines() if line.strip().startswith("rescore ")]
    lines = [line for line in lines if "--help" not in line]
    commands = {line.split()[1] if not line.split()[1].startswith("-") else "" for line in lines}
    assert commands == {"", "sample", "report", "show", "task-stats", "export"}, lines

    class Parsed(BaseException):  # past a command's own catch-all of a failed run
        pass

    real = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        raise Parsed(real(self, args, namespace))  # parsed: stop before the command runs

    values = {"N": "2", "X": "0.5", "NAME": "grpo", "KEY=VALUE": "grpo.epsilon=0.1", "PATH_OR_GLOB": "in/*.parquet",
              "sft|dpo": "sft"}
    for line in lines:
        usage_part = re.split(r"\s{2,}", line)[0]
        tokens = [t.strip("[]") for t in usage_part.split()[1:] if t != "..." and t.strip("[]") != "..."]
        argv = [values.get(t, str(tmp_path / t.lower()) if t.isupper() else t) for t in tokens]
        if argv[0].startswith("-"):
            cfg = config.parse_args(argv)  # raises ConfigError on an unknown option
            assert cfg.strategies == ["grpo"], line
            continue
        main = {"sample": sample.main, "report": report.main, "show": show.main, "task-stats": task_stats.main,
                "export": export.main}[argv[0]]
        monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_only)
        known = argparse.ArgumentParser.parse_known_args

        def parse_known_only(self, args=None, namespace=None, known=known):  # task-stats passes the rest to Beam
            raise Parsed(known(self, args, namespace))

        monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args", parse_known_only)
        try:
            with pytest.raises(Parsed):
                main(argv[1:])
        finally:
            monkeypatch.undo()


def test_report_on_filtered_files_rescore_did_not_write_is_one_line(forked, sample_input, tmp_path):
    from rescore.pipelines.rescore import main

    out = str(tmp_path / "out")
    assert main(["--input", sample_input, "--output", out, RUNNER, "--strategy", "grpo", "--quiet"]) == 0
    import pyarrow as pa

    pq.write_table(pa.table({"batch": [0]}), os.path.join(out, "filtered-00000-of-00001.parquet"))  # no filter_reason
    p = _forked(forked, "report", out)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [
        f"rescore: error: {out}: its filtered-*.parquet lack task, reward, filter_reason: not files Rescore wrote"
    ]
