"""Rescore on a real Flink cluster (one JobManager, two TaskManagers, 2 slots each) through
Beam's FlinkRunner and job server: the same bytes as in-process, work on both TaskManagers,
and a TaskManager killed with kill -9 mid-run ends in a correct output or no `_SUCCESS`.

The cluster comes from `run_configs/flink_local.py` (Flink's jars from PyPI, Beam's Flink job
server from Maven Central, cached in `~/.cache/rescore/flink`), started once for the session.
Without Java or Maven (or where the jars cannot be fetched) every test here skips, saying why;
RESCORE_CLUSTER_TESTS=0 turns them off.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest
from data import SCHEMA_MULTI_STEP, multi_step_rows, write_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
pytestmark = pytest.mark.slow  # under pytest-xdist, `--dist loadfile` runs them in one process: one cluster

_spec = importlib.util.spec_from_file_location("flink_local", os.path.join(ROOT, "run_configs", "flink_local.py"))
flink_local = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flink_local)

CHAIN = ["--strategy", "reward_variance,grpo,duplicate_informative", "--set", "std_cal_level=batch"]
CASES = {
    "grpo": ["--strategy", "grpo"],
    "filter-duplicate-chain": CHAIN,
    "multi-step-grpo": ["--algorithm", "multi_step_grpo"],
}


@pytest.fixture(scope="session")
def flink(tmp_path_factory):
    """One local Flink cluster for the session; torn down (every JVM and SDK worker) at the end."""
    if os.environ.get("RESCORE_CLUSTER_TESTS") == "0":
        pytest.skip("RESCORE_CLUSTER_TESTS=0: the Flink and Prism cluster tests are turned off")
    why = flink_local.missing_tools()
    if why:
        pytest.skip(why)
    try:
        flink_local.fetch()  # waits for a fetch in progress (.ci/run starts one in the background)
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"could not fetch Flink's jars or Beam's Flink job server: {e}")
    cluster = flink_local.start(tmp_path_factory.mktemp("flink"), taskmanagers=2, slots=2)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def experience(tmp_path_factory):
    d = tmp_path_factory.mktemp("flink_in")
    return write_parquet(multi_step_rows(31), str(d / "in"), files=3, row_group_size=8, schema=SCHEMA_MULTI_STEP)


def _files(out):
    return {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))
            if n.endswith(".parquet")}


def _in_process(experience, out, args):
    from rescore.pipelines.cli import run

    run(["--input", experience, "--output", out, *args])
    return _files(out)


def _own_cpu_seconds():
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _flink_jobs(cluster, since_ms):
    jobs = cluster.get("/jobs/overview")["jobs"]
    return sorted((j for j in jobs if j["start-time"] >= since_ms), key=lambda j: j["start-time"])


def _work_per_taskmanager(cluster, jid):
    """records read by each TaskManager over every vertex of the job (Flink's REST API)."""
    per_tm = {}
    for v in cluster.get(f"/jobs/{jid}")["vertices"]:
        for tm in cluster.get(f"/jobs/{jid}/vertices/{v['id']}/taskmanagers")["taskmanagers"]:
            key = tm.get("taskmanager-id") or tm["host"]
            per_tm[key] = per_tm.get(key, 0) + tm["metrics"]["read-records"] + tm["metrics"]["write-records"]
    return per_tm


@pytest.mark.parametrize("case", sorted(CASES))
def test_flink_output_is_byte_identical_to_in_process(flink, experience, tmp_path, case):
    from rescore.pipelines.cli import run

    args = CASES[case]
    expected = _in_process(experience, str(tmp_path / "local"), args)
    since = int(time.time() * 1000)
    cpu = flink.cpu_seconds() + _own_cpu_seconds()
    out = str(tmp_path / "flink")
    doc = run(["--config", os.path.join(ROOT, "run_configs", "flink.yaml"), "--input", experience,
               "--output", out, *args, *flink.beam_args(parallelism=4)])
    print(f"Flink run: {time.time() - since / 1000:.0f} s wall, "  # shown by -rP (docs/runners.md's figures)
          f"{flink.cpu_seconds() + _own_cpu_seconds() - cpu:.0f} CPU-s (cluster, SDK workers, job server, launcher)")
    assert doc["totals"]["rows_read"] == sum(1 for _ in multi_step_rows(31))
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    got = _files(out)
    assert sorted(got) == sorted(expected) and got == expected  # values and row order, per file
    (job,) = _flink_jobs(flink, since)
    assert job["state"] == "FINISHED"
    detail = flink.get(f"/jobs/{job['jid']}")
    assert max(v["parallelism"] for v in detail["vertices"]) == 4
    busy = {tm: n for tm, n in _work_per_taskmanager(flink, job["jid"]).items() if n > 0}
    assert len(busy) == 2, busy  # both TaskManagers moved records


def test_taskmanager_killed_mid_run_leaves_correct_output_or_no_success(flink, experience, tmp_path):
    expected = _in_process(experience, str(tmp_path / "local"), CHAIN)
    out = str(tmp_path / "flink")
    since = int(time.time() * 1000)
    cmd = [os.path.join(os.path.dirname(sys.executable), "rescore"), "--config",
           os.path.join(ROOT, "run_configs", "flink.yaml"), "--input", experience, "--output", out,
           *CHAIN, *flink.beam_args(parallelism=4)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    victim = flink.pids("taskmanager")[-1]
    killed = False
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            jobs = _flink_jobs(flink, since)
            if jobs:  # kill once the job has finished its first tasks: mid-run, work on both TMs
                v = flink.get(f"/jobs/{jobs[0]['jid']}")["vertices"]
                if any(x["status"] == "FINISHED" for x in v):
                    os.kill(victim, 9)
                    killed = True
                    break
            time.sleep(0.5)
        output, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in flink.state["processes"]:  # still stopped (its process group) at teardown
            if p["pid"] == victim:
                p["role"] = "killed"
        flink.start_taskmanager()
        flink.wait_for_taskmanagers(2)
    assert killed, "the run ended before a TaskManager could be killed:\n" + output
    success = os.path.exists(os.path.join(out, "_SUCCESS"))
    print(f"TaskManager {victim} killed; rescore exit {proc.returncode}, _SUCCESS {success}")  # shown by -rP
    if proc.returncode == 0:
        assert success and _files(out) == expected, output
    else:
        assert not success, output
        assert "rescore: error:" in output
