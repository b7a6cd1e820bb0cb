"""A local Flink session cluster for Rescore: one JobManager and N TaskManagers (default 2).

Nothing here imports Rescore; it only needs Java 17, Maven (`mvn`) and pip on the machine.

    python run_configs/flink_local.py fetch     # once: Flink's jars (PyPI) + Beam's Flink job server (Maven)
    python run_configs/flink_local.py up        # JobManager, 2 TaskManagers; prints the Beam flags
    rescore --config run_configs/flink.yaml --input 'data/*.parquet' --output out/
    python run_configs/flink_local.py down      # stops every process `up` started

What is fetched, into `$RESCORE_FLINK_CACHE` (default `~/.cache/rescore/flink`), once:
- Flink 1.19.3's distribution jars (`flink-dist`, log4j, ...) from PyPI's `apache-flink-libraries`
  sdist (Flink's own tarball is not on PyPI or Maven Central); the cluster is started with
  `java` directly (the classes `start-cluster.sh` starts), with the memory flags Flink's own
  `BashJavaUtils` computes, as `taskmanager.sh` does.
- Beam's Flink job server. Maven Central serves no `beam-runners-flink-*-job-server` jar (the
  shaded jar Beam's FlinkRunner downloads; 404 for every version), but it serves
  `beam-runners-flink-1.19` 2.62.0 with all its dependencies: Maven resolves them into `lib/`
  and a thin jar whose manifest names `FlinkJobServerDriver` and that `lib/` stands in for the
  shaded jar (`--flink_job_server_jar`). 2.62.0 is the newest version of it whose dependencies
  Maven Central serves (2.70.0's `beam-runners-java-job-service` is missing).

The SDK workers: Docker is not used. Each TaskManager (in its own `WORKDIR/taskmanager-N`) starts
its Python SDK workers itself (`--environment_type=PROCESS`) with `WORKDIR/sdk_worker`, which asks
`WORKDIR/sdk_zygote.py` (tools/flink_sdk_worker.py: Beam's container boot, with this Python, so
every worker imports this environment's Rescore and torch) for one. `Cluster.private(paths)`
hides the launcher's paths from the workers (a cluster without a shared disk). One Beam worker pool shared by
two TaskManagers (`--environment_type=EXTERNAL`) does not work: both TaskManagers number their
workers `1-1`, `2-1`, ... and the pool keys its processes by that id, so one TaskManager's
"stop worker 1-1" kills the other's (its bundles then wait 3 minutes for a data channel and fail).
On Kubernetes each TaskManager pod has its own pool sidecar, where EXTERNAL is right.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from pathlib import Path

FLINK_VERSION = "1.19.3"          # the cluster (PyPI apache-flink-libraries)
FLINK_MINOR = "1.19"              # Beam's --flink_version
BEAM_JOB_SERVER_VERSION = "2.62.0"  # newest beam-runners-flink-1.19 whose dependencies Maven serves
JOB_SERVER_MAIN = "org.apache.beam.runners.flink.FlinkJobServerDriver"
TM_PROCESS_MEMORY = "1280m"
JM_PROCESS_MEMORY = "768m"


def cache_dir() -> Path:
    return Path(os.environ.get("RESCORE_FLINK_CACHE") or Path.home() / ".cache" / "rescore" / "flink")


def flink_home() -> Path:
    return cache_dir() / f"flink-{FLINK_VERSION}"


def job_server_jar() -> Path:
    return cache_dir() / f"beam-flink-job-server-{BEAM_JOB_SERVER_VERSION}" / (
        f"beam-runners-flink-{FLINK_MINOR}-job-server-{BEAM_JOB_SERVER_VERSION}.jar")


def missing_tools() -> str | None:
    """Why this machine cannot run the cluster, or None."""
    for tool in ("java", "mvn"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not on PATH (the local Flink cluster needs Java 17 and Maven)"
    return None


def fetched() -> bool:
    return (flink_home() / ".complete").exists() and job_server_jar().exists()


# ---------------------------------------------------------------------------------------- fetch

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>rescore.local</groupId><artifactId>beam-flink-job-server</artifactId><version>1</version>
  <dependencies>
    <dependency><groupId>org.apache.beam</groupId><artifactId>beam-runners-flink-{minor}</artifactId><version>{beam}</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-simple</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
"""


def _manifest(main: str, class_path: list[str]) -> bytes:
    lines = ["Manifest-Version: 1.0", f"Main-Class: {main}", "Class-Path: " + " ".join(class_path)]
    out = []
    for line in lines:  # manifest lines are at most 72 bytes; continuations start with a space
        data = line.encode()
        out.append(data[:72])
        data = data[72:]
        while data:
            out.append(b" " + data[:71])
            data = data[71:]
    return b"\r\n".join(out) + b"\r\n\r\n"


