"""--reward-fn: a Python verifier loaded from 'module:function', called per row, and the worker
process that enforces --reward-fn-timeout. No torch and no Beam: the worker process imports
only this module (and the verifier's own).

A verifier that raises, or returns something that is not a finite number, rejects its row with
the reason. With a timeout (the default, DEFAULT_REWARD_FN_TIMEOUT in rows/model_columns.py),
the verifier runs in a worker process of its own (VerifierProcess): a call that does not return
in time rejects its row (`model_reward: reward_fn mod:fn timed out after 60s`), the worker is killed with
everything it started (its own process group) and a fresh one takes the next row. A thread
could not do that: Python cannot stop a thread stuck in a loop or a C call. A worker whose
parent is gone (killed, os._exit) leaves on its own: it watches its parent's pid.
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


_CHILD = "import sys; from rescore.transforms.verifier import serve; serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))"


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
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not take this long
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
