"""Task difficulty statistics (`rescore task-stats`): exact, order-free summaries of every
(batch, task) group and of every task across batches. No Beam (transforms/task_stats.py is the
shell), Arrow only to read a table's id and reward columns.

Exactness. A group's reward sum and sum of squares are kept as Python integers in units of
2**-1074 (2**-2148 for squares): every finite float64 is an integer multiple of 2**-1074, so
the sums are exact whatever the order in which rows, files or workers' partial results are
added, and the mean and variance are rounded once at the end. pass@k is computed from integer
binomials as a Fraction. So a task's statistics do not depend on the number of workers, on how
the input is split into files, or on the order in which pieces arrive (docs/output.md, "Task
statistics", gives every formula).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Iterable

import pyarrow as pa
import pyarrow.compute as pc


SCALE = 1074
"""Every finite float64 is an integer times 2**-SCALE (the smallest subnormal)."""

DEFAULT_KS = (1, 4, 8)
DEFAULT_THRESHOLD = 1.0
DEFAULT_LAMB = 0.2
"""Trinity-RFT 0.6.0's DifficultyBasedSelector default `lamb` (the discount of the history)."""
ID_COLUMNS = ("batch", "task", "run", "reward")


def scaled(x: float) -> int:
    """x * 2**SCALE, exactly (x finite)."""
    num, den = float(x).as_integer_ratio()
    return num << (SCALE - (den.bit_length() - 1))


def scaled_square(x: float) -> int:
    """x**2 * 2**(2 * SCALE), exactly."""
    num, den = float(x).as_integer_ratio()
    return (num * num) << (2 * SCALE - 2 * (den.bit_length() - 1))


@dataclass(frozen=True)
class GroupSummary:
    """One (batch, task) group, or a part of one: everything the statistics need, merged
    exactly by `merge` in any order."""

    rows: int
    runs: frozenset
    passes: int
    reward_sum: int  # scaled by 2**SCALE
    reward_squares: int  # scaled by 2**(2 * SCALE)

    def merge(self, other: "GroupSummary") -> "GroupSummary":
        return GroupSummary(
            self.rows + other.rows,
            self.runs | other.runs,
            self.passes + other.passes,
            self.reward_sum + other.reward_sum,
            self.reward_squares + other.reward_squares,
        )


EMPTY = GroupSummary(0, frozenset(), 0, 0, 0)


def merge_all(parts: Iterable[GroupSummary]) -> GroupSummary:
    out = EMPTY
    for p in parts:
        out = out.merge(p)
    return out


def usable_rows(table: pa.Table) -> tuple[pa.Table, int]:
    """The rows with a batch, task, run and a finite reward, and how many were left out."""
    reward = pc.cast(table["reward"], pa.float64())
    ok = pc.and_(pc.is_finite(reward), pc.is_valid(reward))
    for name in ("batch", "task", "run"):
        ok = pc.and_(ok, pc.is_valid(table[name]))
    ok = pc.fill_null(ok, False)
    kept = table.filter(ok)
    return kept.set_column(kept.schema.get_field_index("reward"), "reward", pc.cast(kept["reward"], pa.float64())), (
        table.num_rows - kept.num_rows
    )


def summarize(table: pa.Table, threshold: float) -> dict[tuple[Any, int], GroupSummary]:
    """{(task, batch): GroupSummary} of a table's usable rows (see `usable_rows`). A row passes
    where reward >= threshold."""
    if table.num_rows == 0:
        return {}
    by_value = table.group_by(["task", "batch", "reward"]).aggregate([("run", "count")])
    runs = table.group_by(["task", "batch"]).aggregate([("run", "distinct")])
    out: dict[tuple[Any, int], GroupSummary] = {}
    for task, batch, reward, count in zip(
        by_value["task"].to_pylist(), by_value["batch"].to_pylist(), by_value["reward"].to_pylist(),
        by_value["run_count"].to_pylist(),
    ):
        part = GroupSummary(count, frozenset(), count if reward >= threshold else 0,
                            count * scaled(reward), count * scaled_square(reward))
        key = (task, batch)
        out[key] = out[key].merge(part) if key in out else part
    for task, batch, distinct in zip(runs["task"].to_pylist(), runs["batch"].to_pylist(), runs["run_distinct"].to_pylist()):
        g = out[(task, batch)]
        out[(task, batch)] = GroupSummary(g.rows, frozenset(distinct), g.passes, g.reward_sum, g.reward_squares)
    return out


