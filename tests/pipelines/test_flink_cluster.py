"""Rescore on a real Flink cluster (one JobManager, two TaskManagers, 2 slots each) through
Beam's FlinkRunner and job server: the same bytes as in-process, work on both TaskManagers;
the chain case as on a cluster without a shared disk: input and output in an S3 server
(tests/stores/servers.py), the launcher's local paths hidden from every SDK worker, no
`--shared-filesystem`;
TaskManagers killed with kill -9 while the job reads, scores and writes: the job recovers (the
shipped cluster config's restart strategy and region failover) with the same bytes; the job
server killed: one line, no `_SUCCESS`, the job cancelled on the cluster, and a rerun succeeds.

The cluster comes from `tools/flink_local.py` (Flink's jars from PyPI, Beam's Flink job
server from Maven Central, cached in `~/.cache/rescore/flink`), started once for the session.
Without Java or Maven (or where the jars cannot be fetched) every test here skips, saying why;
RESCORE_CLUSTER_TESTS=0 turns them off.
"""

import importlib.util
import os
import subprocess
import sys
import time

import pytest
from data import SCHEMA_MULTI_STEP, multi_step_rows, write_parquet

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "stores"))
from servers import S3Server, Unavailable, upload_tree  # noqa: E402
pytestmark = pytest.mark.slow  # under pytest-xdist, `--dist loadfile` runs them in one process: one cluster

_spec = importlib.util.spec_from_file_location("flink_local", os.path.join(ROOT, "tools", "flink_local.py"))
flink_local = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(flink_local)

CHAIN = ["--strategy", "reward_variance,grpo,duplicate_informative", "--set", "std_cal_level=batch"]
# GRPO on its own is not a case of its own: the chain runs it between the filter and the
# duplication (and the recovery test runs the chain twice more); a Flink run costs a minute of CI.
# The chain reads and writes a bucket (the only case that does: the other one, and the recovery
# test, keep the local disk the cluster shares with the launcher).
CASES = {
    "filter-duplicate-chain-in-s3": CHAIN,
    "multi-step-grpo": ["--algorithm", "multi_step_grpo"],
}
IN_A_BUCKET = {"filter-duplicate-chain-in-s3"}


