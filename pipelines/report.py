"""`rescore report OUTPUT_DIR`: a self-contained report.html and PNG charts of a finished run.

    rescore report out/            # writes out/report.html and out/report-*.png
    rescore report out/ --to rep/  # somewhere else

Charts (matplotlib, headless Agg), all from metrics.json except the score histogram, which reads
the `score` column of scored-*.parquet:
    report-reward.png     per batch: the mean over groups of the group reward mean, ± the mean
                          group reward std
    report-groups.png     per batch: fraction of groups filtered, duplicated (copies per group),
                          and with zero reward std
    report-scores.png     histogram of the scores the strategy wrote
    report-rejects.png    rejected rows by reason
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import os
import sys
from typing import Any

import numpy as np

from transforms import storage
from transforms.metrics import MEAN_KEY, STD_KEY
from transforms.write import METRICS

CHARTS = ("reward", "groups", "scores", "rejects")


def report_files(output: str) -> list[str]:
    """The report of an earlier run in `output` (report.html, report-*.png): a rerun removes
    them with the data they describe, so a page never sits beside another run's data."""
    html_path = storage.join(output, "report.html")
    return storage.list_dir(output, "report-*.png") + ([html_path] if storage.exists(html_path) else [])


class ReportError(ValueError):
    """The directory holds no finished run to report on."""


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def load(output: str) -> tuple[dict[str, Any], np.ndarray]:
    """(metrics.json, the written scores without nulls) of a finished run."""
    path = storage.join(output, METRICS)
    if not storage.exists(path):
        raise ReportError(f"{output} holds no metrics.json: not a Rescore output directory")
    doc = json.loads(storage.read_text(path))
    parts = [np.zeros(0)]
    for path in storage.list_dir(output, "scored-*.parquet"):
        column = storage.open_parquet(path).read(columns=["score"])["score"]
        parts.append(np.asarray(column.drop_null().to_numpy(), dtype=np.float64))
    return doc, np.concatenate(parts)


def _batches(doc):
    return [b for b in doc["batches"] if b["batch"] is not None]


