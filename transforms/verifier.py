"""--reward-fn: a Python verifier loaded from 'module:function', called per row, and the worker
process that enforces --reward-fn-timeout. No torch and no Beam: the worker process imports
only this module (and the verifier's own).

A verifier that raises, or returns something that is not a finite number, rejects its row with
the reason. With a timeout (the default, DEFAULT_REWARD_FN_TIMEOUT in rows/model_columns.py),
the verifier runs in a worker process of its own (VerifierProcess): a call that does not return
in time rejects its row (`model_reward: reward_fn mod:fn timed out after 60s`), the worker is killed with
everything it started and a fresh one takes the next row. A thread could not do that: Python
cannot stop a thread stuck in a loop or a C call. A worker whose parent is gone (killed,
os._exit) leaves on its own: it watches its parent's pid.

Containment: the worker process is a keeper (`contain`) that makes itself the child subreaper of
everything below it (Linux prctl PR_SET_CHILD_SUBREAPER) and forks the process that calls the
verifier. A process the verifier starts stays below the keeper even when it starts its own
session (`start_new_session=True`, as sandboxes do) and its parent exits: it is reparented to
the keeper, not to init, so the keeper always finds it (walking /proc's parent links). When the
worker stops (a timeout, close(), the verifier's process ending, or Rescore gone) the keeper
kills every process below it and reaps them before it exits, so nothing a verifier starts
outlives the run or holds Rescore's stdout/stderr open. (Without prctl, not Linux, a process
whose parent exits escapes the walk; the keeper's process group is still killed.)
"""

from __future__ import annotations

import inspect
import math
import os
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from rescore.errors import ModelConfigError, first_line
from rescore.user_code import load_function

REWARD_FN_ARGS = ("prompt_tokens", "response_tokens", "prompt", "response", "reward", "batch", "task", "run", "step")
"""What a --reward-fn may take, by parameter name."""
START_TIMEOUT = 300.0
"""Seconds a worker process may take to start and import the verifier (not a row's time)."""


@dataclass(frozen=True)
class RewardFn:
    """A verifier loaded from 'module:function' and the arguments it takes (REWARD_FN_ARGS)."""

    spec: str
    fn: Callable[..., Any]
    args: tuple[str, ...]

    @property
    def needs_text(self) -> bool:
        return "prompt" in self.args or "response" in self.args


def load_reward_fn(spec: str) -> RewardFn:
    """'package.module:function' -> RewardFn; ModelConfigError with the reason otherwise."""
    fn = load_function(spec, "--reward-fn", ModelConfigError)
    params = inspect.signature(fn).parameters
    unknown = [p for p, v in params.items() if p not in REWARD_FN_ARGS and v.default is inspect.Parameter.empty
               and v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)]
    if unknown:
        raise ModelConfigError(
            f"--reward-fn {spec}: unknown parameter {unknown[0]!r}; a verifier takes any of {', '.join(REWARD_FN_ARGS)}"
        )
    takes_all = any(v.kind == v.VAR_KEYWORD for v in params.values())
    args = REWARD_FN_ARGS if takes_all else tuple(p for p in params if p in REWARD_FN_ARGS)
    return RewardFn(spec, fn, args)


def call_reward_fn(reward_fn: RewardFn, values: dict[str, Any]) -> tuple[float | None, str | None]:
    """(reward, None) or (None, reject reason) for one row; the verifier's own errors reject
    the row (with the error) instead of stopping the run."""
    try:
        result = reward_fn.fn(**{k: values[k] for k in reward_fn.args})
    except Exception as e:
        first = first_line(e, blank="")
        return None, f"model_reward: reward_fn {reward_fn.spec} raised {type(e).__name__}{': ' + first if first else ''}"
    if isinstance(result, bool) or not isinstance(result, (int, float, np.floating, np.integer)):
        return None, f"model_reward: reward_fn {reward_fn.spec} returned {type(result).__name__}, not a number"
    try:  # one rule for the worker process and --reward-fn-timeout 0: this call, never the caller
        value = float(result)
    except Exception as e:  # noqa: BLE001  (10**400: OverflowError; a number type whose float() raises)
        return None, f"model_reward: reward_fn {reward_fn.spec} returned a {type(result).__name__} that is not a float64 ({type(e).__name__})"
    if not math.isfinite(value):
        return None, f"model_reward: reward_fn {reward_fn.spec} returned {value}"
    return value, None


