"""A fake Hugging Face Hub on 127.0.0.1 that the real huggingface_hub (2.4) talks to as it talks to the Hub.

It speaks the parts of the Hub's protocol clover-local uses:

- ``GET /api/models/{repo}`` and ``/api/models/{repo}/revision/{rev}`` (model info; ``?blobs=true``, which
  ``model_info(files_metadata=True)`` sends, adds sizes, blob ids and LFS sha256),
- ``GET /api/models/{repo}/tree/{rev}[/{path}]`` (``?recursive=true``), no pagination,
- ``POST /api/models/{repo}/paths-info/{rev}`` (form field ``paths``, repeated),
- ``HEAD``/``GET /{repo}/resolve/{rev}/{filename}`` with ``X-Repo-Commit``, ``ETag``, ``X-Linked-Etag`` and
  ``X-Linked-Size`` (LFS files), ``Content-Length``, ``Accept-Ranges: bytes`` and single ``Range`` requests
  (206 with ``Content-Range``; 416 when unsatisfiable).

It never sends ``X-Xet-*`` headers nor ``xetHash`` in listings, so huggingface_hub downloads over plain HTTP
and never through hf_xet. Errors carry the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``, ``GatedRepo``) so huggingface_hub raises its own exception classes.

Knobs for tests, per file (:class:`FileKnobs`, reached through :meth:`HubServer.knobs`): throttle, a transfer
held mid-way until released (``hold_at``: what a test that acts mid-download uses, rather than hoping a throttle
is slow enough), dropped connections, 429 answers with ``Retry-After``, corrupted content. Counters (:meth:`HubServer.bytes_served`,
:attr:`HubServer.requests`) are thread-safe. Files added from disk are served in chunks, never read whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import select
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import BinaryIO
from urllib.parse import parse_qs, unquote, urlsplit

DEFAULT_TOKEN = "hf_fake_test_token"
CHUNK = 1 << 20
LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt", ".pth", ".onnx")
LFS_MIN_SIZE = 10 * 1024 * 1024

_API_RE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?P<rest>/.*)?$")
_RESOLVE_RE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


@dataclass
class FileKnobs:
    """Misbehaviours of one file's ``/resolve`` GETs. Change them at any time; they apply to the next request."""

    throttle_bps: int | None = None
    """Serve the body at about this many bytes per second."""
    hold_at: int | None = None
    """Stop sending when the file's bytes up to this offset are sent, the connection kept open, until this is
    set back to None (or the client goes away, or the server stops): a transfer held mid-way however fast or
    slow the machine is. ``held_streams`` counts the GETs waiting there."""
    drop_after: int | None = None
    """Close the connection after this many body bytes of a GET (the response announced more)."""
    drop_times: int = 1
    """How many GETs are dropped (each drop uses one); 0 stops dropping."""
    fail_429_times: int = 0
    """Answer this many GETs with 429 Too Many Requests first (each answer uses one)."""
    retry_after: int = 0
    """``Retry-After`` seconds sent with the 429 (huggingface_hub waits this plus one second)."""
    corrupt: bool = False
    """Serve the file with one byte flipped (in the middle) while advertising the true sha256 and size."""
    redirect_to: str | None = None
    """Answer ``/resolve`` with a 302 to ``{redirect_to}/{sha256}?signature=...`` (with the Hub's
    ``X-Linked-*`` headers), as the Hub sends LFS files to its CDN: a :class:`cdn_server.CdnServer` there
    serves the bytes and records every request's headers."""
    etag: str | None = None
    """Send this ETag (and ``X-Linked-Etag``) instead of the file's hash: a hostile or broken endpoint."""


@dataclass
class HubFile:
    path: str
    size: int
    sha256: str
    git_oid: str
    """Git blob id: of the content for regular files, of the LFS pointer for LFS files (as on the Hub)."""
    lfs: bool
    pointer_size: int
    data: bytes | None = None
    disk_path: Path | None = None
    knobs: FileKnobs = field(default_factory=FileKnobs)

    def open(self) -> BinaryIO:
        import io

        if self.data is not None:
            return io.BytesIO(self.data)
        assert self.disk_path is not None
        return self.disk_path.open("rb")


