"""Several `rescore` command lines in ONE child process: the imports (~3 s of torch and Beam) are
paid once instead of once per run, and every run still has a real process's stderr.

Each run calls `rescore.pipelines.rescore.main(argv)` with file descriptor 2 sent to a file of
its own, so what a user's terminal would show (our `rescore: error:` line, and anything Beam or a
library writes to fd 2) is what the test reads; pytest's capture is not involved. Use it for
runs that check an exit status and stderr; a test about signals, `os._exit` or the console script
itself keeps its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_DRIVER = """
import json, os, sys
from rescore.pipelines.rescore import main
codes = []
for argv, env, err in json.loads(sys.argv[1]):
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    sys.stderr.flush()
    fd, saved = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), os.dup(2)
    os.dup2(fd, 2)
    try:
        codes.append(main(argv))
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(fd)
        os.close(saved)
print(json.dumps(codes))
"""


def run_many(workdir, runs: list, *, cwd: str = ROOT, timeout: int = 600) -> list[tuple[int, str]]:
    """[(exit status, stderr text)] of each run, in order, in one child process; a run is an argv
    list, or (argv, {VARIABLE: value or None}) to set or unset environment variables from that run
    on. `workdir` (a directory) holds their stderr files."""
    os.makedirs(workdir, exist_ok=True)
    jobs = []
    for i, run in enumerate(runs):
        argv, env = (run, {}) if isinstance(run, list) else run
        jobs.append([list(argv), env, os.path.join(str(workdir), f"stderr-{i}.txt")])
    env = {k: v for k, v in os.environ.items() if k not in ("RESCORE_FAULT", "RESCORE_TEST_INJECT_FAULT")}
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(jobs)], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    codes = json.loads(proc.stdout.strip().splitlines()[-1])
    return [(code, open(err, encoding="utf-8").read()) for code, (_, _, err) in zip(codes, jobs)]
