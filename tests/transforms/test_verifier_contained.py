"""Issue 40 (11): a verifier that starts processes in their own session (as sandboxes do), even
through an intermediate that exits at once, leaves nothing running after `rescore` returns, and
the caller waiting on rescore's stdout/stderr is not kept waiting, with the worker process
(the default --reward-fn-timeout) and in-process (--reward-fn-timeout 0)."""

import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VERIFIER = '''
import os, subprocess, sys

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def answer(response_tokens, run):
    # each holds the stdout and stderr it inherits: rescore's own
    if run == 0:  # a child in its own session, never waited for
        with open(os.environ["PID_FILE"], "a") as f:
            f.write(f"{subprocess.Popen(SLEEP, start_new_session=True).pid}\\n")
    if run == 1:  # a grandchild in its own session, whose parent exits at once (a daemon)
        code = (f"import os, subprocess; pid = subprocess.Popen({SLEEP!r}, start_new_session=True).pid; "
                "open(os.environ['PID_FILE'], 'a').write(f'{pid}\\\\n')")
        subprocess.run([sys.executable, "-c", code], check=True)
    return float(len(response_tokens) + run)
'''


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie holds nothing: gone
    except OSError:
        return False


@pytest.mark.slow  # two rescore processes side by side: ~15 s on a loaded 2-core machine
def test_nothing_a_verifier_starts_outlives_rescore(tmp_path):
    (tmp_path / "sandboxing_verifier.py").write_text(VERIFIER)
    rows = [{"batch": 0, "task": 0, "run": r, "step": 0, "reward": 0.0, "tokens": [1, 2, 3], "prompt_length": 1}
            for r in range(2)]
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "x.parquet"))
    procs = {}
    for timeout in ("60", "0"):
        pid_file = tmp_path / f"pids-{timeout}"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, str(tmp_path)]), "PID_FILE": str(pid_file)}
        procs[timeout] = (pid_file, subprocess.Popen(
            [sys.executable, "-m", "rescore", "--input", str(tmp_path / "x.parquet"), "--output", str(tmp_path / f"out-{timeout}"),
             "--strategy", "grpo", "--reward-fn", "sandboxing_verifier:answer", "--reward-fn-timeout", timeout,
             "--quiet", "--runner=FnApiRunner"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        for timeout, (pid_file, proc) in procs.items():
            try:
                out, err = proc.communicate(timeout=120)  # EOF on both pipes: nothing holds them any more
            except subprocess.TimeoutExpired:
                proc.kill()
                pytest.fail(f"--reward-fn-timeout {timeout}: rescore's stdout/stderr are still held open")
            assert proc.returncode == 0, err
            pids = [int(p) for p in pid_file.read_text().split()]
            assert len(pids) == 2
            assert [p for p in pids if _alive(p)] == [], f"--reward-fn-timeout {timeout}: processes left running"
    finally:  # a failing run leaves the sleeps it started: end them (by their pid)
        for pid_file, proc in procs.values():
            if proc.poll() is None:
                proc.kill()
            for pid in (int(p) for p in (pid_file.read_text().split() if pid_file.exists() else [])):
                if _alive(pid):
                    os.kill(pid, 9)
