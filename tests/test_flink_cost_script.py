"""benchmarks/flink_cost.py's arithmetic and its /proc bookkeeping, without a cluster (the
cluster runs are the benchmark itself: benchmarks/README.md, "Flink against in-process")."""

import importlib.util
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def flink_cost():
    spec = importlib.util.spec_from_file_location("flink_cost", ROOT / "benchmarks" / "flink_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Cluster:
    def __init__(self, processes):
        self.state = {"processes": processes}

    def pids(self, role):
        return [p["pid"] for p in self.state["processes"] if p["role"] == role]


def test_fit_is_the_least_squares_line(flink_cost):
    # run 1's in-process points (benchmarks/README.md): 1.8 CPU-s fixed, 39.2 µs per row
    fixed, marginal = flink_cost.fit([(100_000, 6.124307), (300_000, 13.044031), (1_000_000, 41.103855)])
    assert fixed == pytest.approx(1.8045666, abs=1e-6)
    assert marginal * 1e6 == pytest.approx(39.1846379, abs=1e-6)
    assert flink_cost.fit([(1, 5.0), (3, 11.0)]) == pytest.approx((2.0, 3.0))


def test_cpu_by_role_and_waiting_for_the_workers(flink_cost):
    """A fork server with a worker still running: the wait returns once it is reaped, and the
    role totals count what the process and its reaped children used; a gone process counts 0."""
    server = subprocess.Popen([sys.executable, "-c",
                               "import os, time\n"
                               "pid = os.fork()\n"
                               "if pid == 0:\n"
                               "    end = time.process_time() + 0.3\n"
                               "    while time.process_time() < end: pass\n"
                               "    os._exit(0)\n"
                               "os.waitpid(pid, 0)\n"
                               "time.sleep(30)\n"])
    try:
        cluster = _Cluster([{"role": "sdk_zygote", "pid": server.pid}, {"role": "jobmanager", "pid": 2 ** 22 + 7}])
        time.sleep(0.2)
        started = time.monotonic()
        flink_cost._workers_gone(cluster, timeout=20)
        assert time.monotonic() - started < 15
        used = flink_cost._role_cpu(cluster)
        assert used["sdk_zygote"] >= 0.25  # the worker's 0.3 CPU-s, reaped by the fork server
        assert "jobmanager" not in used
    finally:
        server.kill()
        server.wait()