def fetch_job_server() -> Path:
    jar = job_server_jar()
    if jar.exists():
        return jar
    home = jar.parent
    home.mkdir(parents=True, exist_ok=True)
    (home / "pom.xml").write_text(_POM.format(minor=FLINK_MINOR, beam=BEAM_JOB_SERVER_VERSION))
    subprocess.run(["mvn", "-B", "-q", "dependency:copy-dependencies", "-DoutputDirectory=lib"],
                   cwd=home, check=True)
    libs = sorted(p.name for p in (home / "lib").glob("*.jar"))
    tmp = jar.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", _manifest(JOB_SERVER_MAIN, [f"lib/{n}" for n in libs]))
    tmp.rename(jar)
    return jar


def fetch_flink() -> Path:
    home = flink_home()
    if (home / ".complete").exists():
        return home
    with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        f"apache-flink-libraries=={FLINK_VERSION}", "-d", tmp], check=True)
        (sdist,) = Path(tmp).glob("apache-flink-libraries-*.tar.gz")
        prefix = f"apache-flink-libraries-{FLINK_VERSION}/deps/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and m.name.startswith(prefix)
                       and (m.name.startswith(prefix + "lib/") or m.name.endswith("bash-java-utils.jar"))]
            for m in members:
                m.name = m.name[len(prefix):]
            shutil.rmtree(home, ignore_errors=True)
            tar.extractall(home, members=members, filter="data")
    (home / ".complete").write_text(FLINK_VERSION)
    return home


def fetch() -> None:
    """Fetch what is missing. Holds an flock on the cache while it works, so a second fetch (CI
    fetching in the background while the tests start, two test processes) waits for the first
    and then finds everything in place."""
    import fcntl

    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / ".fetch.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fetch_flink()
        fetch_job_server()


# ---------------------------------------------------------------------------------------- cluster

