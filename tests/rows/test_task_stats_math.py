"""The task statistics' math (transforms/rows/task_stats.py): pass@k against its definition,
exact merging in any split and order, mean and std against polars, the Beta posterior against
Trinity-RFT's own estimator."""

import itertools
import math
import random
from fractions import Fraction

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from rescore.transforms.rows import task_stats as ts


@pytest.mark.parametrize("n", range(1, 9))
def test_pass_at_k_is_the_share_of_k_subsets_with_a_pass(n):
    for c in range(n + 1):
        samples = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(range(n), k))
            expected = Fraction(sum(any(samples[i] for i in s) for s in subsets), len(subsets))
            assert ts.pass_at_k(n, c, k) == expected
        assert ts.pass_at_k(n, c, n + 1) is None


def test_pass_at_k_closed_forms_for_large_groups():
    # pass@1 is c/n; pass@k is 1 where n - c < k; the Codex paper's stable product form elsewhere
    for n, c, k in [(1000, 3, 1), (1000, 3, 10), (512, 500, 16), (64, 0, 8), (300, 1, 299)]:
        got = ts.pass_at_k(n, c, k)
        if k == 1:
            assert got == Fraction(c, n)
        product = 1.0 if n - c >= k else 0.0
        if n - c >= k:
            for i in range(n - c + 1, n + 1):
                product *= 1.0 - k / i
        assert float(got) == pytest.approx(1.0 - product, rel=1e-12, abs=1e-15)


def _table(rng, rows, tasks=7, batches=4):
    rewards = rng.choice([0.0, 1.0, 0.5, -0.25, 1e-300, 3.0e10, 0.1, 0.7], size=rows)
    rewards = np.where(rng.random(rows) < 0.3, rng.normal(size=rows), rewards)
    return pa.table({
        "batch": rng.integers(0, batches, rows), "task": rng.integers(0, tasks, rows),
        "run": rng.integers(0, 16, rows), "reward": rewards,
    })


def test_summaries_merge_exactly_in_any_split_and_order():
    rng = np.random.default_rng(7)
    table = _table(rng, 3000)
    whole = ts.summarize(table, 0.5)
    for trial in range(5):
        cuts = sorted(rng.choice(np.arange(1, table.num_rows), size=int(rng.integers(1, 30)), replace=False))
        pieces = [table.slice(a, b - a) for a, b in zip([0, *cuts], [*cuts, table.num_rows])]
        parts = [item for p in pieces for item in ts.summarize(p, 0.5).items()]
        random.Random(trial).shuffle(parts)
        # merge as workers would: random accumulators, merged in random order
        accs = [dict() for _ in range(int(rng.integers(1, 6)))]
        for key, part in parts:
            acc = accs[int(rng.integers(len(accs)))]
            acc[key] = acc[key].merge(part) if key in acc else part
        merged = {}
        for acc in accs[::-1]:
            for key, part in acc.items():
                merged[key] = merged[key].merge(part) if key in merged else part
        assert merged == whole


def test_rows_match_polars_and_exact_rationals():
    rng = np.random.default_rng(11)
    table = _table(rng, 2000)
    groups = ts.summarize(table, 0.5)
    df = pl.from_arrow(table)
    expected = df.group_by("task").agg(
        rows=pl.len(), mean=pl.col("reward").mean(), std=pl.col("reward").std(),
        passes=(pl.col("reward") >= 0.5).sum(), batches=pl.col("batch").n_unique(),
        first=pl.col("batch").min(), last=pl.col("batch").max(),
        runs=pl.struct("batch", "run").n_unique(),
    ).sort("task")
    for e in expected.iter_rows(named=True):
        by_batch = {b: g for (t, b), g in groups.items() if t == e["task"]}
        row = ts.task_row(e["task"], by_batch, (1, 4))
        assert (row["rows"], row["passes"], row["batches"], row["first_batch"], row["last_batch"], row["runs"]) == (
            e["rows"], e["passes"], e["batches"], e["first"], e["last"], e["runs"])
        rewards = [Fraction(x) for x in df.filter(pl.col("task") == e["task"])["reward"].to_list()]
        exact_mean = sum(rewards, Fraction(0)) / len(rewards)
        assert row["reward_mean"] == float(exact_mean)  # rounded once from the exact mean
        assert row["reward_mean"] == pytest.approx(e["mean"], rel=1e-12, abs=1e-12)
        exact_var = sum(((x - exact_mean) ** 2 for x in rewards), Fraction(0)) / (len(rewards) - 1)
        assert row["reward_std"] == math.sqrt(float(exact_var))
        assert row["reward_std"] == pytest.approx(e["std"], rel=1e-9)
        assert row["pass_rate"] == e["passes"] / e["rows"]