@pytest.fixture(scope="session")
def flink(tmp_path_factory):
    """One local Flink cluster for the session; torn down (every JVM and SDK worker) at the end."""
    if os.environ.get("RESCORE_CLUSTER_TESTS") == "0":
        pytest.skip("RESCORE_CLUSTER_TESTS=0: the Flink and Prism cluster tests are turned off")
    why = flink_local.missing_tools()
    if why:
        pytest.skip(why)
    try:
        flink_local.fetch()  # waits for a fetch in progress (.ci/run starts one in the background)
    except (subprocess.CalledProcessError, OSError) as e:
        pytest.skip(f"could not fetch Flink's jars or Beam's Flink job server: {e}")
    # the SDK workers can be held in a phase (transforms/fault_injection.py, hold:DIR) while a
    # test creates DIR/hold-PHASE; no other test creates one
    hold = tmp_path_factory.mktemp("flink_hold")
    cluster = flink_local.start(tmp_path_factory.mktemp("flink"), taskmanagers=2, slots=2,
                                env={"RESCORE_TEST_INJECT_FAULT": f"hold:{hold}"})
    cluster.hold_dir = hold
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server (tests/stores/servers.py) for this module."""
    server = S3Server()
    try:
        server.start()
    except Unavailable as e:
        server.close()
        pytest.skip(str(e))
    yield server
    server.close()


@pytest.fixture(scope="module")
def experience(tmp_path_factory):
    d = tmp_path_factory.mktemp("flink_in")
    return write_parquet(multi_step_rows(31), str(d / "in"), files=3, row_group_size=8, schema=SCHEMA_MULTI_STEP)


def _files(out):
    return {n: open(os.path.join(out, n), "rb").read() for n in sorted(os.listdir(out))
            if n.endswith(".parquet")}


def _in_process(experience, out, args):
    from rescore.pipelines.cli import run

    run(["--input", experience, "--output", out, *args])
    return _files(out)


def _own_cpu_seconds():
    import resource

    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def _flink_jobs(cluster, since_ms):
    jobs = cluster.get("/jobs/overview")["jobs"]
    return sorted((j for j in jobs if j["start-time"] >= since_ms), key=lambda j: j["start-time"])


def _work_per_taskmanager(cluster, jid):
    """records read by each TaskManager over every vertex of the job (Flink's REST API)."""
    per_tm = {}
    for v in cluster.get(f"/jobs/{jid}")["vertices"]:
        for tm in cluster.get(f"/jobs/{jid}/vertices/{v['id']}/taskmanagers")["taskmanagers"]:
            key = tm.get("taskmanager-id") or tm["host"]
            per_tm[key] = per_tm.get(key, 0) + tm["metrics"]["read-records"] + tm["metrics"]["write-records"]
    return per_tm


def _run_on_flink(flink, experience, out, args):
    from rescore.pipelines.cli import run

    return run(["--config", os.path.join(ROOT, "run_configs", "flink.yaml"), "--input", experience,
                "--output", out, *args, *flink.beam_args(parallelism=4), "--max_bundle_size=700"])


def _run_on_flink_in_s3(flink, s3, experience, launcher_dir, args):
    """The run as on a cluster without a shared disk: the experience uploaded to the S3 server,
    the output there, the store's settings in Beam's options only (--s3_endpoint_url...: they
    reach the SDK workers with the pipeline options; nothing in any process's environment), and
    the launcher's local paths (the experience's folder, this test's tmp_path) hidden from every
    SDK worker of the job. Returns (the run's document, {scored file: bytes}, the bucket's names)."""
    local_in = os.path.dirname(experience)
    bucket = s3.bucket("flink-cluster")
    upload_tree(s3, local_in, f"{bucket}/experience")
    out = f"{bucket}/scored/chain"
    # the server's port is new: only the pipeline options can tell the SDK workers where it is
    assert s3.url not in repr(flink.state) and s3.url not in repr(dict(os.environ))
    with flink.private([local_in, launcher_dir]) as fenced:
        doc = _run_on_flink(flink, f"{bucket}/experience/*.parquet", out, [*args, *s3.beam_args])
        how = fenced()
    print(f"SDK workers fenced off the launcher's paths: {sorted(how.values())}")  # shown by -rP
    assert how, "no SDK worker of the job started while the launcher's paths were private"
    assert set(how.values()) <= {"mount namespace", "audit hook"}
    names = s3.names(out)
    return doc, {n: s3.get(f"{out}/{n}") for n in names if n.endswith(".parquet")}, names


@pytest.mark.parametrize("case", sorted(CASES))
def test_flink_output_is_byte_identical_to_in_process(flink, experience, tmp_path, case, request):
    args = CASES[case]
    expected = _in_process(experience, str(tmp_path / "local"), args)
    since = int(time.time() * 1000)
    cpu = flink.cpu_seconds() + _own_cpu_seconds()
    if case in IN_A_BUCKET:
        doc, got, names = _run_on_flink_in_s3(flink, request.getfixturevalue("s3"), experience, str(tmp_path), args)
        assert "_SUCCESS" in names and "metrics.json" in names
    else:
        out = str(tmp_path / "flink")
        doc = _run_on_flink(flink, experience, out, args)
        assert os.path.exists(os.path.join(out, "_SUCCESS"))
        got = _files(out)
    print(f"Flink run: {time.time() - since / 1000:.0f} s wall, "  # shown by -rP (docs/runners.md's figures)
          f"{flink.cpu_seconds() + _own_cpu_seconds() - cpu:.0f} CPU-s (cluster, SDK workers, job server, launcher)")
    assert doc["totals"]["rows_read"] == sum(1 for _ in multi_step_rows(31))
    assert sorted(got) == sorted(expected) and got == expected  # values and row order, per file
    (job,) = _flink_jobs(flink, since)
    assert job["state"] == "FINISHED"
    # Flink's own options reach the Java runner: flink.yaml's execution_mode_for_batch and the
    # command line's --max_bundle_size (pipelines/flink_options.py)
    config = flink.get(f"/jobs/{job['jid']}/config")["execution-config"]
    assert config["execution-mode"] == "BATCH_FORCED" and config["user-config"]["maxBundleSize"] == "700"
    detail = flink.get(f"/jobs/{job['jid']}")
    assert max(v["parallelism"] for v in detail["vertices"]) == 4
    busy = {tm: n for tm, n in _work_per_taskmanager(flink, job["jid"]).items() if n > 0}
    assert len(busy) == 2, busy  # both TaskManagers moved records


def _rescore_on_flink(flink, experience, out, args):
    """The console script on the cluster, as a user runs it (its own process, stderr apart)."""
    cmd = [os.path.join(os.path.dirname(sys.executable), "rescore"), "--config",
           os.path.join(ROOT, "run_configs", "flink.yaml"), "--input", experience, "--output", out,
           *args, "--progress-seconds", "3600", *flink.beam_args(parallelism=4)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_held(flink, phase, proc, timeout=400):
    """Wait until an SDK worker is held in `phase` (it made DIR/held-PHASE-PID)."""
    deadline = time.time() + timeout
    while not any(n.startswith(f"held-{phase}-") for n in os.listdir(flink.hold_dir)):
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"the run ended (exit {proc.returncode}) before the job reached {phase}:\n{err}")
        if time.time() > deadline:
            pytest.fail(f"no SDK worker reached {phase} in {timeout} s")
        time.sleep(0.2)


def _kill_taskmanager(flink):
    """kill -9 the newest TaskManager and start another in its place (as a cluster manager would)."""
    victim = flink.pids("taskmanager")[-1]
    os.kill(victim, 9)
    for p in flink.state["processes"]:
        if p["pid"] == victim:
            p["role"] = "killed"
    flink.start_taskmanager()
    return victim


def _release(flink, phase):
    os.unlink(os.path.join(flink.hold_dir, f"hold-{phase}"))


def _hold(flink, *phases):
    for name in os.listdir(flink.hold_dir):  # an earlier test's workers were held there
        if name.startswith("held-"):
            os.unlink(os.path.join(flink.hold_dir, name))
    for phase in phases:
        open(os.path.join(flink.hold_dir, f"hold-{phase}"), "w").close()


def _job_server_pid(proc):
    """The job server JVM Beam's FlinkRunner started under the rescore process (its child, or a
    child's child)."""
    parents, jvms = {}, []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            parents[int(pid)] = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
            if b"job-server" in open(f"/proc/{pid}/cmdline", "rb").read():
                jvms.append(int(pid))
        except OSError:
            continue
    for pid in jvms:
        up = parents.get(pid)
        while up and up != proc.pid:
            up = parents.get(up)
        if up == proc.pid:
            return pid
    return None


def test_a_lost_job_server_fails_the_run_and_a_rerun_survives_taskmanagers_killed_in_each_phase(
        flink, experience, tmp_path):
    """Recovery, one cluster, two runs of the same command (two tests in one: each Flink run
    costs a minute or more).

    1. The job server killed (kill -9) while the job scores: the run fails in one line, its
       Flink job is cancelled on the cluster (it cannot publish later), no `_SUCCESS`.
    2. The rerun, with a TaskManager kill -9'd while an SDK worker is held in the read, then in
       the scoring, then in the write step (after its scored file is staged, so the restarted
       task writes a file again): Flink restarts the lost regions (the shipped
       flink-conf.yaml), the run exits 0 with `_SUCCESS` and the in-process run's bytes."""
    expected = _in_process(experience, str(tmp_path / "local"), CHAIN)
    out = str(tmp_path / "flink")
    since = int(time.time() * 1000)
    _hold(flink, "score")
    proc = _rescore_on_flink(flink, experience, out, CHAIN)
    try:
        _wait_held(flink, "score", proc)
        server = _job_server_pid(proc)
        assert server is not None, "no job server process under the rescore process"
        os.kill(server, 9)
        _, errors = proc.communicate(timeout=300)
    finally:
        _release(flink, "score")
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in errors.splitlines() if ln.strip()]
    assert proc.returncode == 1 and len(lines) == 1, errors
    assert lines[0].startswith("rescore: error: pipeline failed: lost Beam's Flink job server") and "was cancelled" in lines[0]
    assert not os.path.exists(os.path.join(out, "_SUCCESS"))
    (job,) = _flink_jobs(flink, since)
    assert job["state"] == "CANCELED"  # it cannot publish after the failure was reported

    since = int(time.time() * 1000)
    _hold(flink, "read", "score", "write")
    proc = _rescore_on_flink(flink, experience, out, CHAIN)
    killed = []
    try:
        for phase in ("read", "score", "write"):
            _wait_held(flink, phase, proc)
            killed.append(_kill_taskmanager(flink))
            _release(flink, phase)
        _, errors = proc.communicate(timeout=900)
    finally:
        for phase in ("read", "score", "write"):
            if os.path.exists(os.path.join(flink.hold_dir, f"hold-{phase}")):
                _release(flink, phase)
        if proc.poll() is None:
            proc.kill()
        flink.wait_for_taskmanagers(2)
    print(f"TaskManagers {killed} killed; rescore exit {proc.returncode}")  # shown by -rP
    assert proc.returncode == 0, errors
    assert os.path.exists(os.path.join(out, "_SUCCESS"))
    assert _files(out) == expected
    (job,) = _flink_jobs(flink, since)
    assert job["state"] == "FINISHED"
    failures = flink.get(f"/jobs/{job['jid']}/exceptions")["exceptionHistory"]["entries"]
    assert len(failures) >= 3, failures  # each kill failed tasks the job then restarted
    assert "Really destroying service" not in errors  # issue 43: nothing after the summary
