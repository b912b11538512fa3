#!/usr/bin/env python3
"""Probe a running `clover-local serve` with hostile requests (issue 27), on both engines.

For each engine it starts `clover-local serve --model MODEL --engine ENGINE --api-key-file KEYFILE` on a free
loopback port, sends each hostile case, and after each one checks that `/health` still answers within a
second. A case "held" when the server gave the expected named refusal (or bounded answer) and stayed healthy;
"failed" otherwise. It prints one line per case and a summary table (markdown) for docs/reliability.md.

    python scripts/probe_hostile.py --model PATH.gguf [--engines embedded,llama-server]

Loopback only; nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

KEY = "probe-key-" + os.urandom(6).hex()
Result = tuple[int, dict[str, Any]]
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@dataclass
class Server:
    host: str
    port: int
    proc: subprocess.Popen[bytes]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request(
    s: Server,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str | None = None,
    timeout: float = 120.0,
) -> Result:
    conn = http.client.HTTPConnection(s.host, s.port, timeout=timeout)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        conn.putheader("Host", host or f"127.0.0.1:{s.port}")
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        if body is not None:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        resp = conn.getresponse()
        raw = resp.read()
        try:
            return resp.status, json.loads(raw or b"null") or {}
        except ValueError:
            return resp.status, {"raw": raw[:200].decode(errors="replace")}
    finally:
        conn.close()


def code_of(body: dict[str, Any]) -> str:
    err = body.get("error")
    return str(err.get("code") or err.get("type")) if isinstance(err, dict) else ""


def health_s(s: Server) -> float | None:
    """Seconds /health took (with the key), None when it did not answer 200 within one second."""
    t0 = time.perf_counter()
    try:
        status, _ = request(s, "GET", "/health", headers=AUTH, timeout=1.0)
    except (OSError, http.client.HTTPException):
        return None
    took = time.perf_counter() - t0
    return took if status == 200 and took <= 1.0 else None


def post(
    s: Server, payload: object, headers: dict[str, str] | None = None, host: str | None = None
) -> Result:
    return request(s, "POST", "/v1/chat/completions", json.dumps(payload).encode(), headers, host)


def expect(status: int, code: str) -> Callable[[Result], tuple[bool, str]]:
    def check(result: Result) -> tuple[bool, str]:
        got, body = result
        return got == status and code_of(body) == code, f"{got} {code_of(body)}"

    return check


def _raw_socket(s: Server, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection((s.host, s.port), timeout=30)
    sock.sendall(head.encode() + body)
    return sock


def _status_line(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return 0
        data += chunk
    return int(data.split(b" ")[1])


def case_keyless_huge_body(s: Server) -> tuple[bool, str]:
    sock = _raw_socket(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Content-Length: 15000000\r\n\r\n",
        b"{",
    )
    try:
        status = _status_line(sock)
    finally:
        sock.close()
    return status == 401, f"{status} before any body was read"


def case_huge_body(s: Server) -> tuple[bool, str]:
    """17 MiB announced: the answer comes before the body is sent (a client still sending would be reset)."""
    sock = _raw_socket(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {17 << 20}\r\n\r\n",
        b'{"messages": [{"role": "user", "content": "' + b"a" * (1 << 20),
    )
    try:
        status = _status_line(sock)
    finally:
        sock.close()
    return status == 413, f"{status} after 1 of 17 MiB"


def case_slow_body(s: Server) -> tuple[bool, str]:
    sock = _raw_socket(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
        b'{"messages": [',
    )
    try:
        during = health_s(s)
    finally:
        sock.close()
    return during is not None, f"/health during a held body: {during and f'{during * 1000:.0f} ms'}"


def case_flood(s: Server) -> tuple[bool, str]:
    socks = []
    try:
        for _ in range(300):
            socks.append(socket.create_connection((s.host, s.port), timeout=5))
        try:
            status, _ = request(s, "GET", "/health", headers=AUTH, timeout=5.0)
        except (OSError, http.client.HTTPException) as exc:
            status = -1
            print(f"    flood /health: {exc}")
    finally:
        for sock in socks:
            sock.close()
    return status in (200, 503), f"/health with 300 idle connections open: {status}"


def case_child_port(s: Server) -> tuple[bool, str]:
    children = psutil.Process(s.proc.pid).children(recursive=True)
    ports = [
        c.laddr.port
        for ch in children
        for c in ch.net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    if not ports:
        return True, "no child listening (embedded engine)"
    conn = http.client.HTTPConnection("127.0.0.1", ports[0], timeout=10)
    conn.request("GET", "/slots")
    status = conn.getresponse().status
    conn.close()
    return status == 401, f"child port {ports[0]} /slots without its key: {status}"


def cases(s: Server) -> list[tuple[str, Callable[[], tuple[bool, str]]]]:
    deep = b'{"messages": ' + b"[" * 100 + b"]" * 100 + b"}"
    many = {**CHAT, "messages": [{"role": "user", "content": ""}] * 20000}
    return [
        (
            "Host of a rebinding page",
            lambda: expect(403, "host_not_allowed")(post(s, CHAT, headers=AUTH, host="evil.example")),
        ),
        (
            "text/plain body (no preflight)",
            lambda: expect(415, "unsupported_media_type")(
                request(
                    s,
                    "POST",
                    "/v1/chat/completions",
                    json.dumps(CHAT).encode(),
                    {**AUTH, "Content-Type": "text/plain"},
                )
            ),
        ),
        ("keyless 15 MB Content-Length", lambda: case_keyless_huge_body(s)),
        ("slow body held", lambda: case_slow_body(s)),
        ("17 MiB body", lambda: case_huge_body(s)),
        (
            "JSON nested 100 deep",
            lambda: expect(400, "invalid_json")(request(s, "POST", "/v1/chat/completions", deep, AUTH)),
        ),
        (
            "lone surrogate",
            lambda: expect(400, "invalid_unicode")(
                request(
                    s,
                    "POST",
                    "/v1/chat/completions",
                    b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                    AUTH,
                )
            ),
        ),
        (
            "17 stop strings",
            lambda: expect(400, "too_many_stop_strings")(post(s, {**CHAT, "stop": ["x"] * 17}, headers=AUTH)),
        ),
        (
            "300-char stop string",
            lambda: expect(400, "stop_string_too_long")(post(s, {**CHAT, "stop": "y" * 300}, headers=AUTH)),
        ),
        (
            "unsupported logit_bias",
            lambda: expect(400, "unsupported_parameter")(
                post(s, {**CHAT, "logit_bias": {"1": 5}}, headers=AUTH)
            ),
        ),
        ("20,000 empty messages", lambda: _many(post(s, many, headers=AUTH))),
        ("300 idle connections", lambda: case_flood(s)),
        ("child port without key", lambda: case_child_port(s)),
        ("plain request still works", lambda: _ok(post(s, CHAT, headers=AUTH))),
    ]


def _many(result: Result) -> tuple[bool, str]:
    status, body = result
    return status in (200, 400) and (
        status == 200 or code_of(body) == "context_length_exceeded"
    ), f"{status} {code_of(body)}"


def _ok(result: Result) -> tuple[bool, str]:
    return result[0] == 200, str(result[0])


def start(model: str, engine: str, key_file: Path) -> Server:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clover_local",
            "serve",
            "--model",
            model,
            "--engine",
            engine,
            "--api-key-file",
            str(key_file),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    s = Server("127.0.0.1", port, proc)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode() if proc.stderr else ""
            raise SystemExit(f"serve --engine {engine} exited: {err[-2000:]}")
        if health_s(s) is not None:
            return s
        time.sleep(0.5)
    raise SystemExit(f"serve --engine {engine} did not become healthy")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--engines", default="embedded,llama-server")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        key_file = Path(tmp) / "key"
        key_file.write_text(KEY + "\n")
        key_file.chmod(0o600)
        for engine in args.engines.split(","):
            s = start(args.model, engine, key_file)
            rss0 = psutil.Process(s.proc.pid).memory_info().rss
            held = failed = 0
            try:
                for name, run in cases(s):
                    try:
                        ok, detail = run()
                    except Exception as exc:  # a probe that breaks is a failed case, never the end of the run
                        ok, detail = False, f"{type(exc).__name__}: {exc}"
                    after = health_s(s)
                    ok = ok and after is not None
                    held += ok
                    failed += not ok
                    print(
                        f"[{engine}] {'held  ' if ok else 'FAILED'} {name}: {detail}; /health after: "
                        f"{f'{after * 1000:.0f} ms' if after is not None else 'no answer within 1 s'}"
                    )
                rss1 = psutil.Process(s.proc.pid).memory_info().rss
                alive = s.proc.poll() is None
            finally:
                s.proc.terminate()
                try:
                    s.proc.wait(30)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
            rows.append((engine, held + failed, held, failed, rss0, rss1, alive))
    print("\n| engine | cases tried | held | failed | serve RSS before -> after | still running |")
    print("|---|---|---|---|---|---|")
    for engine, tried, held, failed, rss0, rss1, alive in rows:
        print(
            f"| {engine} | {tried} | {held} | {failed} | {rss0 >> 20} -> {rss1 >> 20} MiB | {'yes' if alive else 'no'} |"
        )
    return 0 if all(r[3] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
