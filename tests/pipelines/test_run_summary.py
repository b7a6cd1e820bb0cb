"""The summary a run prints: unambiguous wording (originals + copies, "1 file"), a wall time that
counts start-up; a multi-process run prints only its summary (Beam's worker logs dropped)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from batched import rescore_process as _cli
from conftest import RUNNER

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_plural_and_process_seconds():
    from rescore.pipelines.wording import plural, process_seconds

    assert [plural(1, "file"), plural(2, "file"), plural(1_000, "read unit"), plural(1, "batch", "batches")] == [
        "1 file", "2 files", "1,000 read units", "1 batch"]
    assert plural(0, "batch", "batches") == "0 batches"
    # counts from when this process first imported rescore, and goes on counting
    first = process_seconds()
    time.sleep(0.05)
    assert 0 < first < process_seconds()


@pytest.mark.slow
def test_summary_reads_unambiguously_and_counts_start_up(sample_input, tmp_path):
    out = str(tmp_path / "out")
    # --log-level INFO: the progress line ("planned ... in 1 file") goes to a non-terminal stderr only then
    p = _cli("--input", sample_input, "--output", out, RUNNER, "--strategy", "reward_variance,grpo,duplicate_informative",
             "--log-level", "INFO")
    assert p.returncode == 0, p.stderr
    import json

    t = json.load(open(os.path.join(out, "metrics.json")))["totals"]
    assert t["rows_duplicated"] > 0
    lines = p.stderr.splitlines()
    written = next(line for line in lines if line.lstrip().startswith("rows written"))
    assert written.endswith(f"({t['rows_written_original']:,} originals + {t['rows_duplicated']:,} copies)")
    assert t["rows_written"] == t["rows_written_original"] + t["rows_duplicated"]
    filtered = next(line for line in lines if line.lstrip().startswith("rows filtered"))
    assert "not written" in filtered
    # "1 file", never "1 files"; the run started before Beam was imported: the wall time counts it
    assert "in 1 file " in p.stderr and "1 files" not in p.stderr and "1 read units" not in p.stderr
    wall = float(next(line for line in lines if "wall time" in line).split()[2].rstrip("s"))
    assert wall >= 1.0  # importing Beam and torch alone takes longer than that


@pytest.mark.slow
def test_a_multi_process_run_prints_only_its_summary(sample, tmp_path):
    """The README's --direct_num_workers=2 example: Beam's worker logs (relayed to the driver, or
    written to the stderr the workers inherit) are not shown at the default log level."""
    out = str(tmp_path / "mp")
    env = {**os.environ, "RESCORE_PROGRESS_SECONDS": "1000"}
    p = subprocess.run([sys.executable, "-m", "rescore", "--input", sample, "--output", out, "--strategy", "grpo",
                        "--direct_num_workers=2", "--direct_running_mode=multi_processing"],
                       cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=400)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.rstrip("\n").splitlines()
    assert lines[0] == f"rescore: grpo done -> {out}", p.stderr
    assert len(lines) == 9 and all(line.startswith("  ") for line in lines[1:]), p.stderr


def test_worker_log_lines_are_dropped_from_what_other_processes_wrote():
    from rescore.pipelines.cli import _without_worker_logs

    spilled = (b"INFO:apache_beam.runners.worker.sdk_worker_main:Python sdk harness starting\n"
               b"I0000 00:00:1700000000.000000 12 fork_posix.cc:77] Other threads are currently calling into gRPC\n"
               b"WARNING:root:No semi_persistent_directory found\n"
               b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\nValueError: y\n"
               b"a line of the user's own verifier\n")
    assert _without_worker_logs(spilled) == b"a line of the user's own verifier\n"