# --- the worker process ------------------------------------------------------------------------


def _watch_parent(parent: int) -> None:
    """In the worker: leave as soon as the process that started it is gone."""
    import time

    while True:
        if os.getppid() != parent:
            os._exit(0)
        time.sleep(0.5)


def serve(read_fd: int, write_fd: int, spec: str, parent: int) -> None:
    """The worker process's loop: load the verifier, answer ("ready", None) or ("error", why),
    then for each list of rows received, send one (reward, reason) per row as it is done."""
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True).start()
    inbox, outbox = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        fn = load_reward_fn(spec)
    except Exception as e:  # noqa: BLE001
        outbox.send(("error", str(e)))
        return
    outbox.send(("ready", None))
    while True:
        try:
            rows = inbox.recv()
        except (EOFError, OSError):
            return
        if rows is None:
            return
        for values in rows:
            try:
                answer = call_reward_fn(fn, values)
            except BaseException as e:  # noqa: BLE001  (SystemExit, KeyboardInterrupt from the verifier)
                answer = (None, f"model_reward: reward_fn {spec} raised {type(e).__name__}")
            outbox.send(answer)


_CHILD = "import sys; from rescore.transforms.verifier import contain; contain(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))"

PR_SET_CHILD_SUBREAPER = 36
"""linux/prctl.h: orphaned descendants are reparented to this process instead of init."""
KEEPER_POLL = 0.1
"""Seconds between the keeper's checks that its verifier process and Rescore still run."""