def _worker_module():
    """tools/flink_sdk_worker.py (this file is loaded by path, not as a package)."""
    spec = importlib.util.spec_from_file_location("flink_sdk_worker", Path(__file__).with_name("flink_sdk_worker.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _classpath(home: Path) -> str:
    return ":".join(str(p) for p in sorted((home / "lib").glob("*.jar")))


def _bash_java_utils(home: Path, conf: Path, what: str) -> tuple[list[str], list[str]]:
    cp = f"{home / 'bin' / 'bash-java-utils.jar'}:{_classpath(home)}"
    out = subprocess.run(["java", "-cp", cp, "org.apache.flink.runtime.util.bash.BashJavaUtils", what,
                          "--configDir", str(conf)], capture_output=True, text=True, check=True).stdout
    results = [ln.split(":", 1)[1] for ln in out.splitlines() if ln.startswith("BASH_JAVA_UTILS_EXEC_RESULT:")]
    return results[0].split(), results[1].split()


class Cluster:
    """A running cluster: its processes (by role), REST address and SDK worker boot program."""

    def __init__(self, workdir: Path, state: dict):
        self.workdir = workdir
        self.state = state

    @property
    def rest(self) -> str:
        return f"http://localhost:{self.state['rest_port']}"

    @property
    def flink_master(self) -> str:
        return f"localhost:{self.state['rest_port']}"

    @property
    def sdk_worker(self) -> str:
        return str(self.workdir / "sdk_worker")

    def pids(self, role: str) -> list[int]:
        return [p["pid"] for p in self.state["processes"] if p["role"] == role]

    def beam_args(self, parallelism: int | None = None) -> list[str]:
        """Beam's flags that run a pipeline on this cluster through Beam's FlinkRunner."""
        return [
            "--runner=FlinkRunner",
            f"--flink_master={self.flink_master}",
            f"--flink_version={FLINK_MINOR}",
            f"--flink_job_server_jar={job_server_jar()}",
            f"--parallelism={parallelism or self.state['slots_total']}",
            "--environment_type=PROCESS",
            "--environment_config=" + json.dumps({"command": self.sdk_worker}, separators=(",", ":")),
        ]

    def start_taskmanager(self) -> int:
        """Start one more TaskManager (as `up` starts each); returns its pid."""
        n = len(self.pids("taskmanager"))
        home = self.workdir / f"taskmanager-{n}"  # its SDK workers' working directory, not the launcher's
        home.mkdir(exist_ok=True)
        pid = _spawn(self.state["taskmanager_command"], self.workdir / "log" / f"taskmanager-{n}.log",
                     dict(os.environ, **self.state["env"]), cwd=home)
        self.state["processes"].append({"role": "taskmanager", "pid": pid})
        (self.workdir / "cluster.json").write_text(json.dumps(self.state, indent=1))
        return pid

    @contextlib.contextmanager
    def private(self, paths: list[str]):
        """While inside, the SDK workers that start cannot see `paths` (flink_sdk_worker.fence),
        as on a cluster without a shared disk. Yields a function: {worker pid: how it was fenced}."""
        fenced = self.workdir / "fenced"
        shutil.rmtree(fenced, ignore_errors=True)
        fenced.mkdir()
        listing = self.workdir / "private-paths"
        listing.write_text("".join(os.path.abspath(p) + "\n" for p in paths))
        try:
            yield lambda: {int(f.name): f.read_text() for f in fenced.iterdir()}
        finally:
            listing.unlink()

    def wait_for_taskmanagers(self, n: int, timeout: float = 120.0) -> None:
        deadline = time.time() + timeout
        while self.running_taskmanagers() < n:
            if time.time() > deadline:
                raise RuntimeError(f"fewer than {n} TaskManagers registered in {timeout:.0f} s; logs in "
                                   f"{self.workdir / 'log'}")
            time.sleep(0.5)

    def get(self, path: str):
        with urllib.request.urlopen(self.rest + path, timeout=10) as r:
            return json.loads(r.read())

    def running_taskmanagers(self) -> int:
        try:
            return len(self.get("/taskmanagers")["taskmanagers"])
        except OSError:
            return -1

    def cpu_seconds(self) -> float:
        """CPU seconds the cluster's processes (JVMs, SDK workers) have used so far, with the
        children they have reaped (Linux /proc)."""
        total = 0.0
        for p in self.state["processes"]:
            try:
                fields = Path(f"/proc/{p['pid']}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime
        return total

    def stop(self) -> dict[str, int]:
        """Stop every process `start` started (with its process group: the SDK workers); returns
        how many of each role were still running."""
        stopped: dict[str, int] = {}
        for p in reversed(self.state["processes"]):
            if _alive(p["pid"]):
                role = {"sdk_zygote": "SDK worker fork server"}.get(p["role"], p["role"].replace("manager", "Manager")
                                                                    .replace("task", "Task").replace("job", "Job"))
                stopped[role] = stopped.get(role, 0) + 1
            try:
                os.killpg(p["pid"], signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.time() + 20
        for p in self.state["processes"]:
            while time.time() < deadline and _alive(p["pid"]):
                time.sleep(0.2)
            if _alive(p["pid"]):
                try:
                    os.killpg(p["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
        return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie child of this process counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _spawn(cmd: list[str], log: Path, env: dict | None = None, cwd: Path | None = None) -> int:
    with open(log, "ab") as f:
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             start_new_session=True, env=env, cwd=cwd)
    return p.pid


REPO = Path(__file__).resolve().parent.parent
CLUSTER_CONF = REPO / "run_configs" / "flink_cluster" / "flink-conf.yaml"
"""The cluster config Rescore ships (restart strategy, region failover): the local cluster's
flink-conf.yaml is its keys, then this machine's (ports, memory, a faster heartbeat)."""


def conf_keys(text: str) -> dict[str, str]:
    """{key: value} of a flink-conf.yaml's text (flat `key: value` lines; comments skipped)."""
    pairs = (ln.partition(":") for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
    return {k.strip(): v.strip() for k, _, v in pairs}


def cluster_conf(local: dict[str, str]) -> str:
    """flink-conf.yaml's text: the shipped keys, each overridden by `local` where it names one."""
    return "".join(f"{k}: {v}\n" for k, v in {**conf_keys(CLUSTER_CONF.read_text()), **local}.items())


def java_opts(conf_text: str, role: str) -> list[str]:
    """The JVM flags a flink-conf.yaml asks for a `role` ("jobmanager", "taskmanager"):
    env.java.opts.all, then env.java.opts.ROLE, as Flink's own start scripts add them."""
    keys = conf_keys(conf_text)
    return [*shlex.split(keys.get("env.java.opts.all", "")), *shlex.split(keys.get(f"env.java.opts.{role}", ""))]


def start(workdir: Path, taskmanagers: int = 2, slots: int = 2, python: str = sys.executable,
          timeout: float = 120.0, env: dict[str, str] | None = None, rest_port: int | None = None,
          parent_first: bool = False) -> Cluster:
    """Start the cluster in `workdir`. env: variables added to the environment of the
    TaskManagers and of the SDK workers' fork server (the tests' fault injection).
    parent_first: Beam's jars (the job server's, less Flink's own and the logging jars) on the
    TaskManagers' class path and loaded parent-first, so Beam's SDK worker cache is one per
    TaskManager and a stage's workers can serve the next stage (with --environment_cache_millis)."""
    home = flink_home()
    if not fetched():
        raise RuntimeError("the Flink jars are not fetched: run `python tools/flink_local.py fetch`")
    workdir.mkdir(parents=True, exist_ok=True)
    conf = workdir / "conf"
    conf.mkdir(exist_ok=True)
    rpc, rest, blob = free_port(), rest_port or free_port(), free_port()
    if rest_port:
        with socket.socket() as probe:
            if probe.connect_ex(("localhost", rest_port)) == 0:
                raise RuntimeError(f"port {rest_port} is in use (another Flink?): pass --rest-port PORT")
    zygote, sock = workdir / "sdk_zygote.py", workdir / "sdk_zygote.sock"
    shutil.copyfile(Path(__file__).with_name("flink_sdk_worker.py"), zygote)
    boot = workdir / "sdk_worker"
    boot.write_text(_worker_module().BOOT.replace("{python}", python).replace("{zygote}", str(zygote)).replace("{socket}", str(sock)))
    boot.chmod(0o755)
    local = {
        "jobmanager.rpc.address": "localhost", "jobmanager.rpc.port": str(rpc), "jobmanager.bind-host": "localhost",
        "jobmanager.memory.process.size": JM_PROCESS_MEMORY,
        "taskmanager.bind-host": "localhost", "taskmanager.host": "localhost",
        "taskmanager.memory.process.size": TM_PROCESS_MEMORY, "taskmanager.memory.managed.size": "64m",
        # a Beam batch job runs its stages pipelined at once: many channels, each wanting buffers
        "taskmanager.memory.network.min": "256m", "taskmanager.memory.network.max": "256m",
        "taskmanager.numberOfTaskSlots": str(slots), "parallelism.default": str(slots * taskmanagers),
        "rest.port": str(rest), "rest.address": "localhost", "rest.bind-address": "localhost",
        "blob.server.port": str(blob), "taskmanager.rpc.port": "0", "taskmanager.data.port": "0",
        # a lost TaskManager is noticed in seconds (one machine: no network to wait for)
        "heartbeat.interval": "2000", "heartbeat.timeout": "8000",
        "io.tmp.dirs": str(workdir / "tmp"),
    }
    if parent_first:
        local["classloader.resolve-order"] = "parent-first"
    conf_text = cluster_conf(local)
    (conf / "flink-conf.yaml").write_text(conf_text)
    (workdir / "tmp").mkdir(exist_ok=True)
    (workdir / "log").mkdir(exist_ok=True)
    extra = dict(env or {}, RESCORE_FLINK_WORKDIR=str(workdir))  # the workers' fence (Cluster.private)
    env = dict(os.environ, **extra, FLINK_CONF_DIR=str(conf))
    cp = _classpath(home)
    log4j = conf / "log4j.properties"
    log4j.write_text("rootLogger.level = INFO\nrootLogger.appenderRef.console.ref = C\n"
                     "appender.console.name = C\nappender.console.type = CONSOLE\n"
                     "appender.console.layout.type = PatternLayout\n"
                     "appender.console.layout.pattern = %d{HH:mm:ss,SSS} %-5p %-60c %x - %m%n\n")
    jvm_common = [f"-Dlog4j.configurationFile=file:{log4j}"]
    # the SDK workers' parent (killed with the cluster: the workers stay in its process group)
    processes = [{"role": "sdk_zygote", "pid": _spawn([python, str(zygote), "--serve", str(sock)],
                                                       workdir / "log" / "sdk_zygote.log", dict(os.environ, **extra))}]
    jm_jvm, jm_dyn = _bash_java_utils(home, conf, "GET_JM_RESOURCE_PARAMS")
    processes.append({"role": "jobmanager", "pid": _spawn(
        ["java", *jm_jvm, *jvm_common, *java_opts(conf_text, "jobmanager"), "-cp", cp,
         "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint",
         "--configDir", str(conf), *jm_dyn], workdir / "log" / "jobmanager.log", env)})
    tm_jvm, tm_dyn = _bash_java_utils(home, conf, "GET_TM_RESOURCE_PARAMS")
    tm_cp = cp
    if parent_first:
        beam = [str(p) for p in sorted((job_server_jar().parent / "lib").glob("*.jar"))
                if not p.name.startswith(("flink-", "slf4j-", "log4j-"))]
        tm_cp = ":".join([cp, *beam])
    tm_cmd = ["java", *tm_jvm, *jvm_common, *java_opts(conf_text, "taskmanager"), "-cp", tm_cp, "org.apache.flink.runtime.taskexecutor.TaskManagerRunner",
              "--configDir", str(conf), *tm_dyn]
    state = {"rest_port": rest, "slots_total": slots * taskmanagers, "taskmanagers": taskmanagers,
             "processes": processes, "taskmanager_command": tm_cmd, "env": {**extra, "FLINK_CONF_DIR": str(conf)}}
    cluster = Cluster(workdir, state)
    for _ in range(taskmanagers):
        cluster.start_taskmanager()
    try:
        cluster.wait_for_taskmanagers(taskmanagers, timeout)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_job_server(cluster: Cluster, workdir: Path, timeout: float = 180.0) -> dict:
    """Beam's Flink job server as a long-lived service beside the cluster (what --job_endpoint
    points at): {"process": Popen, "endpoint": "localhost:PORT"}."""
    port = free_port()
    log = open(workdir / "log" / "job-server.log", "ab")
    process = subprocess.Popen(["java", "-jar", str(job_server_jar()), "--flink-master", cluster.flink_master,
                                "--job-port", str(port), "--artifact-port", "0", "--expansion-port", "0"],
                               stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while time.time() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("localhost", port)) == 0:
                return {"process": process, "endpoint": f"localhost:{port}"}
        if process.poll() is not None:
            break
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"Beam's job server did not listen on {port} in {timeout:.0f} s; log in {workdir / 'log'}")


def load(workdir: Path) -> Cluster:
    return Cluster(workdir, json.loads((workdir / "cluster.json").read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=["fetch", "up", "down", "status"])
    ap.add_argument("--workdir", default=os.environ.get("RESCORE_FLINK_WORKDIR", "/tmp/rescore-flink"),
                    help="where the cluster keeps its config, logs and state (default /tmp/rescore-flink)")
    ap.add_argument("--taskmanagers", type=int, default=2)
    ap.add_argument("--slots", type=int, default=2, help="task slots per TaskManager")
    ap.add_argument("--rest-port", type=int, default=8081,
                    help="the JobManager's REST port, Beam's --flink_master (default 8081, Flink's own default)")
    a = ap.parse_args(argv)
    workdir = Path(a.workdir)
    if a.command == "fetch":
        why = missing_tools()
        if why:
            print(f"flink_local: {why}", file=sys.stderr)
            return 2
        fetch()
        print(f"flink {flink_home()}\njob server {job_server_jar()}")
    elif a.command == "up":
        if (workdir / "cluster.json").exists() and load(workdir).running_taskmanagers() >= 0:
            print(f"flink_local: a cluster is already up in {workdir} ({load(workdir).rest}); "
                  f"stop it with: python {shlex.quote(sys.argv[0])} down", file=sys.stderr)
            return 1
        if not fetched():
            fetch()
        try:
            c = start(workdir, a.taskmanagers, a.slots, rest_port=a.rest_port)
        except RuntimeError as e:
            print(f"flink_local: {e}", file=sys.stderr)
            return 1
        flags = shlex.join(c.beam_args())
        print(f"Flink UI {c.rest}; {a.taskmanagers} TaskManagers with {a.slots} slots each; logs in {workdir / 'log'}")
        print(f"Beam flags (shell-quoted, paste them after a rescore command):\n  {flags}")
        print("One job on it (input and output on this machine, which every TaskManager here shares):\n"
              "  rescore --config run_configs/flink.yaml --input 'data/sample/*.parquet' --output out/flink "
              f"--shared-filesystem {flags}")
        print(f"Stop it with: python {shlex.quote(sys.argv[0])} down")
    elif a.command == "down":
        if not (workdir / "cluster.json").exists():
            print(f"no cluster in {workdir}: nothing to stop")
            return 0
        c = load(workdir)
        stopped = c.stop()
        (workdir / "cluster.json").unlink()
        roles = ", ".join(f"{n} {role}{'s' if n > 1 else ''}" for role, n in stopped.items()) or "nothing (all gone already)"
        print(f"stopped the cluster in {workdir} ({c.rest}): {roles}")
    else:
        if not (workdir / "cluster.json").exists():
            print(f"no cluster in {workdir}")
            return 1
        c = load(workdir)
        print(json.dumps({"taskmanagers": c.running_taskmanagers(), **c.state}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
