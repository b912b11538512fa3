#!/usr/bin/env python3
"""Probe a running `clover-local serve` with hostile requests (issue 27), on both engines.

For each engine it starts `clover-local serve` (the model by --model or --preset) with the key in a file and small
limits (one slot, no queue, a reply stopped after --time-limit seconds) on a free loopback port, and sends each
hostile case. While a case's request is in flight, and after it, `/health` must answer within a second. A case
"held" when the server gave the expected named refusal (or bounded answer) and stayed healthy; "failed"
otherwise. It prints one line per case and a summary table (markdown) for docs/reliability.md.

    python benchmarks/probe_hostile.py --preset smollm2-135m [--engines embedded,llama-server]
    python benchmarks/probe_hostile.py --model PATH.gguf

Loopback only; nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
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
LONG_TOKENS = 4000
LONG = {
    "messages": [{"role": "user", "content": "Write a long story."}],
    "max_tokens": LONG_TOKENS,
    # a reply the model cannot end early: a JSON string of at least 2000 characters (500 tokens or more)
    "response_format": {
        "type": "json_schema",
        "json_schema": {"name": "long", "schema": {"type": "string", "minLength": 2000}},
    },
}
SCHEMA_REFUSALS = ("request_refused", "invalid_schema", "schema_too_large")
"""What a schema over the grammar's limits gets (``schema_gbnf/limits.py``, the forced call's shortest form):
a 400 naming the keyword and its path."""


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


def case_trickled_headers(s: Server) -> tuple[bool, str]:
    """Slowloris on the headers, no key sent: a header byte every 0.2 s, never the blank line that ends them.
    serve's header deadline (10 s) answers 408 and closes however the bytes come."""
    sock = _raw_socket(s, "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")
    sock.settimeout(60)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(0.2):
            try:
                sock.sendall(b"a")
            except OSError:
                return

    threading.Thread(target=trickle, daemon=True).start()
    t0 = time.perf_counter()
    try:
        reply = b""
        while chunk := sock.recv(4096):
            reply += chunk
    except OSError as exc:
        return False, f"still open after {time.perf_counter() - t0:.0f} s ({exc})"
    finally:
        stop.set()
        sock.close()
    status = reply.split(b" ")[1].decode() if reply.startswith(b"HTTP/") else "no reply"
    return status == "408", f"{status}, closed after {time.perf_counter() - t0:.1f} s of trickling"


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


def _nested_items(levels: int, n: int) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        item = {"type": "array", "minItems": n, "items": item}
    return item


