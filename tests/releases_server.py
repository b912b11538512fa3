"""A stand-in for GitHub on 127.0.0.1: llama.cpp's releases API, release assets and raw source files, as
clover-local's runtime installer talks to them (modelled on ``tests/hub_server.py``).

- ``GET /repos/ggml-org/llama.cpp/releases/latest`` and ``/releases/tags/<tag>``: GitHub's release JSON
  (``tag_name``, ``assets[{name, size, digest, browser_download_url}]``, ``tarball_url``);
- ``GET /download/<tag>/<name>``: an asset's bytes, with ``Accept-Ranges`` and single ``Range`` requests (206,
  ``Content-Range``; 416 past the end); ``/tarball/<tag>``: the source tarball (no digest, as on GitHub);
- ``GET /raw/<tag>/<path>``: a source file of a tag (``CLOVER_LLAMACPP_RAW`` = :attr:`ReleasesServer.raw_url`).

A test serves a release with :meth:`ReleasesServer.add_release` and :meth:`ReleasesServer.add_asset` (bytes or
a file on disk, served in chunks), :meth:`add_raw` and :meth:`set_tarball`, then points the environment at
:attr:`api_url` and :attr:`raw_url`. Faults, per asset (:class:`AssetKnobs`): a digest that does not match,
no digest, a transfer held mid-way until released (``hold_at``: a child is killed while it waits there), a
connection dropped after N bytes, a redirect to another host (``localhost`` instead of ``127.0.0.1``: a token
must not follow it). For the API: ``rate_limited`` answers 403 with ``X-RateLimit-Remaining: 0`` as GitHub does.
Every request is recorded (:attr:`requests`, with its ``Authorization`` header).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import re
import select
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

CHUNK = 256 * 1024
REPO_PATH = "/repos/ggml-org/llama.cpp"
_RELEASE_RE = re.compile(rf"^{REPO_PATH}/releases/(?:latest|tags/(?P<tag>[^/]+))$")


@dataclass
class AssetKnobs:
    """Misbehaviours of one file's downloads; change them at any time, they apply to the next request."""

    wrong_digest: bool = False
    """Advertise a digest that is not the file's sha256 (the bytes are the true ones)."""
    no_digest: bool = False
    """Publish no ``digest`` for this asset."""
    hold_at: int | None = None
    """Stop sending at this offset, the connection kept open, until set back to None (or the client goes)."""
    drop_after: int | None = None
    """Close the connection after this many body bytes of one GET (once)."""
    redirect_host: str | None = None
    """Answer with a 302 to the same path on this host (``localhost``): another origin than the API's."""


@dataclass
class FakeFile:
    name: str
    size: int
    sha256: str
    data: bytes | None = None
    disk_path: Path | None = None
    knobs: AssetKnobs = field(default_factory=AssetKnobs)

    def open(self) -> BinaryIO:
        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.disk_path is not None
        return self.disk_path.open("rb")


@dataclass
class FakeRelease:
    tag: str
    assets: dict[str, FakeFile] = field(default_factory=dict)
    tarball: FakeFile | None = None
    raw: dict[str, bytes] = field(default_factory=dict)


@dataclass(frozen=True)
class RequestRecord:
    method: str
    host: str
    path: str
    range: str | None
    authorization: str | None
    status: int


def _file(name: str, content: bytes | Path) -> FakeFile:
    if isinstance(content, bytes):
        return FakeFile(name, len(content), hashlib.sha256(content).hexdigest(), data=content)
    h = hashlib.sha256()
    with content.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return FakeFile(name, content.stat().st_size, h.hexdigest(), disk_path=content)