def test_pass_at_k_of_a_task_is_the_mean_over_its_groups_with_k_rows():
    g = {0: ts.GroupSummary(8, frozenset(range(8)), 2, 0, 0), 1: ts.GroupSummary(3, frozenset(range(3)), 3, 0, 0),
         2: ts.GroupSummary(5, frozenset(range(5)), 0, 0, 0)}
    row = ts.task_row(9, g, (1, 4))
    assert row["pass_at_1"] == float((Fraction(2, 8) + 1 + 0) / 3)
    assert row["pass_at_4"] == float((1 - Fraction(math.comb(6, 4), math.comb(8, 4)) + 0) / 2)
    assert row["pass_at_4_groups"] == 2


def test_one_row_has_no_std():
    g = ts.summarize(pa.table({"batch": [0], "task": [1], "run": [0], "reward": [0.25]}), 1.0)
    assert ts.task_row(1, {0: g[(1, 0)]}, (1,))["reward_std"] is None


def _trinity_estimator():
    """trinity/buffer/selector/difficulty_estimator.py of the installed trinity-rft 0.6.0, run
    from its file (its package imports ray), with its logger stubbed."""
    import importlib.util
    import logging
    import os
    import types

    spec = importlib.util.find_spec("trinity")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("needs trinity-rft 0.6.0")
    path = os.path.join(list(spec.submodule_search_locations)[0], "buffer", "selector", "difficulty_estimator.py")
    from refs import _stubs  # stand-in modules for the duration of the import, then the old ones back

    log = types.ModuleType("trinity.utils.log")
    log.get_logger = logging.getLogger
    with _stubs({"trinity": types.ModuleType("trinity"), "trinity.utils": types.ModuleType("trinity.utils"),
                 "trinity.utils.log": log}):
        file_spec = importlib.util.spec_from_file_location("trinity_difficulty_estimator", path)
        module = importlib.util.module_from_spec(file_spec)
        file_spec.loader.exec_module(module)
    return module


def test_beta_posterior_matches_trinitys_estimator():
    estimator_module = _trinity_estimator()
    rng = np.random.default_rng(3)
    rows = []
    for batch in (5, 1, 3, 8):  # batches out of order: the update runs in batch order
        for run in range(16):
            rows.append((batch, 0, run, float(rng.integers(0, 2))))
    table = pa.table(dict(zip(("batch", "task", "run", "reward"), zip(*rows))))
    groups = {b: g for (t, b), g in ts.summarize(table, 1.0).items()}
    row = ts.task_row(0, groups, (1,), lamb=0.2, beta_m=16)
    est = estimator_module.BaseBetaPREstimator(n=1, m=16, lamb=0.2, rho=0.2)
    for batch in sorted(groups):
        p = float(table.filter(pa.compute.equal(table["batch"], batch))["reward"].to_numpy().mean())
        est._update(np.array([p * 16]), np.array([(1 - p) * 16]), np.array([p]))  # Trinity: p_tilde = p for a seen task
    assert row["beta_alpha"] == pytest.approx(float(est.alphas[0]), rel=1e-12)
    assert row["beta_beta"] == pytest.approx(float(est.betas[0]), rel=1e-12)
    assert row["beta_mean"] == pytest.approx(float(est.predict_pr(indices=[0])[0]), rel=1e-12)


def test_rows_without_a_usable_reward_are_counted_not_summarised():
    table = pa.table({"batch": [0, 0, None, 0], "task": [1, 1, 1, 1], "run": [0, 1, 2, 3],
                      "reward": [1.0, float("nan"), 1.0, None]})
    kept, skipped = ts.usable_rows(table)
    assert (kept.num_rows, skipped) == (1, 3)
