"""`rescore report`'s charts: one PNG per question (report-NAME.png, layout.report_chart), drawn
with matplotlib (Agg) from a run's data (report_data.py); each chart function returns its
caption. `draw` draws the charts a run has data for.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rescore.pipelines.report_data import (
    RunData, batch_entries, group_counts, group_pass_rates, group_sizes, offpolicy_batches, PASS_RATE_BINS,
)
from rescore.pipelines.wording import plural
from rescore.transforms.rows.metrics import MEAN_KEY


CHARTS = ("groups", "reward", "scores", "length", "sizes", "rejects", "difficulty")


OPTIONAL_CHARTS = ("columns", "audit", "offpolicy")


MAX_BOXES = 40
"""Box plots draw at most this many boxes; more batches are binned."""


MAX_POINTS = 4000
"""Scatter plots draw at most this many points (an even sample, seeded)."""


MAX_POINTS_PER_LINE = 60
"""Past this many batches, per-batch lines are drawn per bin of consecutive batches (Bins)."""


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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


def _finish(fig, plt, path, ax, xlabel: str, ylabel: str, title: str) -> None:
    """Label a one-panel chart (horizontal grid lines) and save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="y")
    _save(fig, plt, path)


def _legend(ax, ncol=3) -> None:
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=ncol, fontsize=9, frameon=False)


def chart_groups(doc, data: RunData, plt, path, solved_at: float) -> str:
    batches = [b for b in batch_entries(doc) if b["groups"]]
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
    batches = batch_entries(doc)
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
    _finish(fig, plt, path, ax, "batch", "reward", "Reward per batch")
    rows = "written and filtered rows" if data.has_filtered_files else "written rows (copies left out)"
    return f"Over the {rows}.{bins.note()}"


def chart_scores(doc, data: RunData, plt, path) -> str:
    ids = [b["batch"] for b in batch_entries(doc)]
    bins = Bins.of(ids)
    fig, ax = plt.subplots(figsize=(7, 3.8))
    n = len(data.scores)
    if n:
        _boxes(ax, bins, bins.split(data.batch, data.score), "#55a868")
        ax.axhline(0, color="#888", linewidth=0.8)
    else:
        ax.text(0.5, 0.5, "no scores written (no advantage stage, or no rows kept)", ha="center", va="center",
                transform=ax.transAxes)
    _finish(fig, plt, path, ax, "batch", "score", f"Scores per batch: {doc['strategy']}  ({n:,} rows)")
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
    _finish(fig, plt, path, ax, "rows in the group", "groups", f"Group sizes ({len(rows):,} groups)")
    return f"Counts of {source}."


def chart_rejects(doc, data: RunData, plt, path) -> str:
    batches = batch_entries(doc)
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
    ids = [b["batch"] for b in batch_entries(doc)]
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


def draw(doc, data: RunData, paths_of, solved_at: float) -> tuple[dict[str, str], dict[str, str]]:
    """Draw the charts `data` has something for into paths_of(name); ({name: path}, {name: caption})."""
    plt = pyplot()
    names = list(CHARTS) + (["columns"] if data.extra else []) + (["audit"] if data.audit else [])
    names += ["offpolicy"] if offpolicy_batches(doc) else []
    paths = {name: paths_of(name) for name in names}
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
    return paths, captions
