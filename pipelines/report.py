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
"""

from __future__ import annotations

import argparse
import base64
import html
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rescore.errors import ReportError
from rescore.pipelines.wording import plural
from rescore.transforms.files import storage
from rescore.transforms.files.layout import (
    DELTA_LOG, FILTERED_FILES, INCREMENTAL_WORK, METRICS, REPORT_HTML, SCORED_FILES, report_chart,
)
from rescore.transforms.rows.metrics import MEAN_KEY, STD_KEY
from rescore.transforms.rows.response import response_length_columns, response_lengths

CHARTS = ("groups", "reward", "scores", "length", "sizes", "rejects", "difficulty")
OPTIONAL_CHARTS = ("columns", "audit", "offpolicy")
MAX_BOXES = 40
"""Box plots draw at most this many boxes; more batches are binned."""
MAX_POINTS = 4000
"""Scatter plots draw at most this many points (an even sample, seeded)."""
KNOWN_COLUMNS = {
    "batch", "task", "run", "step", "reward", "tokens", "prompt_length", "logprobs", "action_mask",
    "advantages", "returns", "score", "copy_index", "source_task", "group_size", "group_reward_mean",
    "group_reward_std", "batch_reward_std", "baseline",
}
WIDE = ("length", "rejects", "audit", "difficulty", "offpolicy")
"""Two-panel charts: a whole row of the page."""
AUDIT = ("group_size", "group_reward_mean", "group_reward_std", "batch_reward_std", "baseline")
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


MARKER = '<meta name="rescore-config-hash"'
"""Every report.html this module writes carries it: only such a page is Rescore's to replace."""


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


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass
class RunData:
    """The columns of a finished run's output that the charts need."""

    batch: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    """(n,) batch of every original scored row."""
    task: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    reward: np.ndarray = field(default_factory=lambda: np.zeros(0))
    score: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(n,) NaN where no score was written."""
    length: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """(n,) response tokens, NaN where the data has no list column to count."""
    extra: dict[str, np.ndarray] = field(default_factory=dict)
    """other numeric scalar columns (model stage outputs, extra rewards)."""
    audit: dict[str, np.ndarray] = field(default_factory=dict)
    filtered_batch: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    filtered_task: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    filtered_reward: np.ndarray = field(default_factory=lambda: np.zeros(0))
    filter_reasons: dict[str, int] = field(default_factory=dict)
    has_filtered_files: bool = False

    @property
    def scores(self) -> np.ndarray:
        return self.score[~np.isnan(self.score)]


def _numeric_scalar(t) -> bool:
    import pyarrow as pa

    return (pa.types.is_floating(t) or pa.types.is_integer(t)) and not pa.types.is_boolean(t)


def _lengths(table) -> np.ndarray:
    """(n,) response tokens of each row (rows/response.py's rule), NaN without a column to count."""
    if not response_length_columns(table.column_names):
        return np.full(table.num_rows, np.nan)
    return np.asarray(response_lengths(table)[0], dtype=np.float64)


def _read(paths: list[str], wanted: list[str]):
    import pyarrow as pa

    tables = []
    for path in paths:
        f = storage.open_parquet(path)
        names = [n for n in wanted if n in f.schema_arrow.names]
        tables.append(f.read(columns=names))
    return pa.concat_tables(tables, promote_options="default") if tables else None


def read_run(output: str) -> RunData:
    """RunData of the Parquet in `output`, reading only the columns the charts use."""
    data = RunData()
    scored = storage.list_dir(output, SCORED_FILES)
    table = None
    if scored:
        schema = storage.open_parquet(scored[0]).schema_arrow
    elif storage.exists(storage.join(output, DELTA_LOG)):  # an --incremental table: its current rows
        from rescore.pipelines.load import load_scored

        table = load_scored(output)
        schema = table.schema
    if scored or table is not None:
        extra = [f.name for f in schema if f.name not in KNOWN_COLUMNS and _numeric_scalar(f.type)]
        length_cols = response_length_columns(schema.names)
        wanted = ["batch", "task", "reward", "score", "copy_index", *length_cols, *extra, *AUDIT]
        if table is None:
            table = _read(scored, wanted)
        else:
            table = table.select([n for n in wanted if n in table.column_names])
        if "copy_index" in table.column_names:  # copies repeat their originals: leave them out
            import pyarrow.compute as pc

            table = table.filter(pc.equal(table["copy_index"], 0))
        data.batch = np.asarray(table["batch"].to_numpy(), dtype=np.int64)
        data.task = np.asarray(table["task"].to_numpy(zero_copy_only=False))
        data.reward = np.asarray(table["reward"].to_numpy(zero_copy_only=False), dtype=np.float64)
        if "score" in table.column_names:
            data.score = np.asarray(table["score"].to_numpy(zero_copy_only=False), dtype=np.float64)
        else:
            data.score = np.full(table.num_rows, np.nan)
        data.length = _lengths(table)
        data.extra = {n: np.asarray(table[n].to_numpy(zero_copy_only=False), dtype=np.float64) for n in extra}
        data.audit = {
            n: np.asarray(table[n].to_numpy(zero_copy_only=False), dtype=np.float64) for n in AUDIT if n in table.column_names
        }
    filtered = storage.list_dir(output, FILTERED_FILES)
    if filtered:
        data.has_filtered_files = True
        table = _read(filtered, ["batch", "task", "reward", "filter_reason"])
        missing = [c for c in ("batch", "task", "reward", "filter_reason") if c not in table.column_names]
        if missing:
            raise ReportError(f"{output}: its filtered-*.parquet lack {', '.join(missing)}: not files Rescore wrote")
        data.filtered_batch = np.asarray(table["batch"].to_numpy(), dtype=np.int64)
        data.filtered_task = np.asarray(table["task"].to_numpy(zero_copy_only=False))
        data.filtered_reward = np.asarray(table["reward"].to_numpy(zero_copy_only=False), dtype=np.float64)
        reasons, counts = np.unique(np.asarray(table["filter_reason"].to_numpy(zero_copy_only=False), dtype=str), return_counts=True)
        data.filter_reasons = dict(zip(reasons.tolist(), counts.tolist()))
    return data


def load_metrics(output: str) -> dict[str, Any]:
    path = storage.join(output, METRICS)
    if not storage.exists(path):
        if storage.exists(storage.join(output, DELTA_LOG)):
            return incremental_metrics(output)
        raise ReportError(f"{output} holds no metrics.json: not a Rescore output directory")
    return json.loads(storage.read_text(path))


def incremental_metrics(output: str) -> dict[str, Any]:
    """A metrics document for an --incremental table as it stands: every batch's entry from the
    committed run that last scored it (runs' metrics.json in _rescore/runs/, ordered by the table
    version each committed), for the batches the table holds now (and those whose last scoring
    wrote no row); totals summed over them. The run fields (strategy, parameters) are the last
    committed run's."""
    from rescore.pipelines.load import load_scored

    committed = []
    for path, _ in storage.match(storage.join(output, INCREMENTAL_WORK, "runs", "*", METRICS)):
        try:
            doc = json.loads(storage.read_text(path))
        except (OSError, ValueError):
            continue
        version = (doc.get("incremental") or {}).get("table_version")
        if isinstance(version, int) and "batches" in doc:
            committed.append((version, doc))
    if not committed:
        raise ReportError(f"{output} is an incremental table whose runs left no metrics.json in "
                          f"{INCREMENTAL_WORK}/runs/ (rescore show describes the table)")
    committed.sort(key=lambda vd: vd[0])
    current = set(load_scored(output, columns=["batch"])["batch"].to_pylist())
    latest: dict[Any, dict] = {}
    for _, doc in committed:
        for entry in doc["batches"]:
            if entry.get("batch") is not None:
                latest[entry["batch"]] = entry
    batches = [latest[b] for b in sorted(latest) if b in current or not latest[b].get("rows_written")]
    last = committed[-1][1]
    return {
        **last,
        "output": output,
        "batches": batches,
        "totals": _summed(batches),
        "incremental_runs": len(committed),
        "table_version": committed[-1][0],
    }


def _summed(entries: list[dict]) -> dict[str, Any]:
    """Per-batch metrics added up: counts summed (nested ones too); a `.../mean` field is the
    mean weighted by each batch's groups."""
    total: dict[str, Any] = {}
    keys = [k for e in entries for k in e if k != "batch"]
    for key in dict.fromkeys(keys):
        values = [e[key] for e in entries if key in e and e[key] is not None]
        if key.endswith("/mean"):
            weights = [e.get("groups") or 0 for e in entries if key in e and e[key] is not None]
            total[key] = (sum(v * w for v, w in zip(values, weights)) / sum(weights)) if sum(weights) else None
        elif values and all(isinstance(v, dict) for v in values):
            total[key] = _summed(values)
        elif values and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            total[key] = sum(values)
    return total


def load(output: str) -> tuple[dict[str, Any], np.ndarray]:
    """(metrics.json, the written scores without nulls) of a finished run."""
    doc = load_metrics(output)
    return doc, read_run(output).scores


# --- per batch ----------------------------------------------------------------------------------


def _batches(doc):
    return [b for b in doc["batches"] if b["batch"] is not None]


@dataclass
class Bins:
    """Consecutive batches grouped for box plots: one bin per batch up to MAX_BOXES."""

    edges: list[tuple[int, int]]
    """(first, last) batch of each bin."""
    binned: bool
    count: int = 0
    """batches binned"""

    @classmethod
    def of(cls, batches: list[int], limit: int = MAX_BOXES) -> "Bins":
        if len(batches) <= limit:
            return cls([(b, b) for b in batches], False, len(batches))
        parts = np.array_split(np.asarray(sorted(batches)), limit)
        return cls([(int(p[0]), int(p[-1])) for p in parts], True, len(batches))

    def labels(self) -> list[str]:
        return [str(a) if a == b else f"{a}–{b}" for a, b in self.edges]

    def split(self, batch: np.ndarray, values: np.ndarray) -> list[np.ndarray]:
        ok = ~np.isnan(values)
        return [values[ok & (batch >= a) & (batch <= b)] for a, b in self.edges]

    def note(self, what: str = "Boxes") -> str:
        if not self.binned:
            return ""
        per = max(b - a + 1 for a, b in self.edges)
        return (
            f" {what} over {len(self.edges)} bins of up to {per} consecutive batches each "
            f"({self.count:,} batches: too many to show one by one)."
        )


def _integer_batches(ax, xs) -> None:
    """Integer ticks: every batch when there are few, else a few round ones."""
    from matplotlib.ticker import MaxNLocator

    xs = sorted(int(v) for v in xs)
    if 0 < len(xs) <= 12:
        ax.set_xticks(xs)
        ax.set_xlim(xs[0] - 0.7, xs[-1] + 0.7)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=10))