def _bounded_integers(n: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": 1, "maximum": n}


SCHEMAS: dict[str, Callable[[], dict[str, Any]]] = {
    # what each parameter object holds: {"type": "object", "properties": {"a": ...}, "required": ["a"]}
    "5 levels of minItems 30": lambda: _nested_items(5, 30),
    "minItems 1000 at 4 levels": lambda: _nested_items(4, 1000),
    "maxLength 10**9": lambda: {"type": "string", "maxLength": 10**9},
    'pattern "^a{1000000000}$"': lambda: {"type": "string", "pattern": "^a{1000000000}$"},
    "maxLength 200000 (nesting)": lambda: {"type": "string", "maxLength": 200_000},
}
MANY_PROPERTIES = 300_000
ENFORCED_FORCED = frozenset({"maxLength 200000 (nesting)"})
"""Cases a forced call may answer: the grammar enforces them (nested repetitions past llama.cpp's 2,000) and
their shortest call is short (""), so a reply bounded by max_tokens is the right answer, not a refusal."""


UNDER_THE_LIMIT = 4000
"""Bounded-integer properties a request may send (serve counts 4096 schema objects at most): the jsonschema
check of these runs in full, for seconds, and /health must answer meanwhile."""


def _object(name: str) -> dict[str, Any]:
    if name in ("300k bounded-integer properties", "4,000 bounded-integer properties"):
        n = MANY_PROPERTIES if name.startswith("300k") else UNDER_THE_LIMIT
        return {"type": "object", "properties": {f"p{i}": _bounded_integers(99) for i in range(n)}}
    return {"type": "object", "properties": {"a": SCHEMAS[name]()}, "required": ["a"]}


def schema_body(route: str, how: str, name: str) -> bytes:
    """A request on ``route`` whose tool parameters (``how`` = tools, the call forced) or reply format (``how``
    = format) is the hostile schema ``name``."""
    schema = _object(name)
    msgs = [{"role": "user", "content": "hi"}]
    body: dict[str, Any]
    if route == "/v1/chat/completions":
        body = {"messages": msgs, "max_tokens": 64}
        if how == "tools":
            tool = {"type": "function", "function": {"name": "f", "parameters": schema}}
            body |= {"tools": [tool], "tool_choice": "required"}
        else:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    elif route == "/v1/responses":
        body = {"input": "hi", "max_output_tokens": 64}
        if how == "tools":
            body |= {
                "tools": [{"type": "function", "name": "f", "parameters": schema}],
                "tool_choice": "required",
            }
        else:
            body["text"] = {"format": {"type": "json_schema", "name": "r", "schema": schema}}
    else:  # /v1/messages: a tool's input_schema, the call forced with tool_choice any
        body = {"messages": msgs, "max_tokens": 64}
        body |= {"tools": [{"name": "f", "input_schema": schema}], "tool_choice": {"type": "any"}}
    return json.dumps(body, separators=(",", ":")).encode()


def schema_case(s: Server, route: str, how: str, name: str) -> tuple[bool, str]:
    raw = schema_body(route, how, name)
    t0 = time.perf_counter()
    status, body = request(s, "POST", route, raw, AUTH)
    took = time.perf_counter() - t0
    err = body.get("error") if isinstance(body, dict) else None
    if name in ENFORCED_FORCED and status == 200 and isinstance(body, dict):
        # Enforced, with a short shortest call: answered within max_tokens, however it ended.
        choice = (body.get("choices") or [{}])[0]
        finish = choice.get("finish_reason") or body.get("status") or body.get("stop_reason")
        return took < 60 and finish is not None, f"{status} in {took:.2f} s (answered, bounded: {finish})"
    if route == "/v1/messages":  # Anthropic's shape: a type and a message, no code
        message = str(err.get("message", "")) if isinstance(err, dict) else ""
        ok = status == 400 and code_of(body) == "invalid_request_error"
        named = message[:90]
    elif name.startswith("4,000"):  # allowed in size: answered, or refused by name for what it costs
        ok = status == 200 or (
            status == 400 and code_of(body) in (*SCHEMA_REFUSALS, "context_length_exceeded")
        )
        named = (
            f"{code_of(body)}: {str(err.get('message', ''))[:90] if isinstance(err, dict) else 'answered'}"
        )
    elif how == "format" and status == 200:
        # A reply format has no shortest-reply check (a forced call has): held when the reply stops at
        # max_tokens, bounded, instead of the schema being written out.
        finish = (body.get("choices") or [{}])[0].get("finish_reason") or body.get("status")
        ok = finish in ("length", "incomplete") and took < 60
        named = f"bounded: stopped at max_tokens ({finish})"
    else:
        ok = status == 400 and code_of(body) in SCHEMA_REFUSALS
        named = f"{code_of(body)}: {str(err.get('message', ''))[:90] if isinstance(err, dict) else ''}"
    return ok, f"{len(raw) / 1e6:.1f} MB body, {status} in {took:.2f} s ({named})"


def case_queue_full(s: Server) -> tuple[bool, str]:
    """serve runs with one slot and --max-queue 0: while a streamed reply holds the slot, the next request
    gets 503 queue_full with Retry-After at once."""
    conn = http.client.HTTPConnection(s.host, s.port, timeout=120)
    try:
        raw = json.dumps({**LONG, "stream": True}).encode()
        conn.request("POST", "/v1/chat/completions", raw, {**AUTH, "Host": f"127.0.0.1:{s.port}"})
        held = conn.getresponse()
        if not _first_token(held):
            return False, f"the slot-holding stream ended before its first token ({held.status})"
        status, body = post(s, CHAT, headers=AUTH)
    finally:
        conn.close()  # the held stream's client leaves: its slot is freed at the engine's next step
    freed = _slot_freed(s)
    ok = status == 503 and code_of(body) == "queue_full" and freed
    return (
        ok,
        f"{status} {code_of(body)} while the slot was busy; slot {'freed' if freed else 'NOT freed'} after",
    )


def _slot_freed(s: Server, limit_s: float = 60.0) -> bool:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        status, body = request(s, "GET", "/health", headers=AUTH, timeout=5)
        if status == 200 and not body.get("busy"):
            return True
        time.sleep(0.1)
    return False


def _first_token(stream: http.client.HTTPResponse) -> bool:
    """Read the stream up to its first generated text (the role chunk comes before the slot is taken)."""
    while line := stream.readline():
        if line.startswith(b"data: {"):
            choices = json.loads(line[6:]).get("choices") or [{}]
            if choices[0].get("delta", {}).get("content"):
                return True
    return False


def case_time_limit(s: Server, limit_s: float) -> tuple[bool, str]:
    """A reply that would run for thousands of tokens is stopped at serve's --max-request-time and answered
    with what it made."""
    t0 = time.perf_counter()
    status, body = post(s, LONG, headers=AUTH)
    took = time.perf_counter() - t0
    _slot_freed(s)  # the next case finds the slot free
    choices = body.get("choices") or [{}]
    tokens = (body.get("usage") or {}).get("completion_tokens")
    detail = f"{status} after {took:.1f} s, {tokens} tokens, finish_reason {choices[0].get('finish_reason')}"
    if status == 200 and took < limit_s:
        return False, detail + f": the reply ended before the {limit_s:g} s limit, which was not reached"
    return status == 200 and took < limit_s + 30 and (tokens or 0) < LONG_TOKENS, detail


Case = tuple[str, Callable[[], tuple[bool, str]]]
OWN_HEALTH_CHECK = ("300 idle connections",)
"""Cases that check /health themselves: with 300 connections open it is 503 by design (the connection limit)."""


def schema_cases(s: Server) -> list[Case]:
    """Issue 27 case 1, each hostile schema on every route that reaches the grammar: a forced tool call on
    chat completions (``required``), Responses (``required``) and Messages (``any``), and a reply format on
    chat completions and Responses."""
    out: list[Case] = []
    names = [*SCHEMAS, "300k bounded-integer properties"]
    for how, routes in (
        ("tools", ("/v1/chat/completions", "/v1/responses", "/v1/messages")),
        ("format", ("/v1/chat/completions", "/v1/responses")),
    ):
        for route in routes:
            for name in names:
                label = f"{name}: {'forced call' if how == 'tools' else 'reply format'} on {route}"
                out.append((label, functools.partial(schema_case, s, route, how, name)))
    return out


def cases(s: Server, limit_s: float) -> list[Case]:
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
        ("headers trickled (slowloris)", lambda: case_trickled_headers(s)),
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
        *schema_cases(s),
        (
            "4,000 bounded-integer properties (under the limit): forced call on /v1/chat/completions",
            functools.partial(
                schema_case, s, "/v1/chat/completions", "tools", "4,000 bounded-integer properties"
            ),
        ),
        ("a request past the queue (one slot, --max-queue 0)", lambda: case_queue_full(s)),
        (f"a reply past --max-request-time {limit_s:g}", lambda: case_time_limit(s, limit_s)),
        ("plain request still works", lambda: _ok(post(s, CHAT, headers=AUTH))),
    ]