def pass_at_k(n: int, c: int, k: int) -> Fraction | None:
    """The unbiased pass@k of a group of n samples with c passing: 1 - C(n-c, k) / C(n, k),
    exactly (integer binomials); None where n < k (undefined)."""
    if n < k:
        return None
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def mean_std(rows: int, reward_sum: int, reward_squares: int) -> tuple[float, float | None]:
    """The mean and the sample standard deviation (ddof 1; None for one row), each rounded once
    from exact sums."""
    mean = Fraction(reward_sum, rows << SCALE)
    if rows < 2:
        return float(mean), None
    # sum((x - mean)^2) = Q - S^2 / n, exact in rationals
    ss = Fraction(reward_squares, 1 << (2 * SCALE)) - Fraction(reward_sum * reward_sum, rows << (2 * SCALE))
    var = ss / (rows - 1)
    return float(mean), sqrt_fraction(var)


def sqrt_fraction(x: Fraction) -> float | None:
    """sqrt(x) of an exact non-negative rational, as a float: the true std of finite rewards
    fits a float even where their variance does not (rewards 1e200, -1e200, 0: variance 1e400,
    std 1e200), nor underflows where it is below the smallest normal; None where the std itself
    passes the float range (|rewards| near 1.8e308)."""
    if x <= 0:
        return 0.0
    try:
        f = float(x)
    except OverflowError:
        f = math.inf
    if math.isfinite(f) and f >= 2.0**-1000:  # the variance is a normal float: as always
        return math.sqrt(f)
    p, q = x.numerator, x.denominator
    k = max(0, (128 - (p.bit_length() - q.bit_length())) // 2 + 1)  # 64+ significant bits
    root = math.isqrt((p << (2 * k)) // q)  # floor(sqrt(x) * 2**k)
    drop = max(0, root.bit_length() - 64)
    try:
        return math.ldexp(float(root >> drop), drop - k)
    except OverflowError:
        return None


def group_row(task: Any, batch: int, g: GroupSummary, ks: tuple[int, ...], exact: bool = False) -> dict[str, Any]:
    """One row of task_batch_stats.parquet; with `exact`, also the group's exact state
    (EXACT_COLUMNS), from which `from_group_row` gives the GroupSummary back."""
    mean, std = mean_std(g.rows, g.reward_sum, g.reward_squares)
    row = {
        "task": task, "batch": batch, "rows": g.rows, "runs": len(g.runs), "passes": g.passes,
        "pass_rate": g.passes / g.rows, "reward_mean": mean, "reward_std": std,
    }
    for k in ks:
        p = pass_at_k(g.rows, g.passes, k)
        row[f"pass_at_{k}"] = None if p is None else float(p)
    if exact:
        row.update(run_ids=sorted(g.runs), reward_sum_exact=str(g.reward_sum), reward_squares_exact=str(g.reward_squares))
    return row


EXACT_COLUMNS = (("run_ids", pa.list_(pa.int64())), ("reward_sum_exact", pa.string()), ("reward_squares_exact", pa.string()))
"""A group's exact state in an incremental table: its run ids, and its sums as decimal integers
in units of 2**-SCALE and 2**-(2 * SCALE)."""


def from_group_row(row: dict[str, Any]) -> GroupSummary:
    return GroupSummary(row["rows"], frozenset(row["run_ids"]), row["passes"], int(row["reward_sum_exact"]),
                        int(row["reward_squares_exact"]))


def beta_posterior(groups: list[tuple[int, GroupSummary]], lamb: float, m: float | None) -> tuple[float, float]:
    """Trinity-RFT 0.6.0's Beta(alpha, beta) pass-rate estimate (BaseBetaPREstimator), updated
    once per batch that saw the task, in batch order, from alpha = beta = 1:
        alpha <- (1 - lamb) * alpha + lamb + p * m
        beta  <- (1 - lamb) * beta  + lamb + (1 - p) * m
    with p the group's mean reward (Trinity's PassRateCalculator) and m the group's rows (or a
    fixed m, Trinity's `m`). For a seen task Trinity's rho-weighted mix of (1 - rho) * s_bar and
    rho * p_tilde * m is exactly p * m, since it sets p_tilde to the observed pass rate."""
    alpha = beta = 1.0
    for _, g in sorted(groups, key=lambda bg: bg[0]):
        p = float(Fraction(g.reward_sum, g.rows << SCALE))
        weight = float(g.rows) if m is None else m
        alpha = (1 - lamb) * alpha + lamb + p * weight
        beta = (1 - lamb) * beta + lamb + (1 - p) * weight
    return alpha, beta


def task_row(task: Any, groups: dict[int, GroupSummary], ks: tuple[int, ...], lamb: float = DEFAULT_LAMB,
             beta_m: float | None = None) -> dict[str, Any]:
    """One row of task_stats.parquet from the task's complete (batch -> group) summaries."""
    batches = sorted(groups)
    total = merge_all(groups[b] for b in batches)
    mean, std = mean_std(total.rows, total.reward_sum, total.reward_squares)
    row = {
        "task": task, "rows": total.rows, "runs": sum(len(groups[b].runs) for b in batches),
        "batches": len(batches), "first_batch": batches[0], "last_batch": batches[-1],
        "passes": total.passes, "pass_rate": total.passes / total.rows, "reward_mean": mean, "reward_std": std,
    }
    for k in ks:
        values = [p for p in (pass_at_k(groups[b].rows, groups[b].passes, k) for b in batches) if p is not None]
        row[f"pass_at_{k}"] = float(sum(values, Fraction(0)) / len(values)) if values else None
        row[f"pass_at_{k}_groups"] = len(values)
    alpha, beta = beta_posterior(list(groups.items()), lamb, beta_m)
    with_beta = math.isfinite(alpha) and math.isfinite(beta) and alpha + beta != 0 and math.isfinite(alpha + beta)
    # Rewards far outside [0, 1] (the estimator's domain) can take it past the float range:
    # then the three values are null, never inf or NaN.
    row.update(beta_alpha=alpha if with_beta else None, beta_beta=beta if with_beta else None,
               beta_mean=alpha / (alpha + beta) if with_beta else None)
    return row


def task_schema(task_type: pa.DataType, ks: tuple[int, ...]) -> pa.Schema:
    fields = [
        ("task", task_type), ("rows", pa.int64()), ("runs", pa.int64()), ("batches", pa.int64()),
        ("first_batch", pa.int64()), ("last_batch", pa.int64()), ("passes", pa.int64()), ("pass_rate", pa.float64()),
        ("reward_mean", pa.float64()), ("reward_std", pa.float64()),
    ]
    for k in ks:
        fields += [(f"pass_at_{k}", pa.float64()), (f"pass_at_{k}_groups", pa.int64())]
    fields += [("beta_alpha", pa.float64()), ("beta_beta", pa.float64()), ("beta_mean", pa.float64())]
    return pa.schema(fields)


def group_schema(task_type: pa.DataType, ks: tuple[int, ...], exact: bool = False) -> pa.Schema:
    fields = [
        ("task", task_type), ("batch", pa.int64()), ("rows", pa.int64()), ("runs", pa.int64()), ("passes", pa.int64()),
        ("pass_rate", pa.float64()), ("reward_mean", pa.float64()), ("reward_std", pa.float64()),
    ]
    fields += [(f"pass_at_{k}", pa.float64()) for k in ks]
    if exact:
        fields += list(EXACT_COLUMNS)
    return pa.schema(fields)


def sort_key(row: dict[str, Any]) -> tuple:
    return (str(type(row["task"])), row["task"], row.get("batch", 0))


@dataclass(frozen=True, eq=False)
class TaskPassRates:
    """pass_rate_band's history (`task_stats=PATH`): each task of a `rescore task-stats` table with
    its pass rate. The launcher reads the table before any work (pipelines/task_history.py) and
    hands these numbers to the read step, which matches each row's task against them
    (history_rates): no step reads the file."""

    tasks: pa.Array
    """The table's task ids, each once."""
    rates: "np.ndarray"
    """(len(tasks),) float64 their pass rates (NaN for a null)."""

    @classmethod
    def of(cls, table: pa.Table, where: str) -> "TaskPassRates":
        """From the `task` and `pass_rate` columns of a task_stats.parquet read at `where`.
        ValueError where a task is listed twice (a table `rescore task-stats` did not write)."""
        import numpy as np

        tasks = table["task"].combine_chunks()
        if pc.count_distinct(tasks, mode="all").as_py() != len(tasks):
            counts = pc.value_counts(tasks)
            twice = counts.filter(pc.greater(counts.field("counts"), 1))[0]["values"].as_py()
            raise ValueError(f"{where}: task {twice!r} is listed more than once; the history filter cannot tell which pass rate is its")
        return cls(tasks, np.asarray(table["pass_rate"].fill_null(np.nan).to_numpy(zero_copy_only=False), dtype=np.float64))


def history_rates(task: pa.Array | pa.ChunkedArray, history: TaskPassRates) -> "np.ndarray":
    """(n,) float64: the pass rate of each task of `task` in `history`, matched by the task's
    exact value; NaN for a task the table does not hold (also every task where the table's ids
    are strings and these integers, or the reverse)."""
    import numpy as np

    tasks, rates = history.tasks, history.rates
    task = task.combine_chunks() if isinstance(task, pa.ChunkedArray) else task
    common = _common_id_type(task.type, tasks.type)
    if common is None or len(tasks) == 0:
        return np.full(len(task), np.nan)
    at = pc.index_in(task.cast(common), value_set=tasks.cast(common))
    index = np.asarray(at.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64)
    return np.where(index >= 0, np.append(rates, np.nan)[index], np.nan)


def _common_id_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return pa.int64()
    strings = (pa.types.is_string, pa.types.is_large_string)
    if any(f(a) for f in strings) and any(f(b) for f in strings):
        return pa.large_string()
    return None