MAX_POINTS_PER_LINE = 60
"""Past this many batches, per-batch lines are drawn per bin of consecutive batches (Bins)."""


def _binned(x: np.ndarray, num: list[np.ndarray], den: np.ndarray):
    """(bin centres, [sum(num) / sum(den) per bin], Bins): ratios pooled over consecutive batches."""
    bins = Bins.of(list(x), MAX_BOXES)
    centres = np.array([(a + b) / 2 for a, b in bins.edges])
    out = []
    for values in num:
        out.append(np.array([values[(x >= a) & (x <= b)].sum() / max(den[(x >= a) & (x <= b)].sum(), 1) for a, b in bins.edges]))
    return centres, out, bins


def _boxes(ax, bins: Bins, groups: list[np.ndarray], color: str) -> None:
    positions = np.arange(len(groups))
    filled = [g if len(g) else np.array([np.nan]) for g in groups]
    parts = ax.boxplot(filled, positions=positions, widths=0.6, showfliers=len(groups) <= 20, patch_artist=True,
                       medianprops={"color": "#222"}, flierprops={"markersize": 2, "alpha": 0.4})
    for box in parts["boxes"]:
        box.set_facecolor(color)
        box.set_alpha(0.55)
    labels = bins.labels()
    step = max(1, len(labels) // 12)
    ax.set_xticks(positions[::step])
    ax.set_xticklabels(labels[::step], rotation=30 if bins.binned else 0, fontsize=8)
    ax.set_xlim(-0.7, len(groups) - 0.3)


def _save(fig, plt, path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _legend(ax, ncol=3) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, fontsize=9, frameon=False)


def _task_codes(task) -> np.ndarray:
    """(n,) int64 codes of task ids, equal exactly where the ids are equal (ints or strings,
    any characters: no id is turned into text and joined to another)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if isinstance(task, (pa.Array, pa.ChunkedArray)):
        array = task
    else:
        task = np.asarray(task)
        array = pa.array(task.tolist() if task.dtype == object else task)
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    return np.asarray(pc.dictionary_encode(array).indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def group_table(batch: np.ndarray, task, reward: np.ndarray):
    """(batch of each group, rows, min reward, max reward) over the (batch, task) groups, in
    (batch, task code) order. A group is the pair itself, (batch, task code) as two integers:
    never a key built from text, where (1, 23) and (12, 3) could meet."""
    if not len(batch):
        z = np.zeros(0)
        return z.astype(np.int64), z.astype(np.int64), z, z
    pairs = np.stack([np.asarray(batch, dtype=np.int64), _task_codes(task)], axis=1)
    uniq, inverse, counts = np.unique(pairs, axis=0, return_inverse=True, return_counts=True)
    inverse = inverse.reshape(-1)
    reward = np.asarray(reward, dtype=np.float64)
    lo = np.full(len(uniq), np.inf)
    hi = np.full(len(uniq), -np.inf)
    np.minimum.at(lo, inverse, reward)
    np.maximum.at(hi, inverse, reward)
    return uniq[:, 0].copy(), counts.astype(np.int64), lo, hi


def _all_tasks(data: RunData):
    """The task ids of the written and the filtered rows as one array (one type)."""
    import pyarrow as pa

    parts = [pa.array(t.tolist() if t.dtype == object else t) for t in (data.task, data.filtered_task) if len(t)]
    if not parts:
        return pa.array([], pa.int64())
    return pa.concat_arrays([p.cast(parts[0].type) for p in parts])


@dataclass
class GroupCounts:
    """Per batch, over the (batch, task) groups in the output (written and, with
    --keep-filtered, filtered rows): groups, groups solved by every run, by none."""

    batch: np.ndarray
    groups: np.ndarray
    all_solved: np.ndarray
    none_solved: np.ndarray
    sizes: dict[int, int]
    """rows in a group -> groups of that size."""


def group_counts(data: RunData, solved_at: float) -> GroupCounts:
    gb, rows, lo, hi = group_table(
        np.concatenate([data.batch, data.filtered_batch]), _all_tasks(data),
        np.concatenate([data.reward, data.filtered_reward]),
    )
    ids, at = np.unique(gb, return_inverse=True)
    at = at.reshape(-1)
    groups = np.bincount(at, minlength=len(ids))
    all_solved = np.bincount(at, weights=(lo >= solved_at), minlength=len(ids)).astype(np.int64)
    none_solved = np.bincount(at, weights=(hi < solved_at), minlength=len(ids)).astype(np.int64)
    sizes, counts = np.unique(rows, return_counts=True)
    return GroupCounts(ids, groups, all_solved, none_solved, dict(zip(sizes.tolist(), counts.tolist())))


def chart_groups(doc, data: RunData, plt, path, solved_at: float) -> str:
    batches = [b for b in _batches(doc) if b["groups"]]
    x = np.array([b["batch"] for b in batches])
    groups = np.array([b["groups"] for b in batches], dtype=float)
    dead = np.array([b.get("groups_zero_std", 0) for b in batches]) / np.maximum(groups, 1)
    counts = group_counts(data, solved_at)
    where = {int(b): i for i, b in enumerate(counts.batch.tolist())}
    pick = lambda values: np.array([values[where[int(b)]] if int(b) in where else 0 for b in x], dtype=np.int64)  # noqa: E731
    seen = np.maximum(pick(counts.groups), 1)
    all_solved = pick(counts.all_solved) / seen
    none_solved = pick(counts.none_solved) / seen
    fig, ax = plt.subplots(figsize=(7, 3.8))
    labels = ("zero reward spread (dead)", f"solved by all runs (reward ≥ {solved_at:g})", "solved by none")
    colors = ("#c44e52", "#55a868", "#8172b2")
    note = ""
    if len(x) <= 12:  # side-by-side bars: one batch, or a few, read best as bars
        for i, (values, label, color) in enumerate(zip((dead, all_solved, none_solved), labels, colors)):
            ax.bar(x + (i - 1) * 0.27, values, width=0.27, label=label, color=color)
    else:
        series = (dead, all_solved, none_solved)
        if len(x) > MAX_POINTS_PER_LINE:
            counts = [dead * groups, all_solved * seen, none_solved * seen]
            xs, pooled_dead, bins = _binned(x, counts[:1], groups)
            _, pooled_solved, _ = _binned(x, counts[1:], seen.astype(float))
            x, series = xs, (pooled_dead[0], *pooled_solved)
            note = bins.note("Shares pooled")
        for values, label, color in zip(series, labels, colors):
            ax.plot(x, values, label=label, color=color, marker="o" if len(x) <= MAX_POINTS_PER_LINE else None, linewidth=1.5)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("batch")
    ax.set_ylabel("share of groups")
    ax.set_title("Dead, all-solved and none-solved groups per batch")
    _integer_batches(ax, x)
    ax.grid(alpha=0.3)
    _legend(ax)
    _save(fig, plt, path)
    covered = "all groups" if data.has_filtered_files or not doc["totals"]["rows_filtered"] else (
        "the groups written (filtered groups are not in the output; --keep-filtered keeps them)"
    )
    return f"Dead share from metrics.json (all groups); solved shares over {covered}.{note}"


PASS_RATE_BINS = np.linspace(0.0, 1.0, 11)
"""Ten pass-rate bins of width 0.1; the last holds 1.0 (np.histogram closes the last bin)."""


def group_pass_rates(batch: np.ndarray, task: np.ndarray, reward: np.ndarray, solved_at: float):
    """(batch of each (batch, task) group, its pass rate: the share of rows with reward >= solved_at)."""
    if not len(batch):
        return np.zeros(0, np.int64), np.zeros(0)
    keys = np.char.add(np.char.add(batch.astype(str), "\x00"), task.astype(str))
    _, inverse, counts = np.unique(keys, return_inverse=True, return_counts=True)
    passes = np.bincount(inverse, weights=(reward >= solved_at).astype(float), minlength=len(counts))
    gb = np.zeros(len(counts), np.int64)
    gb[inverse] = batch
    return gb, passes / counts


def chart_difficulty(doc, data: RunData, plt, path, solved_at: float) -> str:
    """Left: the histogram of every group's pass rate; right: per batch (pooled into at most
    MAX_BOXES bins of consecutive batches), the share of its groups in each pass-rate bin."""
    gb, rate = group_pass_rates(
        np.concatenate([data.batch, data.filtered_batch]),
        np.concatenate([data.task.astype(str), data.filtered_task.astype(str)]),
        np.concatenate([data.reward, data.filtered_reward]), solved_at,
    )
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [1, 2]})
    counts, _ = np.histogram(rate, bins=PASS_RATE_BINS)
    left.bar(PASS_RATE_BINS[:-1] + 0.05, counts, width=0.095, color="#4c72b0")
    left.set_xlim(0, 1)
    left.set_xlabel(f"pass rate (reward ≥ {solved_at:g})")
    left.set_ylabel("groups")
    left.set_title(f"All {plural(len(rate), 'group')}")
    left.yaxis.get_major_locator().set_params(integer=True)
    left.grid(alpha=0.3)
    batches = np.unique(gb)
    note = ""
    if len(batches):
        pools = np.array_split(batches, min(len(batches), MAX_BOXES))
        grid = np.zeros((len(PASS_RATE_BINS) - 1, len(pools)))
        for j, pool in enumerate(pools):
            in_pool = np.isin(gb, pool)
            grid[:, j], _ = np.histogram(rate[in_pool], bins=PASS_RATE_BINS)
            grid[:, j] /= max(1, int(in_pool.sum()))
        image = right.imshow(grid, origin="lower", aspect="auto", cmap="viridis", vmin=0, vmax=1,
                             extent=(-0.5, len(pools) - 0.5, 0, 1))
        labels = [str(p[0]) if len(p) == 1 else f"{p[0]}–{p[-1]}" for p in pools]
        step = max(1, len(pools) // 12)
        right.set_xticks(range(0, len(pools), step), labels[::step], rotation=30 if step > 1 or len(pools) > 8 else 0)
        fig.colorbar(image, ax=right, label="share of the batch's groups")
        if len(pools) < len(batches):
            note = f" Batches pooled into {len(pools)} bins of consecutive batches."
    right.set_xlabel("batch")
    right.set_ylabel("pass rate")
    right.set_title("Pass-rate histogram per batch")
    _save(fig, plt, path)
    covered = "all groups" if data.has_filtered_files or not doc["totals"]["rows_filtered"] else (
        "the groups written (filtered groups are not in the output; --keep-filtered keeps them)")
    return f"Pass rates over {covered}.{note}"


def chart_reward(doc, data: RunData, plt, path) -> str:
    batches = _batches(doc)
    ids = [b["batch"] for b in batches]
    bins = Bins.of(ids)
    batch = np.concatenate([data.batch, data.filtered_batch])
    reward = np.concatenate([data.reward, data.filtered_reward])
    fig, ax = plt.subplots(figsize=(7, 3.8))
    _boxes(ax, bins, bins.split(batch, reward), "#4c72b0")
    mean = np.array([b[MEAN_KEY] if b[MEAN_KEY] is not None else np.nan for b in batches], dtype=float)
    if not bins.binned:
        ax.plot(np.arange(len(ids)), mean, color="#dd8452", marker="D", markersize=4, linewidth=1.2,
                label="mean of group reward means (metrics.json)")
        _legend(ax, 1)
    ax.set_xlabel("batch")
    ax.set_ylabel("reward")
    ax.set_title("Reward per batch")
    ax.grid(alpha=0.3, axis="y")
    _save(fig, plt, path)
    rows = "written and filtered rows" if data.has_filtered_files else "written rows (copies left out)"
    return f"Over the {rows}.{bins.note()}"


def chart_scores(doc, data: RunData, plt, path) -> str:
    ids = [b["batch"] for b in _batches(doc)]
    bins = Bins.of(ids)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    n = len(data.scores)
    if n:
        _boxes(ax, bins, bins.split(data.batch, data.score), "#55a868")
        ax.axhline(0, color="#888", linewidth=0.8)
    else:
        ax.text(0.5, 0.5, "no scores written (no advantage stage, or no rows kept)", ha="center", va="center",
                transform=ax.transAxes)
    ax.set_xlabel("batch")
    ax.set_ylabel("score")
    ax.set_title(f"Scores per batch: {doc['strategy']}  ({n:,} rows)")
    ax.grid(alpha=0.3, axis="y")
    _save(fig, plt, path)
    return f"Scores of the original rows (copies repeat them).{bins.note()}"


def _corr(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 3 or np.std(a) == 0 or np.std(b) == 0:
        return np.nan
    return float(np.corrcoef(a, b)[0, 1])


def chart_length(doc, data: RunData, plt, path) -> str:
    ok = ~np.isnan(data.score) & ~np.isnan(data.length)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [1.2, 1]})
    ids = np.unique(data.batch[ok])
    note = ""
    if len(ids) > MAX_POINTS_PER_LINE:  # a few rows per batch give a noisy r: pool consecutive batches
        bins = Bins.of(list(ids), MAX_BOXES)
        at = [ok & (data.batch >= a) & (data.batch <= b) for a, b in bins.edges]
        r = np.array([_corr(data.length[m], data.score[m]) for m in at])
        ids = np.array([(a + b) / 2 for a, b in bins.edges])
        note = bins.note("Right: r pooled")
    else:
        r = np.array([_corr(data.length[ok & (data.batch == b)], data.score[ok & (data.batch == b)]) for b in ids])
    overall = _corr(data.length[ok], data.score[ok])
    if ok.sum():
        at = np.flatnonzero(ok)
        if len(at) > MAX_POINTS:
            at = np.sort(np.random.default_rng(0).choice(at, MAX_POINTS, replace=False))
        left.scatter(data.length[at], data.score[at], s=6, alpha=0.35, color="#4c72b0", linewidths=0)
        left.axhline(0, color="#888", linewidth=0.8)
        left.set_title(f"Length vs score (r = {overall:.2f})" if not np.isnan(overall) else "Length vs score")
        right.plot(ids, r, marker="o" if len(ids) <= 60 else None, color="#c44e52")
        right.axhline(0, color="#888", linewidth=0.8)
        right.set_ylim(-1.05, 1.05)
        _integer_batches(right, ids)
    else:
        for ax in (left, right):
            ax.text(0.5, 0.5, "no scores or no response lengths", ha="center", va="center", transform=ax.transAxes)
        left.set_title("Length vs score")
    left.set_xlabel("response tokens")
    left.set_ylabel("score")
    right.set_xlabel("batch")
    right.set_ylabel("Pearson r (length, score)")
    right.set_title("Correlation per batch")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    _save(fig, plt, path)
    sampled = f" Left: an even sample of {MAX_POINTS:,} of {int(ok.sum()):,} rows." if ok.sum() > MAX_POINTS else ""
    return f"Overall r = {overall:.3f}.{sampled}{note}" if not np.isnan(overall) else "No correlation to show."


def group_sizes(data: RunData) -> tuple[np.ndarray, str]:
    """(rows of each group, what they count): the (batch, task) groups in the output, or with
    --audit-columns and no filtered files, each group's size as read (before any filter)."""
    _, rows, _, _ = group_table(
        np.concatenate([data.batch, data.filtered_batch]), _all_tasks(data), np.concatenate([data.reward, data.filtered_reward])
    )
    if "group_size" in data.audit and not data.has_filtered_files:
        _, _, lo, _ = group_table(data.batch, _all_tasks(data), data.audit["group_size"])
        return lo.astype(np.int64), "rows per group as read (audit column group_size)"
    return rows, "rows per (batch, task) group in the output"