def rss(s: Server) -> int:
    """Resident memory of serve and its children (the llama-server engine's process)."""
    proc = psutil.Process(s.proc.pid)
    total = 0
    for p in (proc, *proc.children(recursive=True)):
        with contextlib.suppress(psutil.Error):  # a child that just ended
            total += p.memory_info().rss
    return total


def run_case(
    s: Server, name: str, case: Callable[[], tuple[bool, str]]
) -> tuple[bool, str, float | None, int]:
    """Run ``case`` in a thread and ask /health over and over while it is in flight: the case holds only when
    every answer came within a second. Returns (held, detail, the slowest /health during it, the most memory
    serve held meanwhile)."""
    outcome: list[tuple[bool, str]] = []

    def run() -> None:
        try:
            outcome.append(case())
        except Exception as exc:  # a probe that breaks is a failed case, never the end of the run
            outcome.append((False, f"{type(exc).__name__}: {exc}"))

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    slowest: float | None = 0.0
    peak = rss(s)
    while worker.is_alive() and name not in OWN_HEALTH_CHECK:
        took = health_s(s)
        slowest = None if took is None or slowest is None else max(slowest, took)
        peak = max(peak, rss(s))
        worker.join(0.1)
    worker.join()
    ok, detail = outcome[0]
    return ok and slowest is not None, detail, slowest, max(peak, rss(s))


