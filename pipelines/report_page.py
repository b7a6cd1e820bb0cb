"""`rescore report`'s page: report.html, self-contained (the charts inlined as PNG data), with the
run's totals, per-batch metrics, the numbers behind the group charts, the off-policy
diagnostics, the strategy stages and the reject reasons. It carries MARKER, so a later run
replaces only a page Rescore wrote.
"""

from __future__ import annotations

import base64
import html
import json
from typing import Any

import numpy as np

from rescore.pipelines.report_data import OFFPOLICY_KEYS, GroupCounts, batch_entries, offpolicy_batches
from rescore.pipelines.wording import plural
from rescore.transforms.rows.metrics import MEAN_KEY, STD_KEY


MARKER = '<meta name="rescore-config-hash"'
"""Every report.html this module writes carries it: only such a page is Rescore's to replace."""


WIDE = ("length", "rejects", "audit", "difficulty", "offpolicy")
"""Two-panel charts: a whole row of the page."""


CAPTIONS = {
    "groups": "Dead groups (every run the same reward) give GRPO no signal: watch for a rising share, "
    "or for all-solved / none-solved groups crowding out the rest.",
    "reward": "Reward per batch: a drifting median or a collapsing box means the policy or the "
    "reward model changed.",
    "scores": "Scores (advantages) per batch: group-normalised scores should centre on 0 with a "
    "stable spread; a skew or a shifted median hints at a bug or a batch-level baseline.",
    "length": "Length bias: if long responses get systematically negative scores (r < 0), "
    "training will shorten answers; r near 0 is neutral.",
    "sizes": "Rows per task group: groups smaller than the rollout count lost runs upstream; "
    "one-row groups get no baseline.",
    "rejects": "Where the rows went: written, copied (duplication), filtered by a strategy, or "
    "rejected as invalid; the right panel names the reasons.",
    "columns": "Other numeric reward or model columns of the data, per column: check their scale "
    "before mixing them into a reward.",
    "difficulty": "Task difficulty: each group's pass rate (share of its runs with reward >= --solved-at). "
    "Mass at 0 and 1 is groups that teach nothing; `rescore task-stats` and the pass_rate_band filter "
    "(docs/curating.md) keep the middle.",
    "offpolicy": "Off-policy drift per batch (rollout_correction, verl's diagnostics): KL between the "
    "rollout and the training policy, and the variance of the importance weights (chi2). A rising "
    "curve means staler data; see docs/offpolicy.md for the healthy ranges.",
    "audit": "What the scores were computed from (--audit-columns): the group reward std the "
    "strategy reported (GRPO divides by it) and the baseline it subtracted, per batch.",
}


def fmt(value) -> str:
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


def _column_head(key: str) -> str:
    """A column's header that may wrap after `_` and `/` (`rows_<wbr>duplicated`): a table of
    a dozen metric columns then fits the page (the class `wrap` lets it) instead of scrolling."""
    return f'<th>{html.escape(key).replace("_", "_<wbr>").replace("/", "/<wbr>")}</th>'


def _offpolicy_table(doc) -> str:
    entries = offpolicy_batches(doc)
    if not entries:
        return ""
    keys = [k for k in OFFPOLICY_KEYS if any(k in m for _, m in entries)]
    head = "<tr><th>batch</th>" + "".join(_column_head(k) for k in keys) + "</tr>"
    rows = "".join(
        f"<tr><td>{fmt(b)}</td>" + "".join(f"<td>{fmt(m.get(k))}</td>" for k in keys) + "</tr>" for b, m in entries
    )
    total = doc["totals"].get("rollout_correction") or {}
    rows += "<tr><th>all</th>" + "".join(f"<td>{fmt(total.get(k))}</td>" for k in keys) + "</tr>"
    return f'<h2>Off-policy diagnostics per batch</h2><div class="scroll tall"><table id="offpolicy" class="wrap">{head}{rows}</table></div>'


def _stages_table(doc) -> str:
    params = doc.get("params", {})
    stats = doc["totals"].get("strategies", {})
    keys = sorted({k for s in stats.values() for k in s})
    if not params and not stats:
        return "<p>—</p>"
    head = "<tr><th>stage</th><th>parameters</th>" + "".join(f"<th>{html.escape(k)}</th>" for k in keys) + "</tr>"
    rows = []
    for name in dict.fromkeys([*params, *stats]):
        p = "<br>".join(f"{html.escape(k)} = <code>{html.escape(json.dumps(v))}</code>" for k, v in params.get(name, {}).items())
        cells = "".join(f"<td>{fmt(stats.get(name, {}).get(k))}</td>" for k in keys)
        rows.append(f'<tr><th>{html.escape(name)}</th><td class="left">{p or "—"}</td>{cells}</tr>')
    return f'<div class="scroll"><table>{head}{"".join(rows)}</table></div>'