def chart_sizes(doc, data: RunData, plt, path) -> str:
    rows, source = group_sizes(data)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    if len(rows):
        sizes, counts = np.unique(rows, return_counts=True)
        ax.bar(sizes, counts, width=0.8 if len(sizes) < 50 else 1.0, color="#8172b2")
        for s, c in zip(sizes[:30], counts[:30]):
            ax.text(s, c, f"{c:,}", ha="center", va="bottom", fontsize=8)
        _integer_batches(ax, list(sizes))
        ax.set_ylim(0, counts.max() * 1.15)
    else:
        ax.text(0.5, 0.5, "no groups in the output", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("rows in the group")
    ax.set_ylabel("groups")
    ax.set_title(f"Group sizes ({len(rows):,} groups)")
    ax.grid(alpha=0.3, axis="y")
    _save(fig, plt, path)
    return f"Counts of {source}."


def chart_rejects(doc, data: RunData, plt, path) -> str:
    batches = _batches(doc)
    x = np.array([b["batch"] for b in batches])
    series = {
        "written": np.array([b.get("rows_written_original", b["rows_written"] - b["rows_duplicated"]) for b in batches]),
        "copies": np.array([b["rows_duplicated"] for b in batches]),
        "filtered": np.array([b["rows_filtered"] for b in batches]),
        "rejected": np.array([b["rows_rejected"] for b in batches]),
    }
    colors = {"written": "#4c72b0", "copies": "#55a868", "filtered": "#dd8452", "rejected": "#c44e52"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), gridspec_kw={"width_ratios": [1.2, 1]})
    bottom = np.zeros(len(x))
    width = 0.8 if len(x) < 200 else 1.0
    for name, values in series.items():
        if values.any():
            left.bar(x, values, width=width, bottom=bottom, label=name, color=colors[name], linewidth=0)
            bottom = bottom + values
    left.set_xlabel("batch")
    left.set_ylabel("rows")
    left.set_title("Rows per batch by outcome")
    _integer_batches(left, x)
    left.grid(alpha=0.3, axis="y")
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=4, fontsize=8, frameon=False)
    t = doc["totals"]
    reasons = {f"rejected: {k}": v for k, v in t["reject_reasons"].items()}
    if data.filter_reasons:
        reasons.update({f"filtered: {k}": v for k, v in data.filter_reasons.items()})
    else:
        for name, counts in t.get("strategies", {}).items():
            if counts.get("filtered_count"):
                reasons[f"filtered by {name}"] = counts["filtered_count"]
    if reasons:
        names = sorted(reasons, key=lambda k: -reasons[k])[:10]
        # the reason is written above its bar: long reasons stay readable and the panel keeps its width
        right.barh(range(len(names)), [reasons[n] for n in names], height=0.45,
                   color=["#c44e52" if n.startswith("rejected") else "#dd8452" for n in names])
        right.set_yticks([])
        right.set_ylim(len(names) - 0.4, -0.9)
        for i, n in enumerate(names):
            right.text(0, i - 0.3, n if len(n) <= 60 else n[:58] + "…", va="bottom", fontsize=8)
            right.text(reasons[n], i, f" {reasons[n]:,}", va="center", fontsize=8)
        right.set_xlim(0, max(reasons.values()) * 1.2)
    else:
        right.text(0.5, 0.5, "no rows filtered or rejected", ha="center", va="center", transform=right.transAxes)
        right.set_yticks([])
    right.set_xlabel("rows")
    right.set_title(f"Dropped rows by reason ({t['rows_filtered'] + t['rows_rejected']:,} of {t['rows_read']:,})")
    _save(fig, plt, path)
    return "Counts from metrics.json" + ("; filter reasons from filtered-*.parquet." if data.filter_reasons else ".")


