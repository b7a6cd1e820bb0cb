"""`rescore report OUTPUT_DIR`: a self-contained report.html and PNG charts of a finished run.

    rescore report out/                   # writes out/report.html and out/report-*.png
    rescore report out/ --to rep/         # somewhere else
    rescore report out/ --solved-at 0.5   # a run "solves" its task at reward >= 0.5 (default 1)

The charts answer what an RL engineer asks of a batch of experience before training on it, per
batch so that a drift shows as a trend. Counts come from metrics.json; distributions are read
from the output's own Parquet (only the columns they need): scored-*.parquet (original rows,
copies left out) and, with --keep-filtered, filtered-*.parquet.
    report-groups.png    share of groups with zero reward spread ("dead"), solved by all runs,
                         solved by none
    report-reward.png    reward per batch (box), with metrics.json's mean of group means
    report-scores.png    score per batch (box)
    report-length.png    response length against score, and their correlation per batch
    report-sizes.png     groups by size (rows per group)
    report-rejects.png   rows written / copied / filtered / rejected per batch, and by reason
    report-columns.png   other numeric reward or model columns, when the data has any
    report-audit.png     with --audit-columns: the group std and baseline the scores used
Past MAX_BOXES batches, box plots group consecutive batches into bins and say so.

The page records the config hash of the run it describes; a rerun into the same directory
removes report.html and the PNGs with the data (see report_files): only the chart names above
and a report.html carrying MARKER; other report-*.png files are never deleted.

The command is this module; what it draws from is `report_data.py` (metrics.json and the
output's columns, numpy and Arrow only), the charts `report_charts.py` (matplotlib), the page
`report_page.py` (HTML).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

from rescore.errors import ReportError
from rescore.pipelines.report_charts import CHARTS, OPTIONAL_CHARTS, draw
from rescore.pipelines.report_data import group_counts, group_sizes, load_metrics, read_run
from rescore.pipelines.report_page import MARKER, render_html
from rescore.transforms.files import storage
from rescore.transforms.files.layout import REPORT_HTML, report_chart

# What tests and scripts import from here (the code lives in report_data / report_charts):
from rescore.pipelines.report_charts import Bins  # noqa: E402,F401
from rescore.pipelines.report_data import (  # noqa: E402,F401
    OFFPOLICY_KEYS, PASS_RATE_BINS, RunData, group_pass_rates, group_table, load, offpolicy_batches,
)


def report_files(output: str) -> list[str]:
    """The report of an earlier run in `output`: the charts this module writes
    (report-{name}.png for CHARTS and OPTIONAL_CHARTS) and report.html when it is a Rescore
    report (MARKER). A rerun removes them with the data they describe, so a page never sits
    beside another run's data; any other report-*.png is not Rescore's and stays."""
    charts = [storage.join(output, report_chart(name)) for name in (*CHARTS, *OPTIONAL_CHARTS)]
    html_path = storage.join(output, REPORT_HTML)
    return [p for p in charts if storage.exists(p)] + ([html_path] if _is_report(html_path) else [])


def _is_report(path: str) -> bool:
    if not storage.exists(path):
        return False
    try:
        return MARKER in storage.read_text(path)
    except (OSError, UnicodeDecodeError):
        return False


def write_report(output: str, to: str | None = None, solved_at: float = 1.0) -> dict[str, str]:
    """Write report.html and report-*.png for the run in `output`; returns {name: path}. Both
    may be on an object store (gs://, s3://): the files are drawn in a local temporary
    directory, then uploaded, the page last."""
    if to is None and not storage.is_local(output):
        raise ReportError(f"{output} is not a local directory: pass --to DIR (a local directory or a bucket path) "
                          "for the report files")
    to = to or output
    _check_target(to)  # before anything is read or drawn
    doc = load_metrics(output)
    data = read_run(output)
    html_path = storage.join(to, REPORT_HTML)
    if storage.exists(html_path) and not _is_report(html_path):
        raise ReportError(f"{html_path} is not a Rescore report, and Rescore replaces only its own files: "
                          "move it away or pass --to another directory")
    if storage.is_local(to):
        os.makedirs(to, exist_ok=True)
        draw_in = to
    else:
        draw_in = tempfile.mkdtemp(prefix="rescore-report-")
    try:
        storage.delete(report_files(to))  # charts of an earlier report that this one may not draw
        paths, captions = draw(doc, data, lambda name: os.path.join(draw_in, report_chart(name)), solved_at)
        images = {}
        for name, path in paths.items():
            with open(path, "rb") as f:
                images[name] = f.read()
        page = render_html(doc, images, captions, groups=group_counts(data, solved_at), sizes=group_sizes(data),
                           solved_at=solved_at)
        if storage.is_local(to):
            with open(html_path, "w", encoding="utf-8") as f:
                f.write(page)
        else:
            for name, path in paths.items():
                paths[name] = storage.join(to, os.path.basename(path))
                with storage.create(paths[name]) as f:
                    f.write(images[name])
            with storage.create(html_path) as f:
                f.write(page.encode("utf-8"))
    finally:
        if draw_in != to:
            shutil.rmtree(draw_in, ignore_errors=True)
    paths["html"] = html_path
    _own(to, paths.values())
    return paths


def _check_target(to: str) -> None:
    """ReportError (one line) where the report cannot be written to `to`."""
    from rescore.transforms.files import ownership

    try:
        ownership.check_output_path(to, "--to")
    except ownership.OutputError as e:
        raise ReportError(str(e)) from None
    html_path = storage.join(to, REPORT_HTML)
    if storage.exists(html_path) and not _is_report(html_path):
        raise ReportError(f"{html_path} is not a Rescore report, and Rescore replaces only its own files: "
                          "move it away or pass --to another directory")
    # A chart name is Rescore's where the directory's ledger lists it or the directory holds a
    # Rescore report (MARKER); else it is the user's, and neither deleted nor replaced (in a
    # bucket as on a disk).
    try:
        ledger = ownership.read_ledger(to) if not storage.is_local(to) or os.path.isdir(to) else None
    except ownership.OutputError as e:
        raise ReportError(str(e)) from None
    if not _is_report(html_path):
        charts = [report_chart(name) for name in (*CHARTS, *OPTIONAL_CHARTS)]
        theirs = [c for c in charts if storage.exists(storage.join(to, c)) and c not in (ledger or [])]
        if theirs:
            raise ReportError(f"{storage.join(to, theirs[0])} is not Rescore's, and Rescore replaces only its own "
                              "files: move it away or pass --to another directory")


def _own(directory: str, paths) -> None:
    """In a Rescore output, the report joins the files Rescore owns (transforms/files/ownership.py),
    so the next run into it removes the page with the data it describes."""
    from rescore.transforms.files import ownership

    try:
        ledger = ownership.read_ledger(directory)
    except ownership.OutputError:
        return
    if ledger is not None:
        ownership.write_ledger(directory, [*ledger, *(os.path.basename(p) for p in paths)])


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rescore report", description="Charts and an HTML page for a finished run.")
    parser.add_argument("output", help="a Rescore output: a one-shot directory (holding metrics.json) or an --incremental table")
    parser.add_argument("--to", help="where to write report.html and the PNGs (default: the output directory)")
    parser.add_argument("--solved-at", "--solved_at", type=float, default=1.0,
                        help="a run solves its task at reward >= this (default 1.0), for the all/none-solved shares")
    args = parser.parse_args(argv)
    try:
        paths = write_report(args.output, args.to, args.solved_at)
    except (ReportError, OSError, ValueError) as e:
        print(f"rescore: error: {e}", file=sys.stderr)
        return 2
    print(f"rescore: report written to {paths['html']}", file=sys.stderr)
    return 0
