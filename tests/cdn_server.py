"""A stand-in CDN on 127.0.0.1: what the Hub redirects LFS downloads to (``FileKnobs.redirect_to``).

It serves the files of a :class:`hub_server.HubServer` by sha256 (``GET``/``HEAD /{sha256}``, single ``Range``
requests) and records the headers of every request it gets, so a test can say that no ``Authorization``
reached a host other than the Hub endpoint (a CDN, or wherever a mirror points).
"""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from hub_server import HubFile, HubServer


class CdnServer:
    """``start()`` serves on a free port (``url``); ``headers_seen`` holds each request's headers (lowercased names)."""

    def __init__(self, hub: HubServer) -> None:
        self.hub = hub
        self.headers_seen: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None

    def start(self) -> CdnServer:
        handler = type("Handler", (_CdnHandler,), {"cdn": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="fake-cdn", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    @property
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def file(self, sha256: str) -> HubFile | None:
        for repo in self.hub.repos.values():
            for f in repo.files.values():
                if f.sha256 == sha256:
                    return f
        return None

    def _record(self, headers: dict[str, str]) -> None:
        with self._lock:
            self.headers_seen.append(headers)


class _CdnHandler(BaseHTTPRequestHandler):
    cdn: CdnServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        self.cdn._record({k.lower(): v for k, v in self.headers.items()})
        f = self.cdn.file(urlsplit(self.path).path.strip("/"))
        if f is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with f.open() as src:
            data = src.read()
        start, end = 0, len(data) - 1
        m = re.fullmatch(r"bytes=(\d+)-(\d*)", (self.headers.get("Range") or "").strip())
        if m:
            start = int(m.group(1))
            end = min(int(m.group(2)), end) if m.group(2) else end
        self.send_response(206 if m else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", f'"{f.sha256}"')
        self.send_header("Content-Length", str(end - start + 1))
        if m:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(data[start : end + 1])