def chart_columns(doc, data: RunData, plt, path) -> str:
    names = list(data.extra)[:12]
    fig, ax = plt.subplots(figsize=(7, 3.8))
    values = [v[~np.isnan(v)] for v in (data.extra[n] for n in names)]
    filled = [v if len(v) else np.array([np.nan]) for v in values]
    ax.boxplot(filled, widths=0.6, showfliers=True, flierprops={"markersize": 2, "alpha": 0.4})
    ax.set_xticks(np.arange(1, len(names) + 1))
    ax.set_xticklabels(names, rotation=20, fontsize=8)
    ax.set_ylabel("value")
    ax.set_title("Other numeric columns (reward / model outputs)")
    ax.grid(alpha=0.3, axis="y")
    _save(fig, plt, path)
    more = f" (the first 12 of {len(data.extra)})" if len(data.extra) > 12 else ""
    return f"Columns: {', '.join(names)}{more}; written rows, copies left out."


def chart_audit(doc, data: RunData, plt, path) -> str:
    ids = [b["batch"] for b in _batches(doc)]
    bins = Bins.of(ids)
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    _boxes(left, bins, bins.split(data.batch, data.audit.get("group_reward_std", np.full(len(data.batch), np.nan))), "#8172b2")
    left.set_title("group_reward_std per batch")
    _boxes(right, bins, bins.split(data.batch, data.audit.get("baseline", np.full(len(data.batch), np.nan))), "#937860")
    right.set_title("baseline per batch")
    for ax in (left, right):
        ax.set_xlabel("batch")
        ax.grid(alpha=0.3, axis="y")
    _save(fig, plt, path)
    return f"From the audit columns of scored-*.parquet.{bins.note()}"


