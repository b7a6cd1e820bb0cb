"""Micro benchmark of expand_copies (transforms/rows/copies.py): the POLARIS copies of one read unit.

    .venv/bin/python benchmarks/expand_copies.py --batches 1 100 10000 100000 --rows 200000
    .venv/bin/python benchmarks/expand_copies.py --batches 16384 --rows 16384 --other-batches 100000

For each batch count, builds the kept rows of one read unit (`--rows` rows spread evenly over
the batches, groups of `--runs` rows, a copy plan for every batch asking for 1-3 copies of
half of its groups) and times the vectorised expand_copies against the per-batch loop it
replaced (kept in tests/rows/test_expand_copies.py, which also checks the two are byte-identical).
`--other-batches N` adds plans for N batches the unit does not hold (a run with many more
batches than one read unit sees). Prints one JSON line per batch count: median seconds of each
over --repeats, and their ratio.
The machine may be shared: compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import pyarrow as pa

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "rows")]

from test_expand_copies import old_expand_copies  # noqa: E402

from rescore.transforms.rows.copies import expand_copies  # noqa: E402


def unit(rows: int, batches: int, runs: int, string_tasks: bool, other_batches: int = 0) -> tuple[pa.Table, dict]:
    rng = np.random.default_rng(0)
    per_batch = max(runs, rows // batches // runs * runs)
    groups = per_batch // runs
    batch = np.repeat(np.arange(batches, dtype=np.int64) * 2 + 1, per_batch)
    task_id = np.tile(np.repeat(np.arange(groups, dtype=np.int64) * 3, runs), batches)
    task = pa.array([f"q{t}" for t in task_id.tolist()]) if string_tasks else pa.array(task_id)
    order = rng.permutation(len(batch))  # rows of a unit arrive in file order, not grouped
    table = pa.table({"batch": batch, "task": task, "run": np.tile(np.arange(runs), batches * groups), "x": rng.random(len(batch))})
    table = table.take(pa.array(order))
    chosen = np.arange(0, groups, 2, dtype=np.int64) * 3
    plan_task = pa.array([f"q{t}" for t in chosen.tolist()]) if string_tasks else pa.array(chosen)
    plans = {}
    for b in range(batches):
        copies = pa.array(rng.integers(1, 4, len(chosen)), pa.int64())
        plans[b * 2 + 1] = (0 if string_tasks else 3 * groups, pa.table({"task": plan_task, "copies": copies}))
    for b in range(other_batches):
        plans[b * 2 + 2 * batches + 1] = plans[1]
    return table, plans


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 100, 10_000, 100_000])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=2, help="rows per group")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--string-tasks", action="store_true")
    parser.add_argument("--other-batches", type=int, default=0, help="plans for batches the unit does not hold")
    parser.add_argument("--skip-old", action="store_true", help="time only the vectorised version")
    args = parser.parse_args(argv)
    task_type = pa.string() if args.string_tasks else pa.int64()
    for batches in args.batches:
        table, plans = unit(args.rows, batches, args.runs, args.string_tasks, args.other_batches)
        new = timed(lambda: expand_copies(table, plans, task_type), args.repeats)
        line = {"batches": batches, "plans": len(plans), "rows": table.num_rows,
                "rows_out": expand_copies(table, plans, task_type)[0].num_rows, "string_tasks": args.string_tasks,
                "vectorised_s": round(new, 4)}
        if not args.skip_old:
            old = timed(lambda: old_expand_copies(table, plans, task_type), args.repeats)
            line |= {"loop_s": round(old, 4), "loop_over_vectorised": round(old / new, 1)}
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