def _many(result: Result) -> tuple[bool, str]:
    status, body = result
    return status in (200, 400) and (
        status == 200 or code_of(body) == "context_length_exceeded"
    ), f"{status} {code_of(body)}"


def _ok(result: Result) -> tuple[bool, str]:
    return result[0] == 200, str(result[0])


def start(model: list[str], engine: str, key_file: Path, limit_s: float) -> Server:
    port = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clover_local",
            "serve",
            *model,
            "--engine",
            engine,
            "--api-key-file",
            str(key_file),
            "--port",
            str(port),
            "--parallel",
            "1",
            "--max-queue",
            "0",
            "--max-request-time",
            str(limit_s),
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
    model = parser.add_mutually_exclusive_group(required=True)
    model.add_argument("--model", help="a GGUF file")
    model.add_argument("--preset", help="a preset whose model is downloaded (e.g. smollm2-135m)")
    parser.add_argument("--engines", default="embedded,llama-server")
    parser.add_argument("--time-limit", type=float, default=3.0, help="serve's --max-request-time (s)")
    args = parser.parse_args()
    model_args = ["--model", args.model] if args.model else ["--preset", args.preset]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        key_file = Path(tmp) / "key"
        key_file.write_text(KEY + "\n")
        key_file.chmod(0o600)
        for engine in args.engines.split(","):
            s = start(model_args, engine, key_file, args.time_limit)
            rss0 = rss(s)
            held = failed = 0
            peak = rss0
            try:
                for name, case in cases(s, args.time_limit):
                    ok, detail, during, case_peak = run_case(s, name, case)
                    after = health_s(s)
                    ok = ok and after is not None
                    held += ok
                    failed += not ok
                    peak = max(peak, case_peak)
                    print(
                        f"[{engine}] {'held  ' if ok else 'FAILED'} {name}: {detail}; /health during: "
                        f"{_ms(during) if name not in OWN_HEALTH_CHECK else 'see above'}, after: {_ms(after)}",
                        flush=True,
                    )
                rss1 = rss(s)
                alive = s.proc.poll() is None
            finally:
                s.proc.terminate()
                try:
                    s.proc.wait(30)
                except subprocess.TimeoutExpired:
                    s.proc.kill()
            rows.append((engine, held + failed, held, failed, rss0, peak, rss1, alive))
    print(
        "\n| engine | cases tried | held | failed | RSS (serve + child) before / peak / after | still running |"
    )
    print("|---|---|---|---|---|---|")
    for engine, tried, held, failed, rss0, peak, rss1, alive in rows:
        print(
            f"| {engine} | {tried} | {held} | {failed} | {rss0 >> 20} / {peak >> 20} / {rss1 >> 20} MiB "
            f"| {'yes' if alive else 'no'} |"
        )
    return 0 if all(r[3] == 0 for r in rows) else 1


def _ms(took: float | None) -> str:
    return f"{took * 1000:.0f} ms" if took is not None else "no answer within 1 s"


if __name__ == "__main__":
    raise SystemExit(main())