@dataclass
class HubRepo:
    repo_id: str
    gated: bool = False
    """Gated: listing and info are public, files need a token (401 ``GatedRepo`` without)."""
    private: bool = False
    """Private: everything needs a token (401 ``RepoNotFound`` without, as the Hub answers)."""
    files: dict[str, HubFile] = field(default_factory=dict)
    commit: str = "0" * 40


@dataclass(frozen=True)
class RequestRecord:
    method: str
    path: str
    range: str | None
    status: int


def _git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _sha256_of(source: bytes | Path) -> str:
    if isinstance(source, bytes):
        return hashlib.sha256(source).hexdigest()
    h = hashlib.sha256()
    with source.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


class HubServer:
    """The fake Hub. ``start()`` serves on 127.0.0.1 on a free port (``url``); ``stop()`` ends it."""

    def __init__(self, tokens: tuple[str, ...] = (DEFAULT_TOKEN,)) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.tokens = set(tokens)
        self.token = tokens[0]
        """A token the server accepts for gated and private repos."""
        self.requests: list[RequestRecord] = []
        self._bytes: Counter[tuple[str, str]] = Counter()
        self._streams_open = 0
        self._held_streams = 0
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None

    # -- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> HubServer:
        handler = type("Handler", (_HubHandler,), {"hub": self})
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-hub", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop listening and cut every open connection (keep-alive ones too): the Hub is gone."""
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
    def url(self) -> str:
        assert self._httpd is not None, "start() the server first"
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- content ---------------------------------------------------------------------------------------

    def add_repo(self, repo_id: str, *, gated: bool = False, private: bool = False) -> HubRepo:
        """Create (or fetch) a repo; ``gated``/``private`` are updated on an existing one."""
        with self._lock:
            repo = self.repos.setdefault(repo_id, HubRepo(repo_id))
            repo.gated, repo.private = gated, private
            self._new_commit(repo)
            return repo

    def add_file(
        self,
        repo_id: str,
        path: str,
        content: bytes | str | Path,
        *,
        lfs: bool | None = None,
        sha256: str | None = None,
    ) -> HubFile:
        """Add or replace a file (bytes, text, or a path on disk served in chunks); makes a new commit.

        ``lfs`` defaults to True for weight files (``.gguf``, ``.safetensors``...) and files of 10 MiB or more.
        ``sha256``: the digest to advertise instead of reading the file for it: for a sparse file of many GB
        (a header-only GGUF, ``clover_local.testing.clover_shaped.write_clover_header``) whose headers are read
        and which is never downloaded whole.
        """
        if isinstance(content, str):
            content = content.encode()
        size = content.stat().st_size if isinstance(content, Path) else len(content)
        sha256 = sha256 or _sha256_of(content)
        if lfs is None:
            lfs = path.endswith(LFS_SUFFIXES) or size >= LFS_MIN_SIZE
        if lfs:
            pointer = (
                f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
            )
            git_oid, pointer_size = _git_blob_oid(pointer), len(pointer)
        else:
            git_oid = _git_blob_oid(content if isinstance(content, bytes) else content.read_bytes())
            pointer_size = 0
        hub_file = HubFile(
            path=path,
            size=size,
            sha256=sha256,
            git_oid=git_oid,
            lfs=lfs,
            pointer_size=pointer_size,
            data=content if isinstance(content, bytes) else None,
            disk_path=content if isinstance(content, Path) else None,
        )
        with self._lock:
            repo = self.repos.get(repo_id) or self.repos.setdefault(repo_id, HubRepo(repo_id))
            repo.files[path] = hub_file
            self._new_commit(repo)
        return hub_file

    def knobs(self, repo_id: str, path: str) -> FileKnobs:
        return self.repos[repo_id].files[path].knobs

    def commit(self, repo_id: str) -> str:
        return self.repos[repo_id].commit

    # -- counters --------------------------------------------------------------------------------------

    def bytes_served(self, repo_id: str, path: str) -> int:
        """Body bytes of this file written to clients so far (GETs of ``/resolve``, dropped ones included)."""
        with self._lock:
            return self._bytes[(repo_id, path)]

    @property
    def streams_open(self) -> int:
        """File bodies being sent right now (a killed client's stream ends at the server's next write)."""
        with self._lock:
            return self._streams_open

    @property
    def held_streams(self) -> int:
        """File bodies waiting at their ``hold_at`` offset right now."""
        with self._lock:
            return self._held_streams

    def reset_counters(self) -> None:
        with self._lock:
            self._bytes.clear()
            self.requests.clear()

    def _count(self, repo_id: str, path: str, n: int) -> None:
        with self._lock:
            self._bytes[(repo_id, path)] += n

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self.requests.append(record)

    def _new_commit(self, repo: HubRepo) -> None:
        state = repo.commit + "".join(f"{p}:{f.git_oid}" for p, f in sorted(repo.files.items()))
        repo.commit = hashlib.sha1(state.encode()).hexdigest()