def _become_subreaper() -> bool:
    """Make this process the child subreaper of its descendants (Linux); False where it cannot."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(root: int) -> list[int]:
    """The live (not zombie) processes below `root`, found through /proc's parent links."""
    children: dict[int, list[int]] = {}
    zombies: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 2:
            continue
        pid = int(entry)
        children.setdefault(int(fields[1]), []).append(pid)
        if fields[0] in (b"Z", b"X"):
            zombies.add(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        if pid not in zombies:
            found.append(pid)
        todo += children.get(pid, [])
    return found


def _reap_children(statuses: dict[int, int]) -> None:
    """Reap every ended child of this process, recording its wait status."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        statuses[pid] = status


def _kill_below(root: int, statuses: dict[int, int], deadline: float = 10.0) -> None:
    """SIGKILL every process below `root` (this process), reaping each as it ends, until none
    is left: a process that forks while it is killed has its child reparented here (the
    subreaper), and the next round finds it."""
    import time

    end = time.monotonic() + deadline
    while True:
        alive = descendants(root)
        if not alive or time.monotonic() > end:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
        _reap_children(statuses)
    _reap_children(statuses)


def contain(read_fd: int, write_fd: int, spec: str, parent: int) -> None:
    """The worker process: a keeper (the subreaper of everything below it) and, below it, the
    process that serves the verifier (serve). The keeper ends only after every process below it
    is gone, with the verifier process's exit code (its signal re-raised where one ended it)."""
    import time

    _become_subreaper()
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    keeper = os.getpid()
    child = os.fork()
    if child == 0:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        try:
            serve(read_fd, write_fd, spec, keeper)
        finally:
            os._exit(0)
    os.close(read_fd)  # the verifier's process alone holds the pipes: its end is the parent's EOF
    os.close(write_fd)
    statuses: dict[int, int] = {}
    while child not in statuses and not stop and os.getppid() == parent:
        _reap_children(statuses)
        if child not in statuses:
            time.sleep(KEEPER_POLL)
    end = time.monotonic() + 0.2  # stopped just as the verifier's process ended: its exit code is the answer
    while child not in statuses and time.monotonic() < end:
        _reap_children(statuses)
        time.sleep(0.005)
    _kill_below(keeper, statuses)
    code = os.waitstatus_to_exitcode(statuses[child]) if child in statuses else 1
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(keeper, -code)
    os._exit(code)


_IN_PROCESS: list[int] = []
"""The pid of this process once it has become the subreaper of an in-process verifier's children."""


def contain_in_process() -> None:
    """--reward-fn-timeout 0: the verifier runs in this process. Make this process the subreaper of
    what the verifier starts (a child in its own session whose parent exits comes back here), so
    that end_in_process() finds and ends it when the command ends."""
    if os.getpid() not in _IN_PROCESS and _become_subreaper():
        _IN_PROCESS.append(os.getpid())


def end_in_process() -> None:
    """When the `rescore` command ends (pipelines/cli.py, just before its os._exit): kill and reap
    every process still below this one, if an in-process verifier ran here. Nothing else of the
    run is left by then (Beam's workers and job servers are stopped before)."""
    if os.getpid() in _IN_PROCESS:
        _kill_below(os.getpid(), {}, deadline=5.0)


def _reap(state: dict) -> None:
    """Kill a worker process and everything it started, and wait for it (no zombie)."""
    proc = state.get("proc")
    for conn in (state.get("send"), state.get("recv")):
        try:
            if conn is not None:
                conn.close()
        except OSError:
            pass
    state.update(proc=None, send=None, recv=None)
    if proc is None:
        return None
    # The keeper (contain) kills and reaps everything below it, then exits; its process group is
    # SIGKILLed only where it does not (it is idle in a poll loop, so it does).
    for kill, sig, wait in ((os.kill, signal.SIGTERM, 15), (os.killpg, signal.SIGKILL, 30)):
        try:
            kill(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            return proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:  # pragma: no cover - the keeper is idle and quick; SIGKILL quicker
            continue
    return None


class VerifierProcess:
    """Calls `spec` row by row in a worker process, giving each call `timeout` seconds.

    One worker at a time (calls from several threads take turns); a row that times out or
    kills the worker is rejected with the reason, and the next row gets a fresh worker. The
    worker is started at the first call and killed by close() or when this object goes."""

    def __init__(self, spec: str, timeout: float):
        self.spec = spec
        self.timeout = float(timeout)
        self.started = 0
        """Workers started so far (1 + one per row that timed out or crashed its worker)."""
        self._lock = threading.Lock()
        self._state: dict[str, Any] = {}
        self._finalizer = weakref.finalize(self, _reap, self._state)

    def _start(self) -> None:
        from multiprocessing.connection import Connection

        to_child, child_in = os.pipe()
        child_out, from_child = os.pipe()
        # The worker imports what this process can: its sys.path (a verifier next to the
        # caller's code, an editable install) goes with it.
        paths = [p if p else os.getcwd() for p in sys.path]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(to_child), str(from_child), self.spec, str(os.getpid())],
                pass_fds=(to_child, from_child), stdin=subprocess.DEVNULL, env=env, start_new_session=True,
            )
        finally:
            os.close(to_child)
            os.close(from_child)
        self.started += 1
        self._state.update(proc=proc, send=Connection(child_in, readable=False), recv=Connection(child_out, writable=False))
        recv = self._state["recv"]
        ready = recv.poll(max(START_TIMEOUT, self.timeout))
        try:
            kind, why = recv.recv() if ready else ("error", f"did not start in {max(START_TIMEOUT, self.timeout):g}s")
        except (EOFError, OSError):
            kind, why = "error", f"its worker process ended at start (exit code {proc.poll()})"
        if kind != "ready":
            _reap(self._state)
            raise RuntimeError(f"--reward-fn {self.spec}: the verifier's worker process failed: {why}")

    def __call__(self, rows: list[dict[str, Any]]) -> list[tuple[float | None, str | None]]:
        """(reward, None) or (None, reason) for each row, in order."""
        out: list[tuple[float | None, str | None]] = []
        with self._lock:
            while len(out) < len(rows):
                if self._state.get("proc") is None:
                    self._start()
                send, recv = self._state["send"], self._state["recv"]
                try:
                    send.send(rows[len(out):])
                except OSError:  # the worker died between calls: a fresh one takes the rows
                    _reap(self._state)
                    continue
                while len(out) < len(rows):
                    if not recv.poll(self.timeout):
                        _reap(self._state)
                        out.append((None, f"model_reward: reward_fn {self.spec} timed out after {self.timeout:g}s"))
                        break
                    try:
                        out.append(recv.recv())
                    except (EOFError, OSError):
                        code = _reap(self._state)
                        out.append((None, f"model_reward: reward_fn {self.spec} ended its worker process (exit code {code})"))
                        break
        return out

    def close(self) -> None:
        """Stop the worker (a row in progress is abandoned)."""
        with self._lock:
            _reap(self._state)

    @property
    def pid(self) -> int | None:
        """The worker's process id (None: not running)."""
        proc = self._state.get("proc")
        return None if proc is None else proc.pid