OFFPOLICY_KEYS = (
    "kl", "k3_kl", "training_ppl", "rollout_ppl", "ppl_ratio", "log_ppl_diff", "log_ppl_abs_diff",
    "log_ppl_diff_max", "log_ppl_diff_min", "chi2_token", "chi2_seq", "rollout_is_eff_sample_size",
    "rollout_is_mean", "rollout_is_std", "rollout_is_ratio_fraction_high", "rollout_is_ratio_fraction_low",
)
"""The per-batch off-policy diagnostics the report shows (metrics.json `rollout_correction`)."""


def offpolicy_batches(doc) -> list[tuple[int, dict]]:
    """(batch, its `rollout_correction` metrics) of each batch that has them, in batch order."""
    return [(b["batch"], b["rollout_correction"]) for b in _batches(doc) if isinstance(b.get("rollout_correction"), dict)]


def chart_offpolicy(doc, data: RunData, plt, path) -> str:
    entries = offpolicy_batches(doc)
    x = np.array([b for b, _ in entries])

    def series(key):
        return np.array([np.nan if m.get(key) is None else float(m[key]) for _, m in entries])

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8))
    marker = "o" if len(x) <= 60 else None
    for key, color in (("kl", "#4c72b0"), ("k3_kl", "#dd8452")):
        left.plot(x, series(key), marker=marker, markersize=3, color=color, label=key)
    left.axhline(0.0, color="#888", linewidth=0.8)
    left.set_title("KL(rollout ‖ training) per batch")
    for key, color in (("chi2_token", "#55a868"), ("chi2_seq", "#c44e52")):
        right.plot(x, series(key), marker=marker, markersize=3, color=color, label=key)
    right.set_yscale("symlog", linthresh=1e-3)
    right.set_title("χ² of the importance weights per batch")
    for ax in (left, right):
        ax.set_xlabel("batch")
        _integer_batches(ax, x)
        ax.grid(alpha=0.3)
        _legend(ax, ncol=2)
    _save(fig, plt, path)
    return f"From metrics.json rollout_correction ({plural(len(entries), 'batch', 'batches')}); every value is in the table below."


