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


def test_end_to_end_benchmark_scripts_agree_on_tiny_data(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from generate import generate
    from run import compare, rescore_cmd, timed

    for multi_step, strategy in ((False, "grpo"), (True, "step_wise_grpo")):
        inp = generate(700, str(tmp_path / f"in-{strategy}.parquet"), multi_step=multi_step)
        wall, rss = timed(rescore_cmd(inp, str(tmp_path / f"a-{strategy}"), strategy))
        assert wall > 0 and rss > 50
        timed([sys.executable, "benchmarks/baseline.py", inp, str(tmp_path / f"b-{strategy}.parquet"), "--strategy", strategy])
        assert compare(str(tmp_path / f"a-{strategy}"), str(tmp_path / f"b-{strategy}.parquet")).startswith("agree: 700 scores")
    timed([sys.executable, "benchmarks/io_floor.py", inp, str(tmp_path / "c.parquet")])
    import pyarrow.parquet as pq

    assert "advantages" in pq.read_schema(str(tmp_path / "c.parquet")).names


def test_generator_regroups_the_same_rows(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import pyarrow.parquet as pq
    from generate import generate

    default = pq.ParquetFile(generate(40_000, str(tmp_path / "a.parquet")))
    one = pq.ParquetFile(generate(40_000, str(tmp_path / "b.parquet"), row_group_rows=1 << 20))
    assert default.num_row_groups == 3 and one.num_row_groups == 1
    assert default.read().equals(one.read())