class _Reply(Exception):
    """An error answer: status, Hub error code, message."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.commit = status, code, message, commit


class _HubHandler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"
    timeout = 30
    _form: dict[str, list[str]] = {}  # noqa: RUF012 (replaced per POST, never mutated)

    def log_message(self, format: str, *args: object) -> None:
        pass

    def setup(self) -> None:
        super().setup()
        with self.hub._lock:
            self.hub._connections.add(self.connection)

    def finish(self) -> None:
        with self.hub._lock:
            self.hub._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def send_response(self, code: int, message: str | None = None) -> None:
        # Recorded before the client can see the answer, so tests read a complete log once a call returns.
        self.hub._record(RequestRecord(self.command, self.path, self.headers.get("Range"), code))
        super().send_response(code, message)

    # -- dispatch --------------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._dispatch(body=True)

    def do_HEAD(self) -> None:
        self._dispatch(body=False)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self._form = parse_qs(self.rfile.read(length).decode())
        self._dispatch(body=True)

    def _dispatch(self, body: bool) -> None:
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        try:
            if m := _API_RE.match(path):
                self._api(m.group("repo"), m.group("rest") or "", query)
            elif m := _RESOLVE_RE.match(path):
                self._resolve(m.group("repo"), m.group("rev"), m.group("path"), body)
            else:
                raise _Reply(404, None, f"Not found: {path}")
        except _Reply as reply:
            self._send_error(reply, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- access ----------------------------------------------------------------------------------------

    def _token_ok(self) -> bool | None:
        """True: a known token; False: a token the Hub does not know; None: no token."""
        auth = self.headers.get("Authorization", "")
        if not auth:
            return None
        return auth.removeprefix("Bearer ").strip() in self.hub.tokens

    def _repo(self, repo_id: str, *, for_files: bool) -> HubRepo:
        token = self._token_ok()
        if token is False:
            raise _Reply(401, None, "Invalid credentials in Authorization header")
        repo = self.hub.repos.get(repo_id)
        if repo is None or (repo.private and not token):
            raise _Reply(404 if repo is None else 401, "RepoNotFound", f"Repository not found: {repo_id}")
        if repo.gated and for_files and not token:
            raise _Reply(
                401,
                "GatedRepo",
                f"Access to model {repo_id} is restricted. You must have access to it and be authenticated "
                "to access it. Please log in.",
                repo.commit,
            )
        return repo

    @staticmethod
    def _check_revision(repo: HubRepo, rev: str) -> None:
        if rev not in ("main", repo.commit):
            raise _Reply(404, "RevisionNotFound", f"Invalid rev id: {rev}")

    # -- /api ------------------------------------------------------------------------------------------

    def _api(self, repo_id: str, rest: str, query: dict[str, list[str]]) -> None:
        repo = self._repo(repo_id, for_files=False)
        if self.command == "POST" and rest.startswith("/paths-info/"):
            self._check_revision(repo, rest.removeprefix("/paths-info/"))
            self._send_json(self._paths_info(repo, self._form.get("paths", [])))
        elif self.command != "GET":
            raise _Reply(405, None, "Method not allowed")
        elif rest == "" or rest.startswith("/revision/"):
            if rest:
                self._check_revision(repo, rest.removeprefix("/revision/"))
            blobs = query.get("blobs", ["false"])[0].lower() == "true"
            self._send_json(self._model_info(repo, blobs))
        elif rest.startswith("/tree/"):
            rev, _, folder = rest.removeprefix("/tree/").partition("/")
            self._check_revision(repo, rev)
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            self._send_json(self._tree(repo, folder.strip("/"), recursive))
        else:
            raise _Reply(404, None, f"Not found: {rest}")

    @staticmethod
    def _model_info(repo: HubRepo, blobs: bool) -> dict[str, object]:
        siblings: list[dict[str, object]] = []
        for path, f in sorted(repo.files.items()):
            sibling: dict[str, object] = {"rfilename": path}
            if blobs:
                sibling |= {"size": f.size, "blobId": f.git_oid}
                if f.lfs:
                    sibling["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": f.pointer_size}
            siblings.append(sibling)
        owner = repo.repo_id.split("/")[0]
        return {
            "_id": repo.commit[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": owner,
            "sha": repo.commit,
            "lastModified": "2026-01-01T00:00:00.000Z",
            "createdAt": "2026-01-01T00:00:00.000Z",
            "private": repo.private,
            "gated": "manual" if repo.gated else False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "library_name": "gguf",
            "tags": ["gguf"],
            "siblings": siblings,
            "usedStorage": sum(f.size for f in repo.files.values()),
        }

    @staticmethod
    def _entry(f: HubFile) -> dict[str, object]:
        entry: dict[str, object] = {"type": "file", "oid": f.git_oid, "size": f.size, "path": f.path}
        if f.lfs:
            entry["lfs"] = {"oid": f.sha256, "size": f.size, "pointerSize": f.pointer_size}
        return entry

    @staticmethod
    def _folder(path: str) -> dict[str, object]:
        return {"type": "directory", "oid": hashlib.sha1(path.encode()).hexdigest(), "size": 0, "path": path}

    @staticmethod
    def _folders(repo: HubRepo) -> set[str]:
        out: set[str] = set()
        for path in repo.files:
            parts = path.split("/")[:-1]
            out.update("/".join(parts[: i + 1]) for i in range(len(parts)))
        return out

    def _tree(self, repo: HubRepo, folder: str, recursive: bool) -> list[dict[str, object]]:
        folders = self._folders(repo)
        if folder and folder not in folders:
            raise _Reply(404, "EntryNotFound", f"{folder} does not exist on main", repo.commit)
        prefix = f"{folder}/" if folder else ""

        def inside(path: str) -> bool:
            return path.startswith(prefix) and (recursive or "/" not in path[len(prefix) :])

        entries = [self._folder(d) for d in sorted(folders) if inside(d)]
        entries += [self._entry(f) for p, f in sorted(repo.files.items()) if inside(p)]
        return entries

    def _paths_info(self, repo: HubRepo, paths: list[str]) -> list[dict[str, object]]:
        folders = self._folders(repo)
        out: list[dict[str, object]] = []
        for path in paths:
            path = path.strip("/")
            if path in repo.files:
                out.append(self._entry(repo.files[path]))
            elif path in folders:
                out.append(self._folder(path))
        return out

    # -- /resolve --------------------------------------------------------------------------------------

    def _resolve(self, repo_id: str, rev: str, path: str, body: bool) -> None:
        repo = self._repo(repo_id, for_files=True)
        self._check_revision(repo, rev)
        f = repo.files.get(path)
        if f is None:
            raise _Reply(404, "EntryNotFound", f"Entry not found: {path}", repo.commit)
        knobs = f.knobs
        if body and self.command == "GET" and self._take_429(knobs):
            self.send_response(429)
            self.send_header("Retry-After", str(knobs.retry_after))
            self._send_text_body(b"Too Many Requests", body)
            return
        etag = knobs.etag or (f.sha256 if f.lfs else f.git_oid)
        if knobs.redirect_to is not None:
            self.send_response(302)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(f.size))
            self.send_header("Location", f"{knobs.redirect_to}/{f.sha256}?signature=fake")
            self._send_text_body(b"Found", body)
            return
        start, end = self._range(f.size, self.headers.get("Range"), repo.commit)
        self.send_response(206 if self.headers.get("Range") else 200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag}"')
        if f.lfs:
            self.send_header("X-Linked-Etag", f'"{etag}"')
            self.send_header("X-Linked-Size", str(f.size))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Type", "application/octet-stream")
        name = path.rsplit("/", 1)[-1]
        self.send_header("Content-Disposition", f"inline; filename*=UTF-8''{name}; filename=\"{name}\"")
        self.send_header("Content-Length", str(max(end - start + 1, 0)))
        if self.headers.get("Range"):
            self.send_header("Content-Range", f"bytes {start}-{end}/{f.size}")
        self.end_headers()
        if body:
            self._stream(repo.repo_id, f, start, end)

    def _take_429(self, knobs: FileKnobs) -> bool:
        with self.hub._lock:
            if knobs.fail_429_times > 0:
                knobs.fail_429_times -= 1
                return True
            return False

    def _drop_point(self, knobs: FileKnobs) -> int | None:
        """Where this GET's body will be cut, while drops are left (a GET that ends before it uses none)."""
        with self.hub._lock:
            return knobs.drop_after if knobs.drop_after is not None and knobs.drop_times > 0 else None

    def _use_drop(self, knobs: FileKnobs) -> None:
        with self.hub._lock:
            knobs.drop_times -= 1

    @staticmethod
    def _range(size: int, header: str | None, commit: str) -> tuple[int, int]:
        """Inclusive byte range asked for; the whole file without a ``Range`` header."""
        if not header:
            return 0, size - 1
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", header.strip())
        if not m or (not m.group(1) and not m.group(2)):
            raise _Reply(416, None, f"Unsupported range {header}", commit)
        if not m.group(1):
            start, end = max(size - int(m.group(2)), 0), size - 1
        else:
            start = int(m.group(1))
            end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
        if start >= size or start > end:
            raise _Reply(416, None, f"Range {header} not satisfiable for {size} bytes", commit)
        return start, end

    def _stream(self, repo_id: str, f: HubFile, start: int, end: int) -> None:
        with self.hub._lock:
            self.hub._streams_open += 1
        try:
            self._stream_body(repo_id, f, start, end)
        finally:
            with self.hub._lock:
                self.hub._streams_open -= 1

    def _stream_body(self, repo_id: str, f: HubFile, start: int, end: int) -> None:
        knobs = f.knobs
        drop_after = self._drop_point(knobs)
        remaining = end - start + 1
        sent = 0
        began = time.monotonic()
        flip_at = f.size // 2 if knobs.corrupt else -1
        with f.open() as src:
            src.seek(start)
            while remaining > 0:
                n = min(CHUNK, remaining)
                if knobs.throttle_bps:
                    n = min(n, max(knobs.throttle_bps // 20, 1))
                hold_at = knobs.hold_at
                if hold_at is not None and start + sent >= hold_at:
                    if not self._wait_while_held(knobs, start + sent):
                        self.close_connection = True
                        return
                    continue
                if hold_at is not None:
                    n = min(n, hold_at - (start + sent))
                if drop_after is not None:
                    n = min(n, drop_after - sent)
                    if n <= 0:
                        self._use_drop(knobs)
                        self.close_connection = True
                        self.wfile.flush()
                        return
                chunk = src.read(n)
                if not chunk:
                    break
                offset = start + sent
                if offset <= flip_at < offset + len(chunk):
                    i = flip_at - offset
                    chunk = chunk[:i] + bytes([chunk[i] ^ 0xFF]) + chunk[i + 1 :]
                self.hub._count(repo_id, f.path, len(chunk))  # before the client can have it
                self.wfile.write(chunk)
                sent += len(chunk)
                remaining -= len(chunk)
                if knobs.throttle_bps:
                    ahead = sent / knobs.throttle_bps - (time.monotonic() - began)
                    if ahead > 0:
                        time.sleep(ahead)

    def _wait_while_held(self, knobs: FileKnobs, offset: int) -> bool:
        """Wait at ``offset`` while ``knobs.hold_at`` holds it; False when the client or the server went away."""
        self.wfile.flush()
        with self.hub._lock:
            self.hub._held_streams += 1
        try:
            while knobs.hold_at is not None and knobs.hold_at <= offset:
                readable, _, _ = select.select([self.connection], [], [], 0.02)
                if readable:  # mid-response a client sends nothing: readable means closed (or cut by stop())
                    try:
                        if not self.connection.recv(1, socket.MSG_PEEK):
                            return False
                    except OSError:
                        return False
            return True
        finally:
            with self.hub._lock:
                self.hub._held_streams -= 1

    # -- replies ---------------------------------------------------------------------------------------

    def _send_json(self, payload: object) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_text_body(self, data: bytes, body: bool) -> None:
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _send_error(self, reply: _Reply, body: bool) -> None:
        self.send_response(reply.status)
        if reply.code:
            self.send_header("X-Error-Code", reply.code)
        self.send_header("X-Error-Message", reply.message)
        if reply.commit:
            self.send_header("X-Repo-Commit", reply.commit)
        data = json.dumps({"error": reply.message}).encode()
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)