def _offpolicy_table(doc) -> str:
    entries = offpolicy_batches(doc)
    if not entries:
        return ""
    keys = [k for k in OFFPOLICY_KEYS if any(k in m for _, m in entries)]
    head = "<tr><th>batch</th>" + "".join(f"<th>{html.escape(k)}</th>" for k in keys) + "</tr>"
    rows = "".join(
        f"<tr><td>{_fmt(b)}</td>" + "".join(f"<td>{_fmt(m.get(k))}</td>" for k in keys) + "</tr>" for b, m in entries
    )
    total = doc["totals"].get("rollout_correction") or {}
    rows += "<tr><th>all</th>" + "".join(f"<td>{_fmt(total.get(k))}</td>" for k in keys) + "</tr>"
    return f'<h2>Off-policy diagnostics per batch</h2><div class="scroll tall"><table id="offpolicy">{head}{rows}</table></div>'


# --- the page -----------------------------------------------------------------------------------


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
        cells = "".join(f"<td>{_fmt(stats.get(name, {}).get(k))}</td>" for k in keys)
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
        f"<tr><td>{_fmt(int(b))}</td><td>{_fmt(int(g))}</td><td>{_fmt(int(a))}</td><td>{_fmt(int(n))}</td></tr>"
        for b, g, a, n in zip(counts.batch.tolist(), counts.groups.tolist(), counts.all_solved.tolist(), counts.none_solved.tolist())
    )
    out = f'<h2>Groups per batch</h2><div class="scroll tall"><table id="groups">{head}{rows}</table></div>'
    if sizes is not None:
        values, what = sizes
        found, number = np.unique(values, return_counts=True)
        cells = "".join(f"<tr><td>{_fmt(int(k))}</td><td>{_fmt(int(v))}</td></tr>" for k, v in zip(found.tolist(), number.tolist()))
        out += (f'<h2>Group sizes</h2><p>{html.escape(what.capitalize())}.</p><div class="scroll tall"><table id="sizes">'
                f"<tr><th>rows in the group</th><th>groups</th></tr>{cells}</table></div>")
    return out