class ReleasesServer:
    """The stand-in. ``start()`` serves on 127.0.0.1 on a free port; ``stop()`` ends it (and cuts connections)."""

    def __init__(self) -> None:
        self.releases: dict[str, FakeRelease] = {}
        self.latest: str | None = None
        self.rate_limited = False
        self.requests: list[RequestRecord] = []
        self._lock = threading.Lock()
        self._held = 0
        self._httpd: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> ReleasesServer:
        handler = type("Handler", (_Handler,), {"server_state": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, name="fake-github", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for conn in connections:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    @property
    def port(self) -> int:
        assert self._httpd is not None, "start() the server first"
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """``CLOVER_LLAMACPP_RELEASES``."""
        return self.url + REPO_PATH

    @property
    def raw_url(self) -> str:
        """``CLOVER_LLAMACPP_RAW``."""
        return self.url + "/raw"

    # -- content ---------------------------------------------------------------------------------------

    def add_release(self, tag: str, *, latest: bool = True) -> FakeRelease:
        with self._lock:
            release = self.releases.setdefault(tag, FakeRelease(tag))
            if latest:
                self.latest = tag
            return release

    def add_asset(self, tag: str, name: str, content: bytes | Path) -> FakeFile:
        """Attach a file (bytes, or a file on disk served in chunks) to release ``tag``."""
        f = _file(name, content)
        with self._lock:
            self.releases[tag].assets[name] = f
        return f

    def add_raw(self, tag: str, path: str, content: bytes | str) -> None:
        """A source file of ``tag`` (``src/llama-arch.cpp``), served at ``/raw/<tag>/<path>``."""
        data = content.encode() if isinstance(content, str) else content
        with self._lock:
            self.releases[tag].raw[path] = data

    def set_tarball(self, tag: str, content: bytes | Path) -> FakeFile:
        f = _file(f"{tag}.tar.gz", content)
        with self._lock:
            self.releases[tag].tarball = f
        return f

    def knobs(self, tag: str, name: str) -> AssetKnobs:
        return self.releases[tag].assets[name].knobs

    # -- observation -----------------------------------------------------------------------------------

    @property
    def held_streams(self) -> int:
        with self._lock:
            return self._held

    def paths(self) -> list[str]:
        """The path of every request so far, in order (what a test asserts was asked, or that nothing was)."""
        with self._lock:
            return [r.path for r in self.requests]

    def downloads(self, name: str) -> list[RequestRecord]:
        """The GETs of one asset (its name ends the path), redirects included."""
        with self._lock:
            return [r for r in self.requests if r.path.rsplit("/", 1)[-1] == name]

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append(record)

    # -- the JSON --------------------------------------------------------------------------------------

    def release_json(self, release: FakeRelease, host: str) -> dict[str, object]:
        base = f"http://{host}"
        assets = []
        for f in release.assets.values():
            entry: dict[str, object] = {
                "name": f.name,
                "size": f.size,
                "browser_download_url": f"{base}/download/{release.tag}/{f.name}",
                "content_type": "application/octet-stream",
            }
            if not f.knobs.no_digest:
                digest = f.sha256 if not f.knobs.wrong_digest else hashlib.sha256(b"not it").hexdigest()
                entry["digest"] = f"sha256:{digest}"
            assets.append(entry)
        return {
            "tag_name": release.tag,
            "name": release.tag,
            "published_at": "2026-11-30T12:00:00Z",
            "assets": assets,
            "tarball_url": f"{base}{REPO_PATH}/tarball/{release.tag}",
        }


class _Handler(BaseHTTPRequestHandler):
    server_state: ReleasesServer
    protocol_version = "HTTP/1.1"
    timeout = 30

    def log_message(self, format: str, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.server_state._lock:
            self.server_state._connections.add(self.connection)

    def finish(self) -> None:
        with self.server_state._lock:
            self.server_state._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def send_response(self, code: int, message: str | None = None) -> None:
        self.server_state._record(
            RequestRecord(
                self.command,
                self.headers.get("Host", ""),
                urlsplit(self.path).path,
                self.headers.get("Range"),
                self.headers.get("Authorization"),
                code,
            )
        )
        super().send_response(code, message)

    def do_GET(self) -> None:
        state = self.server_state
        path = unquote(urlsplit(self.path).path)
        host = self.headers.get("Host", f"127.0.0.1:{state.port}")
        try:
            if m := _RELEASE_RE.match(path):
                if state.rate_limited:
                    self._send_json(
                        403,
                        {"message": "API rate limit exceeded for 127.0.0.1."},
                        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str(int(time.time()) + 600)},
                    )
                    return
                tag = m.group("tag") or state.latest
                release = state.releases.get(tag or "")
                if release is None:
                    self._send_json(404, {"message": "Not Found"})
                    return
                self._send_json(200, state.release_json(release, host))
            elif m := re.match(r"^/download/(?P<tag>[^/]+)/(?P<name>[^/]+)$", path):
                release = state.releases.get(m.group("tag"))
                f = release.assets.get(m.group("name")) if release else None
                self._serve_file(f, path)
            elif m := re.match(rf"^{REPO_PATH}/tarball/(?P<tag>[^/]+)$", path):
                release = state.releases.get(m.group("tag"))
                self._serve_file(release.tarball if release else None, path)
            elif m := re.match(r"^/raw/(?P<tag>[^/]+)/(?P<rest>.+)$", path):
                release = state.releases.get(m.group("tag"))
                data = release.raw.get(m.group("rest")) if release else None
                if data is None:
                    self._send_text(404, b"404: Not Found")
                else:
                    self._send_text(200, data)
            else:
                self._send_text(404, b"Not Found")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- files -----------------------------------------------------------------------------------------

    def _serve_file(self, f: FakeFile | None, path: str) -> None:
        if f is None:
            self._send_text(404, b"Not Found")
            return
        knobs = f.knobs
        if knobs.redirect_host and not self.headers.get("Host", "").startswith(knobs.redirect_host):
            self.send_response(302)
            self.send_header("Location", f"http://{knobs.redirect_host}:{self.server_state.port}{path}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end = 0, f.size - 1
        asked = self.headers.get("Range")
        if asked:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", asked.strip())
            if not m or int(m.group(1)) >= f.size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{f.size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            start = int(m.group(1))
            end = min(int(m.group(2)), f.size - 1) if m.group(2) else f.size - 1
        self.send_response(206 if asked else 200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        if asked:
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        self._stream(f, start, end)

    def _stream(self, f: FakeFile, start: int, end: int) -> None:
        knobs = f.knobs
        drop_after, knobs.drop_after = knobs.drop_after, None
        sent = 0
        with f.open() as src:
            src.seek(start)
            remaining = end - start + 1
            while remaining > 0:
                if knobs.hold_at is not None and start + sent >= knobs.hold_at:
                    if not self._wait_while_held(knobs, start + sent):
                        self.close_connection = True
                        return
                    continue
                n = min(CHUNK, remaining)
                if knobs.hold_at is not None:
                    n = min(n, knobs.hold_at - (start + sent))
                if drop_after is not None:
                    n = min(n, drop_after - sent)
                    if n <= 0:
                        self.wfile.flush()
                        self.close_connection = True
                        with contextlib.suppress(OSError):
                            self.connection.shutdown(socket.SHUT_RDWR)
                        return
                chunk = src.read(n)
                if not chunk:
                    break
                self.wfile.write(chunk)
                sent += len(chunk)
                remaining -= len(chunk)

    def _wait_while_held(self, knobs: AssetKnobs, offset: int) -> bool:
        self.wfile.flush()
        state = self.server_state
        with state._lock:
            state._held += 1
        try:
            while knobs.hold_at is not None and knobs.hold_at <= offset:
                readable, _, _ = select.select([self.connection], [], [], 0.02)
                if readable:
                    try:
                        if not self.connection.recv(1, socket.MSG_PEEK):
                            return False
                    except OSError:
                        return False
            return True
        finally:
            with state._lock:
                state._held -= 1

    # -- replies ---------------------------------------------------------------------------------------

    def _send_json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_text(self, status: int, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
