"""Beam SDK workers for a local Flink cluster's --environment_type=PROCESS (tools/flink_local.py
copies this file to WORKDIR/sdk_zygote.py and starts it): forked from one process that has
imported Beam, torch and Rescore once (`sdk_worker`, the command each TaskManager runs, asks it
for a worker; Python's own forkserver does the same for multiprocessing). A worker does what the
SDK container's boot does: asks the runner's provision service for the pipeline options, then
runs Beam's sdk_worker_main. `--direct ARGS` boots one worker in this process (the fallback).

A cluster without a shared disk: while WORKDIR/private-paths lists paths (one a line;
`Cluster.private` in flink_local.py writes it around one job), each worker that starts hides
them from itself before it boots, as a TaskManager on another machine never sees the
launcher's disk: a mount namespace with an empty read-only tmpfs over each path (root, or an
unprivileged user namespace where the kernel allows one), so no read or write reaches them,
Python's or Arrow's C++; where neither is allowed, a Python audit hook that refuses opening,
listing, creating, renaming or removing anything under them. The worker records how in
WORKDIR/fenced/PID. Nothing here imports Rescore.
"""

import array, importlib, json, os, select, shutil, signal, socket, struct, sys, tempfile, traceback

PRELOAD = ("grpc", "google.protobuf.json_format", "apache_beam.runners.worker.sdk_worker_main", "torch",
           "rescore.transforms.read", "rescore.transforms.score", "rescore.transforms.write",
           "rescore.transforms.finalize")


CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
MS_RDONLY, MS_REC, MS_PRIVATE = 0x1, 0x4000, 0x40000
GUARDED = ("open", "os.listdir", "os.scandir", "glob.glob", "os.mkdir", "os.remove", "os.rename", "os.rmdir",
           "os.chdir", "shutil.rmtree", "os.truncate")


