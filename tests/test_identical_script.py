"""benchmarks/identical.py keeps working: a one-case matrix, and a difference is reported."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _git_checkout() -> str | None:
    """Why the script cannot run here, or None."""
    if shutil.which("git") is None:
        return "git is not installed"
    proc = subprocess.run(["git", "rev-parse", "--verify", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return None if proc.returncode == 0 else "not a git checkout with a commit"


@pytest.mark.slow
def test_identical_script_compares_head_with_the_working_tree():
    reason = _git_checkout()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run(
        [sys.executable, "benchmarks/identical.py", "--before", "HEAD", "--cases", "grpo,unknown_strategy", "--jobs", "1",
         "--keep"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {line.split()[0]: line.split()[1:] for line in proc.stdout.splitlines()[2:-1]}
    assert rows["grpo"][1] == "identical" and int(rows["grpo"][0]) >= 6  # scored parts, rejected, metrics, markers
    assert rows["unknown_strategy"][1:] == ["identical", "(exit", "2", "on", "both", "sides)"]
    summary, _, kept = proc.stdout.splitlines()[-1].partition("; outputs kept in ")
    shutil.rmtree(kept)
    assert summary == "2 identical, 0 differ" and "rescore-identical-" in kept
    listed = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert kept not in listed  # its worktree is removed, --keep or not


@pytest.mark.slow
def test_identical_compare_finds_the_first_differing_file(tmp_path):
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from identical import compare

    for side in ("before", "after"):
        (tmp_path / side / "c").mkdir(parents=True)
        (tmp_path / side / "c" / "metrics.json").write_text('{"totals": {"rows_read": 3, "x": 1}, "batches": [{"x": 1}]}')
        (tmp_path / side / "c" / "scored-0.parquet").write_bytes(b"PAR1 same")
    ok = {"exit": 0, "stderr": ""}
    assert compare("c", str(tmp_path / "before"), str(tmp_path / "after"), ok, ok, []) == (2, "")
    (tmp_path / "after" / "c" / "scored-0.parquet").write_bytes(b"PAR1 diff")
    assert compare("c", str(tmp_path / "before"), str(tmp_path / "after"), ok, ok, []) == (2, "scored-0.parquet")
    (tmp_path / "after" / "c" / "scored-0.parquet").write_bytes(b"PAR1 same")
    (tmp_path / "after" / "c" / "metrics.json").write_text('{"totals": {"rows_read": 3, "x": 2}, "batches": [{"x": 2}]}')
    assert compare("c", str(tmp_path / "before"), str(tmp_path / "after"), ok, ok, [])[1] == "metrics.json"
    assert compare("c", str(tmp_path / "before"), str(tmp_path / "after"), ok, ok, ["totals.x"]) == (2, "")
    (tmp_path / "after" / "c" / "extra.parquet").write_bytes(b"")
    assert compare("c", str(tmp_path / "before"), str(tmp_path / "after"), ok, ok, [])[1] == "file sets differ: extra.parquet"
    failed = {"exit": 2, "stderr": "rescore: error: unknown strategy\n"}
    assert compare("c", str(tmp_path / "before"), str(tmp_path / "after"), ok, failed, [])[1].startswith("exit 0 vs 2")
