"""End-to-end benchmark: Rescore against a hand-written script and the I/O floor.

    python benchmarks/run.py                       # 204,800 rows, GRPO, 3 repeats
    python benchmarks/run.py --sizes 20480 204800 1024000 --repeats 3

For each size it generates deterministic experience (benchmarks/generate.py; cached under
--data), then times whole processes on the same input, interleaved, --repeats times each:
  (a) rescore on the default local runner;
  (b) the hand-written pyarrow+numpy+polars script (benchmarks/baseline.py);
  (c) the I/O floor: read and write back with one added list column (benchmarks/io_floor.py);
  (d) the peers a user would write instead: the lazy polars script (benchmarks/polars_script.py,
      scan_parquet -> window mean/std -> list arithmetic -> sink_parquet) and DuckDB SQL
      (benchmarks/duckdb_script.py; skipped when duckdb is not installed).
It checks that (a) agrees with (b) and with every peer (every score, and the advantages of
sampled rows), reports the median wall time, rows/s and peak RSS of each, the ratios a/b, a/c
and Rescore / fastest peer, and prints PASS/FAIL against the targets: Rescore / fastest peer
<= 1.0 at 1,024,000 rows (and peak RSS <= the polars script's), <= 1.3 at 204,800, <= 1.5 at
20,480; a/b <= 2.0, RSS(a) <= 2 x RSS(b), time per row within 1.5x across sizes, multi-process
mode not slower than in-process. `rescore --help` is timed too (start-up alone). --multi-step repeats it for step_wise_grpo and
duplicate_informative on multi-step data ((b) has no duplication: (a) and (c) only).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import importlib.util

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))



def timed(cmd: list[str]) -> tuple[float, int]:
    """(wall seconds, peak RSS in MB) of one process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err[-2000:]}")
    return wall, usage.ru_maxrss // 1024


def rescore_cmd(inp: str, out: str, strategy: str, extra=()) -> list[str]:
    return [sys.executable, "-m", "rescore", "--input", inp, "--output", out, "--strategy", strategy,
            "--overwrite", "--quiet", *extra]


# Rescore / fastest peer at each size the issue names (rows: the largest allowed ratio).
PEER_TARGETS = {1_024_000: 1.0, 204_800: 1.3, 20_480: 1.5}


def peer_commands(inp: str, out: str) -> dict[str, list[str]]:
    """The scripts a user would write instead, each writing one Parquet file `out`-NAME."""
    peers = {"polars": [sys.executable, str(HERE / "polars_script.py"), inp, f"{out}-polars.parquet"]}
    if importlib.util.find_spec("duckdb") is not None:
        peers["duckdb"] = [sys.executable, str(HERE / "duckdb_script.py"), inp, f"{out}-duckdb.parquet"]
    return peers


def compare(rescore_out: str, baseline_out: str) -> str:
    keys = [(k, "ascending") for k in ("batch", "task", "run", "step")]
    a = pq.ParquetDataset(sorted(str(p) for p in Path(rescore_out).glob("scored-*.parquet"))).read(
        columns=["batch", "task", "run", "step", "score", "advantages"]).sort_by(keys)
    b = pq.read_table(baseline_out, columns=["batch", "task", "run", "step", "score", "advantages"]).sort_by(keys)
    assert a.num_rows == b.num_rows, (a.num_rows, b.num_rows)
    for k in ("batch", "task", "run", "step"):
        assert a[k].equals(b[k]), k
    sa, sb = a["score"].to_numpy(), b["score"].to_numpy()
    worst = float(np.max(np.abs(sa - sb) / np.maximum(1.0, np.abs(sb))))
    assert worst < 1e-5, f"scores differ by {worst}"
    rows = np.linspace(0, a.num_rows - 1, 200).astype(int)
    for r in rows.tolist():
        x = np.asarray(a["advantages"][r].as_py(), np.float32)
        y = np.asarray(b["advantages"][r].as_py(), np.float32)
        assert np.allclose(x, y, rtol=1e-5, atol=1e-6), r
    return f"agree: {a.num_rows:,} scores (max rel diff {worst:.1e}), advantages of 200 sampled rows"


def in_child(call: str) -> str:
    """Run `call` (Python, in this directory's modules) in a fresh process; its last stdout line.

    Reading the outputs to compare them (or generating input) takes gigabytes; done in this
    process, they would count toward every later child's peak RSS, since Linux carries the
    parent's high-water mark over fork and exec into ru_maxrss."""
    code = f"import sys; sys.path.insert(0, {str(HERE)!r}); import run, generate; print({call})"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return proc.stdout.strip().splitlines()[-1]