def _mounts_hidden(paths):
    """An own mount namespace with an empty read-only tmpfs over each path."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    user = os.geteuid() != 0

    def check(result, what):
        if result != 0:
            raise OSError(ctypes.get_errno(), f"{what}: {os.strerror(ctypes.get_errno())}")

    check(libc.unshare(CLONE_NEWNS | (CLONE_NEWUSER if user else 0)), "unshare")
    if user:  # keep this worker's own uid and gid inside the new user namespace
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    check(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    for path in paths:
        check(libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_RDONLY, b"size=4k"), f"mount tmpfs on {path}")
    return "mount namespace"


def _audit_hidden(paths):
    """A Python audit hook: PermissionError for any file work under the paths."""
    roots = tuple(os.path.join(os.path.abspath(p), "") for p in paths)

    def hook(event, args):
        if event not in GUARDED:
            return
        for arg in args[:2] if event == "os.rename" else args[:1]:
            if isinstance(arg, (str, bytes, os.PathLike)):
                path = os.path.join(os.path.abspath(os.fsdecode(arg)), "")
                if path.startswith(roots):
                    raise PermissionError(13, "the launcher's disk is not this worker's", os.fsdecode(arg))

    sys.addaudithook(hook)
    return "audit hook"


def fence():
    """Hide WORKDIR/private-paths' paths from this worker (see the module's docstring)."""
    workdir = os.environ.get("RESCORE_FLINK_WORKDIR")
    if not workdir:
        return
    try:
        with open(os.path.join(workdir, "private-paths")) as f:
            paths = [p for p in f.read().splitlines() if p]
    except OSError:
        return
    try:
        how = _mounts_hidden(paths)
    except OSError as e:
        print(f"sdk_zygote: no mount namespace ({e}); hiding {paths} with an audit hook", file=sys.stderr, flush=True)
        how = _audit_hidden(paths)
    with open(os.path.join(workdir, "fenced", str(os.getpid())), "w") as f:
        f.write(how)


def boot(argv):
    fence()
    import argparse
    import grpc
    from google.protobuf import json_format, text_format
    from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc, endpoints_pb2

    ap = argparse.ArgumentParser()
    for name in ("id", "provision_endpoint", "control_endpoint", "logging_endpoint", "artifact_endpoint",
                 "semi_persist_dir"):
        ap.add_argument("--" + name, default="")
    a, _ = ap.parse_known_args(argv)
    with grpc.insecure_channel(a.provision_endpoint) as channel:
        info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", a.id)]).info

    def descriptor(url):
        return text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url))

    os.environ["WORKER_ID"] = a.id
    os.environ["PIPELINE_OPTIONS"] = json_format.MessageToJson(info.pipeline_options)
    os.environ["CONTROL_API_SERVICE_DESCRIPTOR"] = descriptor(info.control_endpoint.url or a.control_endpoint)
    os.environ["LOGGING_API_SERVICE_DESCRIPTOR"] = descriptor(info.logging_endpoint.url or a.logging_endpoint)
    os.environ["RUNNER_CAPABILITIES"] = " ".join(info.runner_capabilities)
    own = None if a.semi_persist_dir else tempfile.mkdtemp(prefix="beam-worker-")  # removed when the worker ends
    os.environ["SEMI_PERSISTENT_DIRECTORY"] = a.semi_persist_dir or own
    from apache_beam.runners.worker import sdk_worker_main
    try:
        sdk_worker_main.main(sys.argv[:1])
    finally:
        if own:
            try:
                shutil.rmtree(own, ignore_errors=True)
            except Exception:  # a fence's audit hook may refuse it: the folder is then left, as before
                pass


def _worker(request, fds):
    for i, fd in enumerate(fds):  # the TaskManager's pipes for the command it started
        os.dup2(fd, i)
    for fd in fds:
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    sys.argv = request["argv"]
    code = 0
    try:
        boot(request["argv"][1:])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _supervise(conn):
    # the request: 4-byte length (with the client's stdin, stdout, stderr attached), then JSON
    fds = array.array("i")
    head, ancillary, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    (size,) = struct.unpack("!I", head)
    payload = b""
    while len(payload) < size:
        chunk = conn.recv(size - len(payload))
        if not chunk:
            os._exit(1)
        payload += chunk
    request = json.loads(payload)
    pid = os.fork()
    if pid == 0:
        conn.close()
        _worker(request, list(fds))
    for fd in fds:
        os.close(fd)
    while True:  # the client's exit is the worker's: a client killed (EOF) takes its worker along
        readable, _, _ = select.select([conn], [], [], 0.2)
        if readable and not conn.recv(1):
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os._exit(0)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            conn.sendall(struct.pack("!i", os.waitstatus_to_exitcode(status)))
            os._exit(0)


def serve(path):
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError as e:
            print(f"sdk_zygote: not preloaded: {name} ({e})", file=sys.stderr, flush=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    if os.path.exists(path):
        os.unlink(path)
    server.bind(path + ".tmp")
    server.listen(64)
    os.rename(path + ".tmp", path)  # clients find it only once the imports are done
    server.settimeout(1.0)
    print(f"sdk_zygote: serving on {path}", file=sys.stderr, flush=True)
    while True:
        try:  # reap finished supervisors (so their CPU time counts in this process's children's)
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        if os.fork() == 0:
            server.close()
            try:
                _supervise(conn)
            finally:
                os._exit(1)
        conn.close()


BOOT = """#!{python} -S
# Beam SDK worker for --environment_type=PROCESS: asks sdk_zygote.py (SOCKET) for one, forked from
# a process that has imported Beam, torch and Rescore already, and exits with its exit status;
# killed, it takes the worker along. Where the zygote is not up, it boots the worker itself.
# It dies with the TaskManager that started it (it watches its parent process), as a worker in
# the TaskManager's container does: a TaskManager killed with kill -9 leaves no worker behind
# that could go on writing a file the restarted task writes again.
import array, json, os, select, socket, struct, sys

parent = os.getppid()
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect("{socket}")
except OSError:
    os.execv("{python}", ["{python}", "{zygote}", "--direct", *sys.argv[1:]])
payload = json.dumps({"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}).encode()
s.sendmsg([struct.pack("!I", len(payload))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
s.sendall(payload)
code = b""
while len(code) < 4:
    if not select.select([s], [], [], 0.2)[0]:
        if os.getppid() != parent:  # the TaskManager is gone: so is its worker (our EOF)
            sys.exit(1)
        continue
    chunk = s.recv(4 - len(code))
    if not chunk:
        sys.exit(1)
    code += chunk
sys.exit(struct.unpack("!i", code)[0])
"""
"""The program `sdk_worker` (flink_local.py fills in {python}, {zygote}, {socket}): what each
TaskManager runs for a worker."""

if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:  # --direct ARGS...
        sys.argv = [sys.argv[0], *sys.argv[2:]]
        boot(sys.argv[1:])