def chart_reward(doc, plt, path):
    batches = _batches(doc)
    x = [b["batch"] for b in batches]
    mean = np.array([b[MEAN_KEY] if b[MEAN_KEY] is not None else np.nan for b in batches], dtype=float)
    std = np.array([b[STD_KEY] if b[STD_KEY] is not None else np.nan for b in batches], dtype=float)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(x, mean, marker="o", label="mean of group reward means")
    ax.fill_between(x, mean - std, mean + std, alpha=0.25, label="± mean group reward std")
    ax.set_xlabel("batch")
    ax.set_ylabel("reward")
    ax.set_title("Reward per batch (over task groups)")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, fontsize=8, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_groups(doc, plt, path):
    batches = [b for b in _batches(doc) if b["groups"]]
    x = np.array([b["batch"] for b in batches])
    groups = np.array([b["groups"] for b in batches], dtype=float)
    series = {
        "filtered": np.array([b["groups_filtered"] for b in batches]) / groups if len(groups) else [],
        "duplicated (copies per group)": np.array([b["groups_duplicated"] for b in batches]) / groups if len(groups) else [],
        "zero reward std": np.array([b.get("groups_zero_std", 0) for b in batches]) / groups if len(groups) else [],
    }
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.27
    for i, (label, values) in enumerate(series.items()):
        ax.bar(x + (i - 1) * width, values, width=width, label=label)
    ax.set_xlabel("batch")
    ax.set_ylabel("fraction of groups")
    ax.set_title("Groups filtered, duplicated and with zero reward std")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, fontsize=8, frameon=False)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_scores(doc, scores, plt, path):
    fig, ax = plt.subplots(figsize=(7, 3.6))
    if len(scores):
        ax.hist(scores, bins=min(60, max(10, int(np.sqrt(len(scores))))), color="#4c72b0")
    else:
        ax.text(0.5, 0.5, "no scores written (no advantage stage, or no rows kept)", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("score")
    ax.set_ylabel("rows")
    ax.set_title(f"Scores: {doc['strategy']}  ({len(scores):,} rows)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_rejects(doc, plt, path):
    reasons = doc["totals"]["reject_reasons"]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    if reasons:
        names = sorted(reasons, key=lambda k: -reasons[k])
        ax.barh(names, [reasons[n] for n in names], color="#c44e52")
        ax.invert_yaxis()
        for i, n in enumerate(names):
            ax.text(reasons[n], i, f" {reasons[n]:,}", va="center", fontsize=8)
    else:
        ax.text(0.5, 0.5, "no rejected rows", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("rows")
    ax.set_title(f"Rejected rows by reason ({doc['totals']['rows_rejected']:,} of {doc['totals']['rows_read']:,})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.6g}"
    return html.escape(str(value))


TOTAL_KEYS = (
    "rows_read", "rows_written", "rows_written_original", "rows_duplicated", "rows_filtered", "rows_rejected",
    "groups", "groups_filtered", "groups_duplicated", "groups_zero_std", MEAN_KEY, STD_KEY,
)
BATCH_KEYS = ("rows_read", "rows_written", "rows_duplicated", "rows_filtered", "rows_rejected", "groups",
              "groups_filtered", "groups_duplicated", "groups_zero_std", MEAN_KEY, STD_KEY)


def render_html(doc: dict[str, Any], images: dict[str, bytes]) -> str:
    t = doc["totals"]
    totals = "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(t.get(k))}</td></tr>" for k in TOTAL_KEYS)
    head = "".join(f"<th>{html.escape(k.replace('group_advantages/', ''))}</th>" for k in ("batch", *BATCH_KEYS))
    rows = "".join(
        "<tr>" + "".join(f"<td>{_fmt(b.get(k))}</td>" for k in ("batch", *BATCH_KEYS)) + "</tr>" for b in doc["batches"]
    )
    reasons = "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in t["reject_reasons"].items())
    stages = "".join(
        f"<tr><th>{html.escape(name)}</th><td>{html.escape(json.dumps(counts))}</td></tr>"
        for name, counts in t.get("strategies", {}).items()
    )
    figures = "".join(
        f'<figure><img alt="{name}" src="data:image/png;base64,{base64.b64encode(data).decode()}"></figure>'
        for name, data in images.items()
    )
    skipped = "".join(f"<li>{html.escape(f['path'])}: {html.escape(f['reason'])}</li>" for f in doc.get("skipped_files", []))
    failed = f'<p class="failed">Run failed: {html.escape(doc["failed"])}</p>' if doc.get("failed") else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Rescore report: {html.escape(doc['output'])}</title>
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ddd; padding: 3px 8px; text-align: right; }}
th {{ background: #f6f6f6; text-align: left; }}
figure {{ display: inline-block; margin: 0.5em; }} img {{ max-width: 520px; }}
code {{ background: #f3f3f3; padding: 1px 4px; }} .failed {{ color: #b00; font-weight: bold; }}
</style></head><body>
<h1>Rescore report</h1>
<p>Output <code>{html.escape(doc['output'])}</code> · strategy <code>{html.escape(doc['strategy'])}</code>
· algorithm <code>{_fmt(doc.get('algorithm'))}</code> · Rescore {html.escape(doc.get('rescore_version', '?'))}
· config hash <code>{html.escape(doc.get('config_hash', '')[:16])}</code> · {_fmt(doc.get('input_files'))} input files</p>
{failed}
<p>Parameters: <code>{html.escape(json.dumps(doc.get('params', {}), sort_keys=True))}</code></p>
<h2>Totals</h2><table>{totals}</table>
<h2>Charts</h2>{figures}
<h2>Per batch</h2><table><tr>{head}</tr>{rows}</table>
<h2>Strategy stages</h2><table>{stages or '<tr><td>—</td></tr>'}</table>
<h2>Reject reasons</h2><table>{reasons or '<tr><td>none</td></tr>'}</table>
{f'<h2>Skipped input files</h2><ul>{skipped}</ul>' if skipped else ''}
</body></html>
"""


def write_report(output: str, to: str | None = None) -> dict[str, str]:
    """Write report.html and report-*.png for the run in `output`; returns {name: path}."""
    if to is None and not storage.is_local(output):
        raise ReportError(f"{output} is not a local directory: pass --to LOCAL_DIR for the report files")
    doc, scores = load(output)
    to = to or output
    os.makedirs(to, exist_ok=True)
    plt = _plt()
    paths = {name: os.path.join(to, f"report-{name}.png") for name in CHARTS}
    chart_reward(doc, plt, paths["reward"])
    chart_groups(doc, plt, paths["groups"])
    chart_scores(doc, scores, plt, paths["scores"])
    chart_rejects(doc, plt, paths["rejects"])
    images = {}
    for name, path in paths.items():
        with open(path, "rb") as f:
            images[name] = f.read()
    paths["html"] = os.path.join(to, "report.html")
    with open(paths["html"], "w", encoding="utf-8") as f:
        f.write(render_html(doc, images))
    return paths


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="rescore report", description="Charts and an HTML page for a finished run.")
    parser.add_argument("output", help="a Rescore output directory (holding metrics.json)")
    parser.add_argument("--to", help="where to write report.html and the PNGs (default: the output directory)")
    args = parser.parse_args(argv)
    try:
        paths = write_report(args.output, args.to)
    except (ReportError, OSError, ValueError) as e:
        print(f"rescore: error: {e}", file=sys.stderr)
        return 2
    print(f"rescore: report written to {paths['html']}", file=sys.stderr)
    return 0
