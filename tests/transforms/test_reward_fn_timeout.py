"""--reward-fn-timeout (issue 28): a verifier call that does not return in time rejects its row
with the reason, also when the verifier truly hangs (an endless loop, a blocked C call, a child
process of its own); the worker process is killed, nothing is left running, and the next row
gets a fresh worker. Bad values of the flag: one line, exit 2."""

import os
import subprocess
import sys
import time

import pyarrow as pa
import pytest
from batched import run_many
from conftest import RUNNER
from data import read_output

from rescore.transforms.verifier import VerifierProcess

VERIFIER = '''
import os, subprocess, sys, time

def answer(response_tokens, task, run):
    if task == 1 and run == 1:
        while True:          # an endless loop: no thread could stop it
            pass
    if task == 1 and run == 2:
        # a grandchild that outlives a plain kill of the worker, then a blocking wait on it
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(os.environ["PID_FILE"], "w").write(str(p.pid))
        p.wait()
    if task == 2 and run == 0:
        os._exit(3)          # the worker dies
    return float(len(response_tokens) + run)

def slow(run):
    time.sleep(0.3)
    return float(run)
'''


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as gone
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def verifier(tmp_path, monkeypatch):
    (tmp_path / "hanging_verifier.py").write_text(VERIFIER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PID_FILE", str(tmp_path / "grandchild.pid"))
    return tmp_path


def _row(task, run, n=3):
    return {"response_tokens": list(range(n)), "task": task, "run": run}


@pytest.mark.slow
def test_a_hanging_call_is_rejected_and_its_worker_killed_with_everything_it_started(verifier):
    v = VerifierProcess("hanging_verifier:answer", 1.0)
    started = time.monotonic()
    out = v([_row(0, 0), _row(1, 1), _row(0, 2), _row(1, 2), _row(2, 0), _row(0, 3)])
    took = time.monotonic() - started
    assert out[0] == (3.0, None) and out[2] == (5.0, None) and out[5] == (6.0, None)
    assert out[1] == (None, "model_reward: reward_fn hanging_verifier:answer timed out after 1s")
    assert out[3] == (None, "model_reward: reward_fn hanging_verifier:answer timed out after 1s")
    assert out[4][0] is None and "ended its worker process (exit code 3)" in out[4][1]
    assert v.started == 4 and took < 30
    grandchild = int((verifier / "grandchild.pid").read_text())
    time.sleep(0.2)
    assert not _alive(grandchild)
    pid = v.pid
    v.close()
    assert v.pid is None and not _alive(pid)


@pytest.mark.slow
def test_the_limit_is_per_call_and_a_closed_worker_leaves(verifier):
    v = VerifierProcess("hanging_verifier:slow", 1.0)
    assert v([{"run": r} for r in range(5)]) == [(float(r), None) for r in range(5)]  # 1.5 s in all, 0.3 s each
    pid = v.pid
    del v
    time.sleep(0.2)
    assert not _alive(pid)


@pytest.mark.slow
def test_a_worker_whose_parent_is_killed_leaves_on_its_own(verifier, tmp_path):
    """The parent is SIGKILLed while its worker runs an endless loop: the worker notices its
    parent is gone and exits (no process is left behind)."""
    code = (
        "import sys, os; sys.path.insert(0, %r)\n"
        "from rescore.transforms.verifier import VerifierProcess\n"
        "v = VerifierProcess('hanging_verifier:answer', 600)\n"
        "v([{'response_tokens': [], 'task': 0, 'run': 0}])\n"
        "print(v.pid, flush=True)\n"
        "v([{'response_tokens': [], 'task': 1, 'run': 1}])\n" % str(verifier)
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    worker = int(proc.stdout.readline())
    time.sleep(0.5)
    assert _alive(worker)
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


@pytest.mark.slow
def test_rescore_rejects_rows_whose_verifier_hangs(verifier, tmp_path, rescore):
    import pyarrow.parquet as pq

    rows = [
        {"batch": 0, "task": t, "run": r, "step": 0, "reward": 0.5, "tokens": [1, 2, 3, 4], "prompt_length": 1,
         "logprobs": [-0.5] * 3, "action_mask": [True] * 3}
        for t in (0, 1) for r in range(4)
    ]
    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "in" / "x.parquet"))
    started = time.monotonic()
    doc, out = rescore(str(tmp_path / "in" / "x.parquet"), "--strategy", "grpo", "--reward-fn", "hanging_verifier:answer",
                       "--reward-fn-timeout", "2")
    assert time.monotonic() - started < 120
    rejected = {(r["task"], r["run"]): r["reject_reason"] for r in read_output(out, "rejected").to_pylist()}
    assert rejected == {(1, 1): "model_reward: reward_fn hanging_verifier:answer timed out after 2s",
                        (1, 2): "model_reward: reward_fn hanging_verifier:answer timed out after 2s"}
    scored = {(r["task"], r["run"]): r["reward"] for r in read_output(out).to_pylist()}
    assert scored == {(t, r): 3.0 + r for t in (0, 1) for r in range(4) if (t, r) not in rejected}
    assert doc["models"]["reward_fn_timeout"] == 2.0 and doc["totals"]["reject_reasons"] == {"model_reward": 2}
    assert not _alive(int((verifier / "grandchild.pid").read_text()))


@pytest.mark.slow
def test_bad_timeouts_are_one_line_exit_2(tmp_path):
    base = ["--input", str(tmp_path / "none.parquet"), "--output", str(tmp_path / "o"), "--strategy", "grpo", RUNNER]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("models:\n  reward_fn: os.path:basename\n  reward_fn_timeout: fast\n")
    runs = [
        [*base, "--reward-fn", "os.path:basename", "--reward-fn-timeout", "-1"],
        [*base, "--reward-fn", "os.path:basename", "--reward-fn-timeout", "nan"],
        [*base, "--reward-fn", "os.path:basename", "--reward-fn-timeout", "inf"],
        [*base, "--reward-fn", "os.path:basename", "--reward-fn-timeout", "soon"],
        [*base, "--reward-fn-timeout", "5"],
        [*base, "--config", str(cfg)],
    ]
    results = run_many(tmp_path / "runs", runs)
    for (code, err), needle in zip(results, ["got '-1'", "got 'nan'", "got 'inf'", "got 'soon'", "limits a --reward-fn verifier",
                                             "models.reward_fn_timeout must be a number of seconds"]):
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("rescore: error: ") and needle in lines[0], err


def test_defaults_and_zero():
    from rescore.pipelines.config import parse_args
    from rescore.transforms.rows.model_columns import DEFAULT_REWARD_FN_TIMEOUT

    base = ["--input", "x", "--output", "o", "--strategy", "grpo"]
    assert parse_args([*base, "--reward-fn", "m:f"]).models.reward_fn_timeout == DEFAULT_REWARD_FN_TIMEOUT == 60.0
    assert parse_args([*base, "--reward-fn", "m:f", "--reward-fn-timeout", "0"]).models.reward_fn_timeout == 0.0
    assert parse_args([*base, "--reward-fn", "m:f", "--reward-fn-timeout", "2.5"]).models.reward_fn_timeout == 2.5
    assert parse_args(base).models.reward_fn_timeout is None
