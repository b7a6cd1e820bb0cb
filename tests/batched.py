"""Several `rescore` command lines in ONE child process: the imports (~3 s of torch and Beam) are
paid once instead of once per run, and every run still has a real process's stderr.

Each run calls `rescore.pipelines.cli.main(argv)` with file descriptor 2 sent to a file of
its own, so what a user's terminal would show (our `rescore: error:` line, and anything Beam or a
library writes to fd 2) is what the test reads; pytest's capture is not involved (main(), not the
console script's run_command_line(), which drops what other processes wrote to fd 2 after a failure). Use it for
runs that check an exit status and stderr; a test about signals, `os._exit` or the console script
itself keeps its own process, or a forked one: `ForkedRuns` forks each run from a child that
imported Rescore once, and runs the console script's `run_command_line()` there (real pid, exit status and
signals; the imports paid once).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SET_ENV = """
import os


def set_env(env):
    for key, value in env.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
"""

_DRIVER = _SET_ENV + """
import json, sys
from rescore.pipelines.cli import main
codes = []
for argv, env, err in json.loads(sys.argv[1]):
    set_env(env)
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


_FORK_DRIVER = _SET_ENV + """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
from rescore.pipelines import cli, job  # the job too: Beam, imported once
for line in sys.stdin:
    argv, env, err = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            set_env(env)
            out = os.open(err + ".stdout", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            fd = os.open(err, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(out, 1)
            os.dup2(fd, 2)
            sys.argv = ["rescore", *argv]
            cli.run_command_line()  # the console script's path; it ends with os._exit(code)
        except SystemExit as e:  # --help and argparse's own errors, as the interpreter exits on them
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    print(json.dumps({"code": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])}), flush=True)
"""


class ForkedRuns:
    """`rescore` runs as processes forked from one child that imported Rescore (and `preload`)
    once: each run is a real process running the console script's `run_command_line()` (its own pid, fd 2,
    exit status or killing signal) without paying ~4 s of imports. For runs a test kills or
    whose real exit status it checks, one after another; a run that must start from a fresh
    interpreter (start-up, import errors) keeps a `python -m rescore` of its own.

        with ForkedRuns(tmp_path / "runs") as runs:
            code, stderr = runs.run(argv, {"RESCORE_TEST_INJECT_FAULT": "kill_at:planned"})
            pid = runs.start(argv)  # then os.kill(pid, ...) and runs.wait()
    """

    def __init__(self, workdir, *, preload: tuple[str, ...] = (), cwd: str = ROOT):
        os.makedirs(workdir, exist_ok=True)
        self._workdir, self._runs, self._buffer, self._err, self._pid = str(workdir), 0, b"", None, None
        env = {k: v for k, v in os.environ.items() if k not in ("RESCORE_FAULT", "RESCORE_TEST_INJECT_FAULT")}
        env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._proc = subprocess.Popen([sys.executable, "-c", _FORK_DRIVER, json.dumps(list(preload))], cwd=cwd, env=env,
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def start(self, argv: list[str], env: dict | None = None, timeout: float = 120) -> int:
        """Fork a run of `rescore argv` with `env` ({VARIABLE: value or None}) changed; its pid."""
        self._err = os.path.join(self._workdir, f"stderr-{self._runs}.txt")
        self._runs += 1
        self._proc.stdin.write((json.dumps([list(argv), env or {}, self._err]) + "\n").encode())
        self._proc.stdin.flush()
        self._pid = self._reply(timeout)["pid"]
        return self._pid

    def wait(self, timeout: float = 300) -> tuple[int, str]:
        """(exit status, or -N for a signal as subprocess gives it; stderr text) of the started run."""
        code = self._reply(timeout)["code"]
        self._pid = None
        return code, open(self._err, encoding="utf-8").read()

    def stdout(self) -> str:
        """What the last run wrote to its stdout."""
        return open(self._err + ".stdout", encoding="utf-8").read()

    def run(self, argv: list[str], env: dict | None = None, timeout: float = 300) -> tuple[int, str]:
        self.start(argv, env)
        return self.wait(timeout)

    def _reply(self, timeout: float) -> dict:
        import select

        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            assert left > 0 and select.select([self._proc.stdout], [], [], left)[0], "no reply from the forked run"
            chunk = os.read(self._proc.stdout.fileno(), 65536)
            assert chunk, f"the fork driver exited ({self._proc.wait()})"
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self._pid is not None:  # a test failed while a run was going: it goes too
            try:
                os.kill(self._pid, 9)
            except ProcessLookupError:
                pass
        self._proc.stdin.close()
        if self._proc.wait(timeout=60) != 0 and exc[0] is None:
            raise AssertionError(f"the fork driver exited {self._proc.returncode}")


def rescore_process(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """`python -m rescore ARGS` in a process of its own: for a run whose start-up is what is tested."""
    return subprocess.run([sys.executable, "-m", "rescore", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def forked_run(runs: ForkedRuns, *args: str) -> subprocess.CompletedProcess:
    """One `rescore ARGS` forked by `runs` (a ForkedRuns), as a CompletedProcess."""
    code, err = runs.run(list(args))
    return subprocess.CompletedProcess(["rescore", *args], code, runs.stdout(), err)
