"""The benchmark scripts run (tiny sizes), so their README commands cannot rot."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_generator_regroups_the_same_rows(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import pyarrow.parquet as pq
    from generate import generate

    default = pq.ParquetFile(generate(40_000, str(tmp_path / "a.parquet")))
    one = pq.ParquetFile(generate(40_000, str(tmp_path / "b.parquet"), row_group_rows=1 << 20))
    assert default.num_row_groups == 3 and one.num_row_groups == 1
    assert default.read().equals(one.read())
    long = pq.read_table(generate(100, str(tmp_path / "c.parquet"), response_tokens=(2048, 2050)))
    assert set(pc_lengths(long["action_mask"])) <= {2048, 2049}


def pc_lengths(column) -> list[int]:
    import pyarrow.compute as pc

    return pc.list_value_length(column).to_pylist()


@pytest.mark.slow
def test_timeline_reports_every_step(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from generate import generate

    inp = generate(700, str(tmp_path / "in.parquet"))
    proc = subprocess.run(
        [sys.executable, "benchmarks/timeline.py", "--input", inp, "--output", str(tmp_path / "out"), "--strategy", "grpo",
         "--quiet", "--runner=FnApiRunner"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )
    labels = [line[:24].strip() for line in proc.stdout.splitlines()]
    for label in ("imports", "read+validate unit", "parquet read", "score bucket", "read back+write unit", "parquet write",
                  "finalize", "total (before exit)", "peak RSS"):
        assert label in labels, proc.stdout
    peak = next(line for line in proc.stdout.splitlines() if line.startswith("peak RSS"))
    assert int(peak.split()[2]) > 100, peak  # MB resident at the peak: at least Beam and torch
    assert (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.slow
def test_run_command_end_to_end_on_tiny_data(tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/run.py", "--sizes", "1500", "3000", "--repeats", "1", "--data", str(tmp_path),
         "--json", str(tmp_path / "r.json")],
        cwd=ROOT, capture_output=True, text=True, timeout=600, check=True,
    )
    result = json.loads((tmp_path / "r.json").read_text())
    assert set(result["sizes"]) == {"1500", "3000"} and result["fixed_cost_s"] > 0
    assert result["sizes"]["3000"]["check"].startswith("agree: 3,000 scores")
    # Peak RSS is the child's own: the driver reads the outputs to compare them in a child process.
    assert 0 < result["sizes"]["3000"]["io_floor"]["peak_rss_mb"] < 1500
    assert "targets:" in proc.stdout and "time per row within 1.5x across sizes" in proc.stdout
    # The peers a user would write instead produce the same scores, and the ratio to the fastest is reported.
    for peer in ("polars", "duckdb"):
        assert f"  {peer}: agree: 3,000 scores" in proc.stdout, proc.stdout
        assert result["sizes"]["3000"][peer]["median_s"] > 0
    assert result["sizes"]["3000"]["fastest_peer"] in ("polars", "duckdb")
    assert result["sizes"]["3000"]["rescore_over_fastest_peer"] > 0
    assert result["startup"]["rescore --help"]["median_s"] > 0


@pytest.mark.slow
def test_benchmark_script_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "benchmarks/expand_copies.py", "--batches", "1", "50", "--rows", "400", "--repeats", "1", "--other-batches", "7"],
        cwd=ROOT, capture_output=True, text=True, timeout=300, check=True,
    )
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [x["batches"] for x in lines] == [1, 50]
    assert all(x["rows_out"] > x["rows"] and x["loop_s"] > 0 and x["vectorised_s"] > 0 for x in lines)


def test_pairs_times_both_commands_and_compares_them_pair_by_pair():
    """benchmarks/pairs.py: the kernel's figures of each finished child (a 200 MiB bytearray
    shows in A's peak, not in B's), and A/B taken run by run."""
    a = f"{sys.executable} -c 'b = bytearray(200 << 20)'"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "pairs.py"), "-n", "2", "--warmup", "0",
                           "--a", a, "--b", f"{sys.executable} -c pass"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {" ".join(line.split()[:-3]): [float(x) for x in line.split()[-3:]] for line in proc.stdout.splitlines()[1:]}
    assert rows["A peak MiB"][0] > 200 > rows["B peak MiB"][2]
    assert rows["A/B peak MiB"][1] > 2 and rows["A wall s"][0] > 0
    failing = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "pairs.py"), "-n", "1", "--warmup", "0",
                              "--a", f"{sys.executable} -c 'raise SystemExit(3)'", "--b", f"{sys.executable} -c pass"],
                             capture_output=True, text=True, timeout=120)
    assert failing.returncode == 1 and "A exited 3" in failing.stderr
