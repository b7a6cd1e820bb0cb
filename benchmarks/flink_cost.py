"""What a row costs on Flink and in-process: fixed cost and marginal CPU-seconds per row.

    python benchmarks/flink_cost.py                                 # 100,000, 300,000 and 1,000,000 rows
    python benchmarks/flink_cost.py --sizes 5000 20000 50000        # a loaded or small machine
    python benchmarks/flink_cost.py --sizes 5000 20000 --levers     # and the two levers, below
    python benchmarks/flink_cost.py --sizes 5000 20000 --variants parent-first   # one lever (and in-process)

For each size (benchmarks/generate.py experience, cached under --data) it runs `rescore
--strategy grpo` in-process and on a local Flink cluster (tools/flink_local.py: 1 JobManager, 2
TaskManagers of 2 slots, --parallelism=4, PROCESS SDK workers forked from one process), one
after the other, in one run, and counts the CPU-seconds of every process the run used:
  - in-process: the `rescore` process and its children (getrusage of the reaped child);
  - Flink: the `rescore` launcher and the job server JVM it starts (its reaped children), plus
    the cluster's JobManager, TaskManagers and SDK workers (utime+stime of each process and of
    the children it reaped, from /proc; the workers are reaped by the fork server, counted once
    the run is over).
Each cluster first runs one job of the smallest size that is not counted (its JVMs load and
compile their classes; --no-warmup counts it). It fits CPU = fixed + marginal x rows (least squares over the sizes) for each mode, and prints
both, their ratio, and the wall times, then the same as JSON on the last line.

--levers also measures, on the same cluster and sizes:
  - long-lived job server: Beam's job server started once beside the cluster and passed with
    --job_endpoint, as a scheduled job would use one (no JVM start per run);
  - worker reuse: a second cluster whose TaskManagers load Beam's classes parent-first from
    their own class path (the job server's Beam jars in Flink's lib/, Beam's instructions for
    reusing SDK workers across stages in a session cluster), so a stage's SDK workers outlive it.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


VARIANTS = ("plain", "job-server", "parent-first")


def _tool():
    spec = importlib.util.spec_from_file_location("flink_local", ROOT / "tools" / "flink_local.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rescore() -> list[str]:
    return [sys.executable, "-m", "rescore"]


def _run(cmd: list[str], env: dict) -> tuple[float, float]:
    """(wall s, CPU s of the process and every child it reaped)."""
    started = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read()
    if proc.returncode != 0:
        raise SystemExit(f"flink_cost: {' '.join(cmd[:6])} ... exited {proc.returncode}:\n{err[-3000:]}")
    return time.monotonic() - started, usage.ru_utime + usage.ru_stime


def _cpu_of(pid: int) -> float:
    """CPU seconds a running process (and the children it reaped) has used (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def _workers_gone(cluster, timeout: float = 120.0) -> None:
    """Wait until the fork server has no worker left (a cached environment, with
    --environment_cache_millis, outlives the job by that long) and has reaped them: their CPU
    counts in the fork server's children's once they are reaped."""
    deadline = time.monotonic() + timeout
    for pid in cluster.pids("sdk_zygote"):
        children = Path(f"/proc/{pid}/task/{pid}/children")
        while time.monotonic() < deadline:
            try:
                if not children.read_text().split():
                    break
            except OSError:  # the fork server is gone
                break
            time.sleep(0.5)
    time.sleep(1.5)  # the fork server reaps its finished supervisors once a second


ROLE_NAMES = {"sdk_zygote": "SDK workers", "jobmanager": "JobManager", "taskmanager": "TaskManagers"}


def _role_cpu(cluster) -> dict[str, float]:
    """CPU seconds so far of the cluster's processes by role: the JobManager, the TaskManagers,
    and the SDK workers (the fork server, with the workers it reaped)."""
    used: dict[str, float] = {}
    for p in cluster.state["processes"]:
        try:
            used[p["role"]] = used.get(p["role"], 0.0) + _cpu_of(p["pid"])
        except OSError:  # a process that is gone (a TaskManager killed)
            pass
    return used


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """(fixed, marginal) of the least-squares line through (rows, cpu)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def _data(rows: int, directory: Path) -> str:
    from generate import generate

    path = directory / f"experience-{rows}.parquet"
    if not path.exists():
        generate(rows, str(path))
    return str(path)


def measure(sizes, data_dir: Path, variants: tuple[str, ...], warmup: bool = True) -> dict:
    tool = _tool()
    tool.fetch()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    base = ["--strategy", "grpo", "--overwrite", "--progress-seconds", "3600", "--quiet"]
    modes: dict[str, list[dict]] = {"in-process": [], **({"flink": []} if "plain" in variants else {})}
    out = Path(tempfile.mkdtemp(prefix="flink-cost-"))
    clusters = [("flink", {})] if {"plain", "job-server"} & set(variants) else []
    failed: dict[str, str] = {}
    if "job-server" in variants:
        modes["flink, long-lived job server"] = []
    if "parent-first" in variants:
        modes["flink, workers reused (parent-first)"] = []
        clusters.append(("flink, workers reused (parent-first)", "parent-first"))
    try:
        for first, (label, variant) in enumerate(clusters):
            workdir = out / label.split(",")[0].replace(" ", "-") / ("pf" if variant else "plain")
            try:
                cluster = tool.start(workdir, taskmanagers=2, slots=2, parent_first=bool(variant))
            except RuntimeError as e:
                failed[label] = f"the cluster did not start: {e}"
                print(f"{label}: {failed[label]}", flush=True)
                continue
            server = None
            try:
                if "job-server" in variants and not variant:
                    server = tool.start_job_server(cluster, workdir)
                if warmup:  # a fresh cluster's first job also loads and JIT-compiles its classes: not counted
                    _run([*_rescore(), "--config", str(ROOT / "run_configs" / "flink.yaml"), "--input",
                          _data(min(sizes), data_dir), "--output", str(out / "warmup"), "--shared-filesystem", *base,
                          *cluster.beam_args(parallelism=4)], env)
                for rows in sizes:
                    inp = _data(rows, data_dir)
                    if first == 0:  # in-process once per size, beside the first cluster's runs
                        wall, cpu = _run([*_rescore(), "--input", inp, "--output", str(out / f"local-{rows}"), *base], env)
                        modes["in-process"].append({"rows": rows, "wall_s": wall, "cpu_s": cpu})
                        print(f"in-process {rows:>9,} rows: {wall:7.1f} s wall, {cpu:7.1f} CPU-s", flush=True)
                    # worker reuse needs the cache to outlive a stage (Beam's default releases at once)
                    runs = [(label, ["--environment_cache_millis=60000"] if variant else [])] if variant or "plain" in variants else []
                    if server is not None:
                        runs.append(("flink, long-lived job server", [f"--job_endpoint={server['endpoint']}"]))
                    for name, extra in runs:
                        if name in failed:
                            continue
                        before = cluster.cpu_seconds() + (_cpu_of(server["process"].pid) if server else 0.0)
                        roles_before = _role_cpu(cluster)
                        try:
                            wall, cpu = _run([*_rescore(), "--config", str(ROOT / "run_configs" / "flink.yaml"),
                                              "--input", inp, "--output", str(out / f"flink-{rows}"),
                                              "--shared-filesystem", *base, *cluster.beam_args(parallelism=4), *extra], env)
                        except SystemExit as e:  # a lever that does not work here: say so, measure the rest
                            failed[name] = str(e).splitlines()[-1][:300]
                            print(f"{name} {rows:>9,} rows: failed: {failed[name]}", flush=True)
                            continue
                        _workers_gone(cluster)  # reaped, so that their CPU counts in this run
                        # the long-lived job server's CPU during the run counts with the cluster's
                        cluster_cpu = cluster.cpu_seconds() + (_cpu_of(server["process"].pid) if server else 0.0) - before
                        roles = {role: round(used - roles_before.get(role, 0.0), 2)
                                 for role, used in _role_cpu(cluster).items()}
                        modes[name].append({"rows": rows, "wall_s": wall, "cpu_s": cpu + cluster_cpu,
                                            "launcher_cpu_s": cpu, "cluster_cpu_s": cluster_cpu,
                                            "cluster_roles_cpu_s": roles})
                        print(f"{name} {rows:>9,} rows: {wall:7.1f} s wall, {cpu + cluster_cpu:7.1f} CPU-s "
                              f"(launcher and job server {cpu:.1f}, cluster {cluster_cpu:.1f}: "
                              + ", ".join(f"{ROLE_NAMES.get(r, r)} {v:.1f}" for r, v in roles.items()) + ")",
                              flush=True)
            finally:
                if server is not None:
                    server["process"].terminate()
                    server["process"].wait(30)
                cluster.stop()
    finally:
        shutil.rmtree(out, ignore_errors=True)
    result = {name: {"failed": why} for name, why in failed.items()}
    for name, points in modes.items():
        if len(points) >= 2:
            fixed, marginal = fit([(p["rows"], p["cpu_s"]) for p in points])
            result[name] = {"fixed_cpu_s": fixed, "cpu_s_per_row": marginal, "points": points}
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "rescore-bench"),
                    help="where the generated inputs are cached")
    ap.add_argument("--levers", action="store_true", help="also a long-lived job server and parent-first worker reuse")
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, help="the Flink variants to run (default plain; --levers: all)")
    ap.add_argument("--no-warmup", dest="warmup", action="store_false",
                    help="count each cluster's first job too (by default one job of the smallest size runs first, not counted)")
    a = ap.parse_args(argv)
    if len(set(a.sizes)) < 2:
        ap.error("--sizes needs at least two different sizes to fit a line")
    why = _tool().missing_tools()
    if why:
        print(f"flink_cost: {why}", file=sys.stderr)
        return 2
    data = Path(a.data)
    data.mkdir(parents=True, exist_ok=True)
    variants = tuple(a.variants or (VARIANTS if a.levers else ("plain",)))
    result = measure(sorted(a.sizes), data, variants, a.warmup)
    inproc = result.get("in-process", {}).get("cpu_s_per_row")
    print(f"\n{'mode':<40} {'fixed CPU-s':>12} {'µs CPU per row':>15} {'vs in-process':>14}")
    for name, r in result.items():
        if "failed" in r:
            print(f"{name:<40} failed: {r['failed']}")
            continue
        ratio = f"{r['cpu_s_per_row'] / inproc:.2f}x" if inproc else "-"
        print(f"{name:<40} {r['fixed_cpu_s']:>12.1f} {r['cpu_s_per_row'] * 1e6:>15.1f} {ratio:>14}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
