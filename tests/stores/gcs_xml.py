"""What delta-rs and Beam ask of Google Cloud Storage that fake-gcs-server answers wrongly.

delta-rs reaches GCS through the Rust `object_store` crate, which writes with the XML API:
`PUT /BUCKET/OBJECT` (with `x-goog-if-generation-match: 0` for "create, never replace") and
`PUT /BUCKET/OBJECT` with `x-goog-copy-source` (the copy-if-not-exists that makes a Delta
commit atomic). fake-gcs-server, the emulator the tests use, serves the XML API's reads, lists
and deletes but answers those two PUTs 400 (it takes only the JSON API's uploads). This proxy
sits in front of it and turns each into the JSON-API request that means the same:

    PUT  /B/O                      -> POST /upload/storage/v1/b/B/o?uploadType=multipart
    PUT  /B/O + x-goog-copy-source -> GET the source, then the same upload
    x-goog-if-generation-match: N  -> &ifGenerationMatch=N  (checked by fake-gcs-server,
                                      under its lock: the one winner of a race is the server's)
    POST /batch/storage/v1            each request of the batch made on its own (fake-gcs-server
                                      skips parts without a Content-ID, which google-cloud-storage
                                      3.x leaves out: Beam's deletes and renames)
    GET  /B?list-type=2&start-after=K  the listing without the keys up to K (fake-gcs-server
                                      ignores start-after; delta-rs lists the log after the
                                      version it read, and would see that version again)

and answers with the XML API's headers (ETag, x-goog-generation). Everything else passes
through unchanged. Real GCS needs none of this: object_store speaks to it directly.
"""

from __future__ import annotations

import http.client
import json
import os
import uuid
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlsplit

HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream: tuple[str, int] = ("127.0.0.1", 0)

    def log_message(self, *args):  # quiet
        pass

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, headers: dict, body: bytes) -> None:
        self.send_response(status)
        for k, v in headers.items():
            if k.lower() not in HOP:
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _upstream(self, method: str, path: str, body: bytes = b"", headers: dict | None = None):
        conn = http.client.HTTPConnection(*self.upstream, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            conn.close()

    def _forward(self) -> None:
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        status, rh, body = self._upstream(self.command, self.path, self._body(), headers)
        self._send(status, rh, body)

    do_HEAD = do_DELETE = _forward

    def do_POST(self) -> None:
        if urlsplit(self.path).path != "/batch/storage/v1":
            return self._forward()
        boundary = self.headers.get_param("boundary")
        body = self._body().replace(b"\r\n", b"\n")
        out = []
        for n, part in enumerate(body.split(b"--" + boundary.encode())[1:-1], 1):
            _, _, request = part.lstrip(b"\n").partition(b"\n\n")  # the part's own headers, then the request
            head, _, payload = request.partition(b"\n\n")
            line, *lines = head.decode().split("\n")
            method, url, _ = line.split(" ", 2)
            headers = dict(h.split(": ", 1) for h in lines if ": " in h)
            target = urlsplit(url)
            status, rh, rbody = self._upstream(method, target.path + (f"?{target.query}" if target.query else ""),
                                               payload.rstrip(b"\n"), {k: v for k, v in headers.items() if k.lower() not in HOP})
            reason = http.client.responses.get(status, "")
            out.append(f"--{boundary}\r\nContent-Type: application/http\r\nContent-ID: <response-{n}>\r\n\r\n"
                       f"HTTP/1.1 {status} {reason}\r\nContent-Type: {rh.get('Content-Type', 'application/json')}\r\n"
                       f"Content-Length: {len(rbody)}\r\n\r\n".encode() + rbody + b"\r\n")
        out.append(f"--{boundary}--\r\n".encode())
        self._send(200, {"Content-Type": f"multipart/mixed; boundary={boundary}"}, b"".join(out))

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        after = parse_qs(url.query).get("start-after")
        if not after or "list-type=2" not in url.query:
            return self._forward()
        status, rh, body = self._upstream("GET", self.path)
        if status == 200:
            body = _listed_after(body, after[0])
        self._send(status, rh, body)

    def do_PUT(self) -> None:
        url = urlsplit(self.path)
        if url.query or url.path.startswith(("/upload/", "/storage/", "/_internal/")):
            return self._forward()
        bucket, _, name = url.path.lstrip("/").partition("/")
        bucket = unquote(bucket)  # object_store escapes every character but letters and digits
        body = self._body()
        source = self.headers.get("x-goog-copy-source")
        if source:
            src = unquote(source).lstrip("/")
            sb, _, so = src.partition("/")
            status, rh, body = self._upstream("GET", f"/storage/v1/b/{quote(sb, safe='')}/o/{quote(so, safe='')}?alt=media")
            if status != 200:
                return self._send(status, rh, body)
        query = "uploadType=multipart"  # (fake-gcs-server checks preconditions on multipart uploads)
        match = self.headers.get("x-goog-if-generation-match")
        if match is not None:
            query += f"&ifGenerationMatch={int(match)}"
        content_type = self.headers.get("Content-Type") or "application/octet-stream"
        meta = json.dumps({"name": unquote(name), "contentType": content_type}).encode()
        boundary = uuid.uuid4().hex
        related = b"".join([
            f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(), meta,
            f"\r\n--{boundary}\r\nContent-Type: {content_type}\r\n\r\n".encode(), body,
            f"\r\n--{boundary}--\r\n".encode(),
        ])
        status, rh, out = self._upstream("POST", f"/upload/storage/v1/b/{quote(bucket, safe='')}/o?{query}", related,
                                         {"Content-Type": f"multipart/related; boundary={boundary}"})
        if status != 200:
            return self._send(status, {"Content-Type": rh.get("Content-Type", "application/json")}, out)
        doc = json.loads(out)
        self._send(200, {"ETag": f'"{doc.get("etag", "")}"', "x-goog-generation": str(doc.get("generation", "")),
                         "Content-Type": "application/xml"}, b"")


def _listed_after(body: bytes, after: str) -> bytes:
    """A ListBucketResult without the keys up to `after` (fake-gcs-server ignores start-after)."""
    root = ET.fromstring(body)
    ns = root.tag[: root.tag.index("}") + 1] if root.tag.startswith("{") else ""
    ET.register_namespace("", ns.strip("{}"))
    for c in list(root.findall(f"{ns}Contents")):
        if c.findtext(f"{ns}Key", "") <= after:
            root.remove(c)
    count = root.find(f"{ns}KeyCount")
    if count is not None:
        count.text = str(len(root.findall(f"{ns}Contents")))
    return ET.tostring(root, xml_declaration=True, encoding="utf-8")


class XmlWrites:
    """The proxy in a process of its own (delta-rs holds the GIL while it waits for an answer, so
    a proxy thread in the test's process would never answer it), listening on 127.0.0.1; `url`
    is its base URL. It dies with the process that started it."""

    def __init__(self, upstream_port: int):
        import subprocess
        import sys

        from servers import _die_with_parent

        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(upstream_port)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            raise RuntimeError(f"the GCS XML proxy did not start (exit {self.proc.poll()})")
        self.url = line

    def __enter__(self) -> "XmlWrites":
        return self

    def __exit__(self, *exc) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


def main(upstream_port: int) -> None:
    handler = type("Handler", (_Handler,), {"upstream": ("127.0.0.1", upstream_port)})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    import sys

    main(int(sys.argv[1]))
