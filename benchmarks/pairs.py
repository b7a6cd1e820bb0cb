"""Two commands timed in turn, whole processes, and compared pair by pair.

    python benchmarks/pairs.py -n 5 --warmup 1 \\
        --a ".venv/bin/python -m rescore --strategy grpo --overwrite --quiet --input grpo-204800.parquet --output o" \\
        --b ".venv/bin/python benchmarks/polars_script.py grpo-204800.parquet p.parquet"

A and B run one after the other (A B A B ...), each `--warmup` times first (not counted), then
`-n` times each. Each run is timed from outside: wall seconds around the child, and the kernel's
own accounting of the finished child (`os.wait4`: user and system seconds, peak resident set),
the figures `/usr/bin/time -v` prints. Prints min, median and max of each figure for A and B,
then A/B of each pair, median (min-max): pairing keeps the ratio meaningful while the machine's
speed drifts. Quote medians. The commands are split as a shell splits words but not run by one
(write `sh -c '...'` for a pipe or a redirection); their output is thrown away. Exit 1 where a
run exits non-zero (its figures are printed all the same, flagged).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time

FIGURES = ("wall s", "user s", "sys s", "cpu s", "peak MiB")


def run_once(argv: list[str]) -> tuple[dict[str, float], int]:
    """(the figures of one run of `argv`, its exit status)."""
    started = time.monotonic()
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.monotonic() - started
    child.returncode = os.waitstatus_to_exitcode(status)  # (reaped here: Popen must not wait again)
    figures = {
        "wall s": wall, "user s": usage.ru_utime, "sys s": usage.ru_stime, "cpu s": usage.ru_utime + usage.ru_stime,
        "peak MiB": usage.ru_maxrss / 1024,  # KiB on Linux
    }
    return figures, child.returncode


def _spread(values: list[float]) -> str:
    return f"{min(values):10.3f} {statistics.median(values):10.3f} {max(values):10.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--a", required=True, help="command A (the one measured)")
    p.add_argument("--b", required=True, help="command B (the baseline or the yardstick)")
    p.add_argument("-n", type=int, default=5, help="counted runs of each (default 5)")
    p.add_argument("--warmup", type=int, default=1, help="uncounted runs of each first (default 1)")
    args = p.parse_args(argv)
    if args.n < 1 or args.warmup < 0:
        p.error("-n must be >= 1 and --warmup >= 0")
    a, b = shlex.split(args.a), shlex.split(args.b)
    for _ in range(args.warmup):
        run_once(a)
        run_once(b)
    runs: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    failed = 0
    for _ in range(args.n):
        for name, command in (("A", a), ("B", b)):
            figures, code = run_once(command)
            runs[name].append(figures)
            failed += code != 0
            if code != 0:
                print(f"{name} exited {code}", file=sys.stderr)
    print(f"{'':14s} {'min':>10s} {'median':>10s} {'max':>10s}   n: A {args.n}, B {args.n}; whole process")
    for name in ("A", "B"):
        for figure in FIGURES:
            print(f"{name} {figure:12s} {_spread([r[figure] for r in runs[name]])}")
    for figure in ("user s", "cpu s", "wall s", "peak MiB"):
        ratios = [ra[figure] / rb[figure] for ra, rb in zip(runs["A"], runs["B"]) if rb[figure] > 0]
        if ratios:
            print(f"A/B {figure:10s} {_spread(ratios)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