def bench(name: str, commands: dict[str, list[str]], repeats: int) -> dict[str, dict]:
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in commands}
    for _ in range(repeats):  # interleaved, so drift hits every program alike
        for key, cmd in commands.items():
            runs[key].append(timed(cmd))
    out = {}
    for key, values in runs.items():
        walls = [w for w, _ in values]
        out[key] = {"median_s": round(statistics.median(walls), 2), "runs_s": [round(w, 2) for w in walls],
                    "peak_rss_mb": max(r for _, r in values)}
    print(f"  {name}: " + ", ".join(f"{k} {v['median_s']} s / {v['peak_rss_mb']} MB" for k, v in out.items()), flush=True)
    return out


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[204_800])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--data", default=str(ROOT / "benchmarks" / "data"))
    ap.add_argument("--multi-step", action="store_true", help="also step_wise_grpo and duplicate_informative")
    ap.add_argument("--multi-process", action="store_true", help="also the 2-worker multi-process mode (largest size)")
    ap.add_argument("--row-group-rows", type=int, default=16_384,
                    help="rows per row group of the generated input (default 16384; 1048576: pyarrow's default, one row group)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args(argv)

    results = {"sizes": {}, "targets": {}}
    work = Path(args.data) / "runs"
    work.mkdir(parents=True, exist_ok=True)
    tiny = Path(args.data) / "grpo-512.parquet"
    if not tiny.exists():
        in_child(f"generate.generate(512, {str(tiny)!r})")
    fixed = statistics.median(timed(rescore_cmd(str(tiny), str(work / "tiny"), "grpo"))[0] for _ in range(args.repeats))
    results["fixed_cost_s"] = round(fixed, 2)
    print(f"fixed cost (512 rows: imports, pipeline start-up): {fixed:.2f} s", flush=True)
    helps = bench("start-up", {"rescore --help": [sys.executable, "-m", "rescore", "--help"],
                               "import apache_beam": [sys.executable, "-c", "import apache_beam"]}, args.repeats)
    results["startup"] = helps
    layout = "" if args.row_group_rows == 16_384 else f"-rg{args.row_group_rows}"
    for rows in args.sizes:
        inp = Path(args.data) / f"grpo-{rows}{layout}.parquet"
        if not inp.exists():
            print(f"generating {inp}", flush=True)
            in_child(f"generate.generate({rows}, {str(inp)!r}, row_group_rows={args.row_group_rows})")
        a, b, c = str(work / f"a-{rows}"), str(work / f"b-{rows}.parquet"), str(work / f"c-{rows}.parquet")
        work.mkdir(parents=True, exist_ok=True)
        print(f"{rows:,} rows, GRPO", flush=True)
        peers = peer_commands(str(inp), str(work / f"d-{rows}"))
        times = bench("grpo", {
            "rescore": rescore_cmd(str(inp), a, "grpo"),
            "script": [sys.executable, str(HERE / "baseline.py"), str(inp), b],
            "io_floor": [sys.executable, str(HERE / "io_floor.py"), str(inp), c],
            **peers,
        }, args.repeats)
        check = in_child(f"run.compare({a!r}, {b!r})")
        print(f"  {check}", flush=True)
        for name, cmd in peers.items():
            print(f"  {name}: " + in_child(f"run.compare({a!r}, {cmd[-1]!r})"), flush=True)
        r, s, f = (times[k]["median_s"] for k in ("rescore", "script", "io_floor"))
        fastest = min(peers, key=lambda k: times[k]["median_s"])
        results["sizes"][rows] = {
            **times, "check": check, "a_over_b": round(r / s, 2), "a_over_c": round(r / f, 2),
            "fastest_peer": fastest, "rescore_over_fastest_peer": round(r / times[fastest]["median_s"], 2),
            "rescore_rows_per_s": round(rows / r), "rescore_us_per_row": round(r / rows * 1e6, 2),
            "rescore_marginal_us_per_row": round((r - fixed) / rows * 1e6, 2),
            "script_us_per_row": round(s / rows * 1e6, 2),
        }
        print(f"  a/b = {r / s:.2f}, a/c = {r / f:.2f}, rescore / {fastest} = {r / times[fastest]['median_s']:.2f}, "
              f"rescore {rows / r:,.0f} rows/s", flush=True)

        if args.multi_step:
            ms = Path(args.data) / f"multistep-{rows}{layout}.parquet"
            if not ms.exists():
                print(f"generating {ms}", flush=True)
                in_child(f"generate.generate({rows}, {str(ms)!r}, multi_step=True, row_group_rows={args.row_group_rows})")
            print(f"{rows:,} rows, multi-step", flush=True)
            sw = bench("step_wise_grpo", {
                "rescore": rescore_cmd(str(ms), a + "-sw", "step_wise_grpo"),
                "script": [sys.executable, str(HERE / "baseline.py"), str(ms), b + "-sw", "--strategy", "step_wise_grpo"],
                "io_floor": [sys.executable, str(HERE / "io_floor.py"), str(ms), c + "-sw"],
            }, args.repeats)
            sw_check = in_child(f"run.compare({a + '-sw'!r}, {b + '-sw'!r})")
            dup = bench("duplicate_informative", {
                "rescore": rescore_cmd(str(ms), a + "-dup", "grpo,duplicate_informative"),
            }, args.repeats)
            results["sizes"][rows]["step_wise_grpo"] = {**sw, "check": sw_check,
                                                       "a_over_b": round(sw["rescore"]["median_s"] / sw["script"]["median_s"], 2)}
            results["sizes"][rows]["grpo,duplicate_informative"] = {
                **dup, "a_over_c": round(dup["rescore"]["median_s"] / sw["io_floor"]["median_s"], 2)}

    largest = max(args.sizes)
    if args.multi_process:
        inp = str(Path(args.data) / f"grpo-{largest}{layout}.parquet")
        mp = bench("modes", {
            "in_process": rescore_cmd(inp, str(work / "mode-in"), "grpo"),
            "multi_process": rescore_cmd(inp, str(work / "mode-mp"), "grpo",
                                         ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]),
        }, args.repeats)
        results["modes"] = mp

    t = results["targets"]
    detail: dict[str, str] = {}
    for rows, limit in PEER_TARGETS.items():
        if rows in results["sizes"]:
            v = results["sizes"][rows]
            key = f"{rows:,} rows: rescore / fastest peer <= {limit}"
            t[key] = verdict(v["rescore_over_fastest_peer"] <= limit)
            detail[key] = f"{v['rescore_over_fastest_peer']:.2f} against {v['fastest_peer']}"
    if 1_024_000 in results["sizes"]:
        v = results["sizes"][1_024_000]
        t["1,024,000 rows: peak RSS <= the polars script's"] = verdict(v["rescore"]["peak_rss_mb"] <= v["polars"]["peak_rss_mb"])
        detail["1,024,000 rows: peak RSS <= the polars script's"] = f"{v['rescore']['peak_rss_mb']} vs {v['polars']['peak_rss_mb']} MB"
    main_size = results["sizes"][200_000] if 200_000 in results["sizes"] else results["sizes"][largest]
    t["a/b <= 2.0"] = verdict(main_size["a_over_b"] <= 2.0)
    detail["a/b <= 2.0"] = f"{main_size['a_over_b']:.2f}"
    t["RSS(a) <= 2 x RSS(b)"] = verdict(main_size["rescore"]["peak_rss_mb"] <= 2 * main_size["script"]["peak_rss_mb"])
    detail["RSS(a) <= 2 x RSS(b)"] = f"{main_size['rescore']['peak_rss_mb']} vs {main_size['script']['peak_rss_mb']} MB"
    if len(args.sizes) > 1:
        per_row = [v["rescore_us_per_row"] for v in results["sizes"].values()]
        script = [v["script_us_per_row"] for v in results["sizes"].values()]
        t["time per row within 1.5x across sizes"] = verdict(max(per_row) <= 1.5 * min(per_row))
        detail["time per row within 1.5x across sizes"] = (
            f"{max(per_row) / min(per_row):.2f}x; the script's own {max(script) / min(script):.2f}x"
        )
        marginal = [v["rescore_marginal_us_per_row"] for v in results["sizes"].values()]
        t["time per row after the fixed cost within 1.5x across sizes"] = verdict(max(marginal) <= 1.5 * min(marginal))
        detail["time per row after the fixed cost within 1.5x across sizes"] = f"{max(marginal) / min(marginal):.2f}x"
    if "modes" in results:
        m = results["modes"]
        t["multi-process not slower than in-process"] = verdict(m["multi_process"]["median_s"] <= m["in_process"]["median_s"])
        detail["multi-process not slower than in-process"] = f"{m['multi_process']['median_s']} vs {m['in_process']['median_s']} s"
    results["target_details"] = detail
    print("targets:", flush=True)
    for k, v in t.items():
        print(f"  {v}  {k} ({detail[k]})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