def render_html(doc: dict[str, Any], images: dict[str, bytes], captions: dict[str, str] | None = None, *,
                groups: GroupCounts | None = None, sizes: tuple[np.ndarray, str] | None = None, solved_at: float = 1.0) -> str:
    captions = captions or {}
    t = doc["totals"]
    totals = "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(t.get(k))}</td></tr>" for k in TOTAL_KEYS)
    head = "".join(f"<th>{html.escape(k.replace('group_advantages/', ''))}</th>" for k in ("batch", *BATCH_KEYS))
    rows = "".join(
        "<tr>" + "".join(f"<td>{_fmt(b.get(k))}</td>" for k in ("batch", *BATCH_KEYS)) + "</tr>" for b in doc["batches"]
    )
    reasons = "".join(f"<tr><th>{html.escape(k)}</th><td>{_fmt(v)}</td></tr>" for k, v in t["reject_reasons"].items())
    figures = "".join(
        f'<figure class="{"wide" if name in WIDE else ""}"><img alt="{name}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
        f"<figcaption><b>{html.escape(CAPTIONS.get(name, ''))}</b> {html.escape(captions.get(name, ''))}</figcaption></figure>"
        for name, data in images.items()
    )
    skipped = "".join(f"<li>{html.escape(f['path'])}: {html.escape(f['reason'])}</li>" for f in doc.get("skipped_files", []))
    failed = f'<p class="failed">Run failed: {html.escape(doc["failed"])}</p>' if doc.get("failed") else ""
    n_batches = len(_batches(doc))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>Rescore report: {html.escape(doc['output'])}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="rescore-config-hash" content="{html.escape(doc.get('config_hash', ''))}">
