"""The launcher's view of a job on a Flink session cluster, through Flink's REST API (the
address `--flink_master` names): the job's name, so the launcher can find its job, and cancelling
it when the launcher loses Beam's job server.

Beam's job server submits the job to the JobManager and waits for it; the job itself runs on the
cluster. A job server that dies (killed, out of memory, its machine gone) takes the launcher's
view of the job with it, but not the job: left alone, it would go on and publish its output and
`_SUCCESS` after the launcher had reported a failure. So the launcher names the job
(`--job_name`, unless the user named it) and, when the run fails, cancels it on the cluster and
waits until Flink says it is cancelled, before it reports the failure."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
import urllib.request
import uuid

from rescore.pipelines.flink_options import is_flink

log = logging.getLogger("rescore.pipelines.flink_job")

TERMINAL = ("FINISHED", "FAILED", "CANCELED", "SUSPENDED")


def rest_address(options) -> str | None:
    """http://host:port of the cluster's REST API, or None where Beam runs Flink itself
    ([auto], [local]) or the runner is not Flink."""
    from apache_beam.options.pipeline_options import FlinkRunnerOptions, StandardOptions

    if not is_flink(options.view_as(StandardOptions).runner):
        return None
    master = options.view_as(FlinkRunnerOptions).flink_master or ""
    if not master or master.startswith("["):
        return None
    return master if "://" in master else f"http://{master}"


class FlinkJob:
    """The job this run submits to a Flink session cluster: its REST address and name, taken
    before the run starts (Beam's FlinkRunner rewrites the options as it submits)."""

    def __init__(self, rest: str, name: str):
        self.rest = rest
        self.name = name

    def cancel(self, wait_s: float = 60.0) -> str:
        """Cancel the job if it still runs; wait until Flink calls it terminal. Returns what
        happened, for the run's error line ('' where nothing was running)."""
        try:
            running = [j for j in jobs_named(self.rest, self.name) if j["state"] not in TERMINAL]
            for job in running:
                _call(f"{self.rest}/jobs/{job['jid']}?mode=cancel", method="PATCH")
            deadline = time.monotonic() + wait_s
            while running and time.monotonic() < deadline:
                states = {j["jid"]: j["state"] for j in jobs_named(self.rest, self.name)}
                if all(states.get(j["jid"]) in TERMINAL for j in running):
                    return f"its Flink job {', '.join(j['jid'] for j in running)} was cancelled"
                time.sleep(0.5)
            if running:
                return f"its Flink job {', '.join(j['jid'] for j in running)} did not stop in {wait_s:.0f} s of cancelling"
            return ""
        except (OSError, ValueError, KeyError) as e:  # the cluster itself is unreachable
            log.warning("could not cancel Flink job %s at %s: %s", self.name, self.rest, e)
            return f"its Flink job {self.name} could not be cancelled at {self.rest} ({e})"

    def progress_detail(self) -> str:
        """For the progress line (pipelines/progress.py): what the cluster is doing. Until the job
        is on the cluster, Rescore's marks stay at 0 % while Beam starts its job server,
        translates the pipeline and submits it (tens of seconds on a small machine); then the
        job's state and its finished tasks, and a restart after a lost TaskManager."""
        try:
            jobs = jobs_named(self.rest, self.name)
        except (OSError, ValueError, KeyError):
            return ""
        if not jobs:
            return "Beam's Flink job server is starting and submitting the job"
        job = max(jobs, key=lambda j: j.get("start-time", 0))
        tasks = job.get("tasks", {})
        text = f"Flink job {job['state'].lower()}, {tasks.get('finished', 0)}/{tasks.get('total', 0)} tasks finished"
        if tasks.get("failed") or job["state"] == "RESTARTING":
            text += " (restarting failed tasks)"
        return text


def on_cluster(options, output: str) -> FlinkJob | None:
    """The run's FlinkJob where it runs on a Flink session cluster, else None. Names the job
    (`rescore-OUTPUTNAME-RANDOM`, through --job_name) unless the user named it."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    rest = rest_address(options)
    if rest is None:
        return None
    named = options.view_as(GoogleCloudOptions)
    if not named.job_name:
        base = os.path.basename(output.rstrip("/")) or "output"
        named.job_name = f"rescore-{''.join(c if c.isalnum() else '-' for c in base)[:40]}-{uuid.uuid4().hex[:8]}"
    return FlinkJob(rest, named.job_name)


@contextlib.contextmanager
def quiet_message_thread():
    """Beam's portable runner reads the job's messages on a thread of its own
    (`wait_until_finish_read`); a job server lost mid-run ends that thread with the same gRPC
    error the run then raises, and Python prints its traceback on stderr. The run's one error
    line says it: the thread's traceback is dropped (every other thread's is printed).

    The thread can end after the run has raised (CI saw its traceback printed after the hook was
    gone): on the way out the hook waits for that thread, and stays installed if it is still
    running then."""
    import threading

    previous = threading.excepthook

    def hook(args):
        if args.thread is not None and args.thread.name == MESSAGE_THREAD:
            return
        previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        readers = [t for t in threading.enumerate() if t.name == MESSAGE_THREAD]
        for t in readers:
            t.join(timeout=10)
        if not any(t.is_alive() for t in readers) and threading.excepthook is hook:
            threading.excepthook = previous


MESSAGE_THREAD = "wait_until_finish_read"  # Beam's portable_runner names it so


def _call(url: str, method: str = "GET"):
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body else None


def jobs_named(rest: str, name: str) -> list[dict]:
    return [j for j in _call(f"{rest}/jobs/overview")["jobs"] if j.get("name") == name]
