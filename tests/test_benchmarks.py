"""The benchmark scripts run (tiny sizes), so their README commands cannot rot."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_gpu_kernel_benchmark_runs_and_reports():
    proc = subprocess.run(
        [sys.executable, "benchmarks/gpu_kernel.py", "--groups", "256", "--repeats", "1", "--device", "cpu", "cuda"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    cpu = lines[0]
    assert cpu["device"] == "cpu" and cpu["groups"] == 256 and cpu["rows"] == 2048
    assert cpu["groups_per_s"] > 0 and cpu["broadcast_gbps"] > 0
    assert lines[1]["device"] != "cpu"  # the cuda line: measured, or skipped without a GPU