<style>
body {{ font: 14px/1.45 system-ui, sans-serif; margin: 1.5em auto; max-width: 1180px; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0; }}
th, td {{ border: 1px solid #ddd; padding: 3px 8px; text-align: right; white-space: nowrap; }}
th {{ background: #f6f6f6; text-align: left; }} td.left {{ text-align: left; }}
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
· algorithm <code>{_fmt(doc.get('algorithm'))}</code> · Rescore {html.escape(doc.get('rescore_version', '?'))}
· config hash <code>{html.escape(doc.get('config_hash', '')[:16])}</code> · {plural(doc.get('input_files') or 0, 'input file')}
· {plural(n_batches, 'batch', 'batches')}</p>
{failed}
<h2>Totals</h2><div class="scroll"><table id="totals">{totals}</table></div>
<h2>Charts</h2><div class="charts">{figures}</div>
<h2>Per batch</h2><div class="scroll tall"><table id="batches"><tr>{head}</tr>{rows}</table></div>
{_groups_tables(groups, sizes, solved_at)}
{_offpolicy_table(doc)}
<h2>Strategy stages</h2>{_stages_table(doc)}
<h2>Reject reasons</h2><table>{reasons or '<tr><td>none</td></tr>'}</table>
{f'<h2>Skipped input files</h2><ul>{skipped}</ul>' if skipped else ''}
</body></html>
"""


def write_report(output: str, to: str | None = None, solved_at: float = 1.0) -> dict[str, str]:
    """Write report.html and report-*.png for the run in `output`; returns {name: path}."""
    if to is None and not storage.is_local(output):
        raise ReportError(f"{output} is not a local directory: pass --to LOCAL_DIR for the report files")
    to = to or output
    _check_target(to)  # before anything is read or drawn
    doc = load_metrics(output)
    data = read_run(output)
    os.makedirs(to, exist_ok=True)
    html_path = os.path.join(to, REPORT_HTML)
    if os.path.exists(html_path) and not _is_report(html_path):
        raise ReportError(f"{html_path} is not a Rescore report, and Rescore replaces only its own files: "
                          "move it away or pass --to another directory")
    for old in report_files(to):  # charts of an earlier report that this one may not draw
        os.remove(old)
    plt = _plt()
    names = list(CHARTS) + (["columns"] if data.extra else []) + (["audit"] if data.audit else [])
    names += ["offpolicy"] if offpolicy_batches(doc) else []
    paths = {name: os.path.join(to, report_chart(name)) for name in names}
    captions = {
        "groups": chart_groups(doc, data, plt, paths["groups"], solved_at),
        "reward": chart_reward(doc, data, plt, paths["reward"]),
        "scores": chart_scores(doc, data, plt, paths["scores"]),
        "length": chart_length(doc, data, plt, paths["length"]),
        "sizes": chart_sizes(doc, data, plt, paths["sizes"]),
        "rejects": chart_rejects(doc, data, plt, paths["rejects"]),
        "difficulty": chart_difficulty(doc, data, plt, paths["difficulty"], solved_at),
    }
    if data.extra:
        captions["columns"] = chart_columns(doc, data, plt, paths["columns"])
    if data.audit:
        captions["audit"] = chart_audit(doc, data, plt, paths["audit"])
    if "offpolicy" in paths:
        captions["offpolicy"] = chart_offpolicy(doc, data, plt, paths["offpolicy"])
    images = {}
    for name, path in paths.items():
        with open(path, "rb") as f:
            images[name] = f.read()
    paths["html"] = os.path.join(to, REPORT_HTML)
    with open(paths["html"], "w", encoding="utf-8") as f:
        f.write(render_html(doc, images, captions, groups=group_counts(data, solved_at), sizes=group_sizes(data), solved_at=solved_at))
    _own(to, paths.values())
    return paths


def _check_target(to: str) -> None:
    """ReportError (one line) where the report cannot be written to `to`."""
    from rescore.transforms.files import ownership

    try:
        ownership.check_output_path(to, "--to")
    except ownership.OutputError as e:
        raise ReportError(str(e)) from None


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