def _groups_tables(counts: GroupCounts | None, sizes: tuple[np.ndarray, str] | None, solved_at: float) -> str:
    """The numbers behind the groups and sizes charts, as tables (what a query over the
    output's files gives: see tests/pipelines/test_report_numbers.py)."""
    if counts is None:
        return ""
    head = (f"<tr><th>batch</th><th>groups in the output</th><th>solved by all runs (reward ≥ {solved_at:g})</th>"
            "<th>solved by none</th></tr>")
    rows = "".join(
        f"<tr><td>{fmt(int(b))}</td><td>{fmt(int(g))}</td><td>{fmt(int(a))}</td><td>{fmt(int(n))}</td></tr>"
        for b, g, a, n in zip(counts.batch.tolist(), counts.groups.tolist(), counts.all_solved.tolist(), counts.none_solved.tolist())
    )
    out = f'<h2>Groups per batch</h2><div class="scroll tall"><table id="groups">{head}{rows}</table></div>'
    if sizes is not None:
        values, what = sizes
        found, number = np.unique(values, return_counts=True)
        cells = "".join(f"<tr><td>{fmt(int(k))}</td><td>{fmt(int(v))}</td></tr>" for k, v in zip(found.tolist(), number.tolist()))
        out += (f'<h2>Group sizes</h2><p>{html.escape(what.capitalize())}.</p><div class="scroll tall"><table id="sizes">'
                f"<tr><th>rows in the group</th><th>groups</th></tr>{cells}</table></div>")
    return out


def render_html(doc: dict[str, Any], images: dict[str, bytes], captions: dict[str, str] | None = None, *,
                groups: GroupCounts | None = None, sizes: tuple[np.ndarray, str] | None = None, solved_at: float = 1.0) -> str:
    captions = captions or {}
    t = doc["totals"]
    totals = "".join(f"<tr><th>{html.escape(k)}</th><td>{fmt(t.get(k))}</td></tr>" for k in TOTAL_KEYS)
    head = "".join(_column_head(k.replace("group_advantages/", "")) for k in ("batch", *BATCH_KEYS))
    rows = "".join(
        "<tr>" + "".join(f"<td>{fmt(b.get(k))}</td>" for k in ("batch", *BATCH_KEYS)) + "</tr>" for b in doc["batches"]
    )
    reasons = "".join(f"<tr><th>{html.escape(k)}</th><td>{fmt(v)}</td></tr>" for k, v in t["reject_reasons"].items())
    figures = "".join(
        f'<figure class="{"wide" if name in WIDE else ""}"><img alt="{name}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        f"<figcaption><b>{html.escape(CAPTIONS.get(name, ''))}</b> {html.escape(captions.get(name, ''))}</figcaption></figure>"
        for name, data in images.items()
    )
    skipped = "".join(f"<li>{html.escape(f['path'])}: {html.escape(f['reason'])}</li>" for f in doc.get("skipped_files", []))
    failed = f'<p class="failed">Run failed: {html.escape(doc["failed"])}</p>' if doc.get("failed") else ""
    n_batches = len(batch_entries(doc))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Rescore report: {html.escape(doc['output'])}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="rescore-config-hash" content="{html.escape(doc.get('config_hash', ''))}">
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1180px; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }}
th, td {{ border: 1px solid #ddd; padding: 3px 8px; text-align: right; white-space: nowrap; }}
th {{ background: #f6f6f6; text-align: left; }} td.left {{ text-align: left; }}
table.wrap th {{ white-space: normal; vertical-align: bottom; }}
.scroll {{ max-width: 100%; overflow: auto; margin-bottom: 1.5em; }}
.scroll.tall {{ max-height: 420px; }} .scroll.tall th {{ position: sticky; top: 0; }}
.charts {{ display: grid; grid-template-columns: repeat(auto-fit, minmax(520px, 1fr)); gap: 1em; }}
figure {{ margin: 0; min-width: 0; }} figure.wide {{ grid-column: 1 / -1; max-width: 900px; }}
img {{ width: 100%; height: auto; }}
figcaption {{ font-size: 13px; color: #444; }}
code {{ background: #f3f3f3; padding: 1px 4px; overflow-wrap: anywhere; }} .failed {{ color: #b00; font-weight: bold; }}
.meta {{ overflow-wrap: anywhere; }}
</style></head><body>
<h1>Rescore report</h1>
<p class="meta">Output <code>{html.escape(doc['output'])}</code> · strategy <code>{html.escape(doc['strategy'])}</code>
· algorithm <code>{fmt(doc.get('algorithm'))}</code> · Rescore {html.escape(doc.get('rescore_version', '?'))}
· config hash <code>{html.escape(doc.get('config_hash', '')[:16])}</code> · {plural(doc.get('input_files') or 0, 'input file')}
· {plural(n_batches, 'batch', 'batches')}</p>
{failed}
<h2>Totals</h2><div class="scroll"><table id="totals">{totals}</table></div>
<h2>Charts</h2><div class="charts">{figures}</div>
<h2>Per batch</h2><div class="scroll tall"><table id="batches" class="wrap"><tr>{head}</tr>{rows}</table></div>
{_groups_tables(groups, sizes, solved_at)}
{_offpolicy_table(doc)}
<h2>Strategy stages</h2>{_stages_table(doc)}
<h2>Reject reasons</h2><table>{reasons or '<tr><td>none</td></tr>'}</table>
{f'<h2>Skipped input files</h2><ul>{skipped}</ul>' if skipped else ''}
</body></html>
"""
