"""Hostile requests against the local API (issue 27): a web page through the person's browser (Host, Content-
Type), a flood of keyless or slow connections, bodies built to cost many round trips, limits on stop strings and
on a reply's time. Each is refused by name (or bounded) while ``/health`` keeps answering."""

from __future__ import annotations

import argparse
import http.client
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
from helpers_engine import EngineWrapper, GatedEngine, ScriptedEngine

from clover_local import cli
from clover_local.commands.serve import read_api_key
from clover_local.engine.types import TEMPLATE_TOKENS_PER_MESSAGE, ChatMessage
from clover_local.serve import adapters, runner
from clover_local.serve import openai_schema as oa
from clover_local.serve import request_guard as guard
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer
from clover_local.tui import context_fit

MODEL = "scripted"
KEY = "sk-hostile-test"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


class CountingEngine(EngineWrapper):
    """Counts ``count_tokens`` calls: on llama-server each one is an HTTP round trip."""

    def __init__(self) -> None:
        super().__init__(ScriptedEngine())
        self.counts = 0

    def count_tokens(self, text: str) -> int:
        self.counts += 1
        return self.inner.count_tokens(text)


def _serve(engine: Any = None, **config: Any) -> BackgroundServer:
    return BackgroundServer(engine or ScriptedEngine(), ApiConfig(MODEL, **config))


@pytest.fixture
def server() -> Iterator[BackgroundServer]:
    with _serve() as s:
        yield s


def request(
    s: BackgroundServer,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    host: str | None = None,
) -> tuple[int, Any]:
    conn = http.client.HTTPConnection(s.host, s.port, timeout=30)
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
            return resp.status, json.loads(raw or b"null")
        except ValueError:  # uvicorn's own 503 is plain text
            return resp.status, raw.decode(errors="replace")
    finally:
        conn.close()


def post_json(s: BackgroundServer, payload: object, **kw: Any) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json", **kw.pop("headers", {})}
    return request(s, "POST", "/v1/chat/completions", json.dumps(payload).encode(), headers, **kw)


def health(s: BackgroundServer) -> int:
    return request(s, "GET", "/health")[0]


def test_a_rebinding_host_name_is_refused_and_loopback_names_answer(server: BackgroundServer) -> None:
    status, body = post_json(server, CHAT, host="evil.example:8080")
    assert status == 403 and body["error"]["code"] == "host_not_allowed"
    assert request(server, "GET", "/v1/models", host="evil.example")[0] == 403
    for host in (f"localhost:{server.port}", "127.0.0.1", f"[::1]:{server.port}", "app.localhost"):
        assert post_json(server, CHAT, host=host)[0] == 200, host


def test_allowed_hosts_are_configurable() -> None:
    with _serve(allowed_hosts=frozenset({"box.lan"})) as s:
        assert post_json(s, CHAT, host="box.lan:8080")[0] == 200
        assert post_json(s, CHAT, host="other.lan")[0] == 403
    with _serve(allowed_hosts=None) as s:
        assert post_json(s, CHAT, host="anything.example")[0] == 200
    assert guard.hosts_allowed("127.0.0.1", ["box.lan", " "]) == frozenset({"box.lan"})
    assert guard.hosts_allowed("::1", []) == frozenset()
    assert guard.hosts_allowed("0.0.0.0", []) is None  # listening beyond the machine: the key guards it
    assert guard.hosts_allowed("127.0.0.1", ["*"]) is None


@pytest.mark.parametrize(
    "kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None]
)
def test_a_body_a_web_page_could_send_without_preflight_is_refused(
    server: BackgroundServer, kind: str | None
) -> None:
    headers = {"Content-Type": kind} if kind else {}
    status, body = request(server, "POST", "/v1/chat/completions", json.dumps(CHAT).encode(), headers)
    assert status == 415 and body["error"]["code"] == "unsupported_media_type"
    ok = {"Content-Type": "application/json; charset=utf-8"}
    assert request(server, "POST", "/v1/chat/completions", json.dumps(CHAT).encode(), ok)[0] == 200


def _open_body(s: BackgroundServer, length: int, sent: bytes, headers: str = "") -> socket.socket:
    sock = socket.create_connection((s.host, s.port), timeout=30)
    sock.sendall(
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"{headers}Content-Length: {length}\r\n\r\n".encode()
        + sent
    )
    return sock


def _status_of(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            break
        data += chunk
    return int(data.split(b" ")[1])


def test_the_key_is_checked_before_any_body_is_read() -> None:
    """A keyless client announcing a 15 MB body gets 401 at once: nothing of it is buffered (on a body that
    would never come, the old order waited forever)."""
    with _serve(api_key=KEY) as s:
        sock = _open_body(s, 15_000_000, b"{")
        try:
            assert _status_of(sock) == 401
        finally:
            sock.close()
        assert health(s) == 401  # every route wants the key
        assert post_json(s, CHAT, headers={"Authorization": f"Bearer {KEY}"})[0] == 200


def test_a_slow_body_is_cut_at_the_deadline_and_health_answers_meanwhile() -> None:
    with _serve(body_timeout_s=2.0) as s:
        sock = _open_body(s, 1000, b'{"model": "scr')  # and then nothing: a slowloris sender
        try:
            assert health(s) == 200  # answered while the body is held
            assert _status_of(sock) == 408
        finally:
            sock.close()
        assert health(s) == 200


def _trickle(sock: socket.socket, stop: threading.Event) -> None:
    """A byte of header every 20 ms, never the blank line that ends the headers, until the socket is shut."""
    while not stop.wait(0.02):
        try:
            sock.sendall(b"a")
        except OSError:
            return


@pytest.mark.parametrize("kept_alive", [False, True], ids=["new connection", "after a first request"])
def test_a_sender_that_trickles_its_headers_is_closed_at_the_deadline(kept_alive: bool) -> None:
    """Slowloris on the headers, with no API key set: uvicorn has no header deadline (its keep-alive timer
    stops at the first byte), so a byte now and then held the connection for ever. The deadline counts from the
    start, however the bytes come: 408, closed, and /health answers meanwhile and after."""
    with _serve(header_timeout_s=1.0) as s:
        sock = socket.create_connection((s.host, s.port), timeout=30)
        stop = threading.Event()
        try:
            if kept_alive:
                sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                first = http.client.HTTPResponse(sock)
                first.begin()
                assert first.status == 200 and json.loads(first.read())["status"] == "ok"
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: ")
            threading.Thread(target=_trickle, args=(sock, stop), daemon=True).start()
            assert health(s) == 200
            reply = b""
            while chunk := sock.recv(4096):  # to the end: the server closes the connection
                reply += chunk
            assert reply.startswith(b"HTTP/1.1 408 ")
            assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "request_timeout"
        finally:
            stop.set()
            sock.close()
        assert health(s) == 200


def test_headers_past_16_kib_are_refused_before_any_key_check() -> None:
    """What one connection may buffer before its key is read: h11 holds at most 16 KiB of incomplete headers
    (uvicorn's ``h11_max_incomplete_event_size``), then answers 400 and closes."""
    with _serve(api_key=KEY) as s:
        sock = socket.create_connection((s.host, s.port), timeout=30)
        try:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * 20_000)
            assert _status_of(sock) == 400
        finally:
            sock.close()
        assert request(s, "GET", "/health", headers={"Authorization": f"Bearer {KEY}"})[0] == 200


def _held_connection(s: BackgroundServer) -> socket.socket:
    """A connection the server has surely accepted (it answered /health on it) that then stays inside a
    request whose body never comes."""
    sock = socket.create_connection((s.host, s.port), timeout=30)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    assert _status_of(sock) == 200
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n{"
    )
    return sock


def test_connections_past_the_limit_get_503_and_health_answers_after(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "MAX_CONNECTIONS", 4)
    with _serve() as s:
        held = [_held_connection(s) for _ in range(3)]
        try:
            assert health(s) == 503  # the fourth connection
        finally:
            for sock in held:
                sock.close()
        for _ in range(500):  # the server notices the closed sockets on its next loop turns
            if health(s) == 200:
                break
        assert health(s) == 200


def test_stop_strings_are_bounded(server: BackgroundServer) -> None:
    status, body = post_json(server, {**CHAT, "stop": ["x"] * (guard.MAX_STOP_STRINGS + 1)})
    assert status == 400 and body["error"]["code"] == "too_many_stop_strings"
    status, body = post_json(server, {**CHAT, "stop": "y" * (guard.MAX_STOP_CHARS + 1)})
    assert status == 400 and body["error"]["code"] == "stop_string_too_long"
    assert post_json(server, {**CHAT, "stop": ["x"] * guard.MAX_STOP_STRINGS})[0] == 200


def test_many_messages_are_counted_in_one_call() -> None:
    """The llama-server engine counts over HTTP: one call per message let a body of empty messages cost
    hundreds of thousands of localhost round trips."""
    engine = CountingEngine()
    many = engine.n_ctx // (TEMPLATE_TOKENS_PER_MESSAGE + 1)  # as many as the context holds, markers counted
    with _serve(engine) as s:
        messages = [{"role": "user", "content": ""}] * many + [{"role": "user", "content": "hi"}]
        assert post_json(s, {**CHAT, "messages": messages})[0] == 200
    assert engine.counts <= 2


def test_serve_and_the_chat_answer_does_a_prompt_fit_with_one_count() -> None:
    """``serve`` refuses a prompt exactly where the chat's count (``tui.context_fit``) says it leaves no room: both
    ask ``engine.types.prompt_tokens``, with one allowance a message for the template's markers."""
    engine = ScriptedEngine()  # 1024 tokens; a word is a token
    with _serve(engine) as s:
        for words in (
            engine.n_ctx - TEMPLATE_TOKENS_PER_MESSAGE - 1,
            engine.n_ctx - TEMPLATE_TOKENS_PER_MESSAGE,
        ):
            messages = [ChatMessage("user", "w " * words)]
            counted = context_fit.prompt_tokens(engine, messages)
            assert counted == words + TEMPLATE_TOKENS_PER_MESSAGE
            status, body = post_json(s, {**CHAT, "messages": [{"role": "user", "content": "w " * words}]})
            assert (status == 200) == (counted < engine.n_ctx), body
            if status != 200:
                assert body["error"]["code"] == "context_length_exceeded"


def test_a_reply_past_the_time_limit_is_stopped() -> None:
    """The gate is never released: only the per-request limit ends the reply."""
    engine = GatedEngine(ScriptedEngine())
    with _serve(engine, max_request_s=1.0) as s:
        status, body = post_json(s, {**CHAT, "max_tokens": 20})
        assert status == 200 and body["choices"][0]["message"]["content"] == "1\n"
        assert health(s) == 200


@pytest.mark.parametrize("seconds", ["0", "-5", "nan"])
def test_the_time_limit_option_must_be_a_time(seconds: str, capsys: Any) -> None:
    """``serve --max-request-time`` sets ``ApiConfig.max_request_s``; a value that is no time is a usage error
    before any model is opened."""
    assert cli.main(["serve", "--preset", "gemma3-270m", "--max-request-time", seconds]) == 2
    err = capsys.readouterr().err
    assert "--max-request-time" in err and "Give seconds above 0" in err and "Traceback" not in err


def _many_properties(n: int) -> dict[str, Any]:
    props = {f"p{i}": {"type": "integer", "minimum": 1, "maximum": 99} for i in range(n)}
    return {"type": "object", "properties": props}


@pytest.mark.parametrize(
    ("path", "fields"),
    [
        ("/v1/chat/completions", {"tools": "function", "tool_choice": "required"}),
        ("/v1/chat/completions", {"response_format": "json_schema"}),
        ("/v1/responses", {"tools": "flat", "tool_choice": "required"}),
        ("/v1/responses", {"text": "format"}),
        ("/v1/messages", {"tools": "input_schema", "tool_choice": {"type": "any"}}),
    ],
)
def test_schemas_past_the_object_limit_are_refused_before_they_are_read(
    server: BackgroundServer, path: str, fields: dict[str, Any]
) -> None:
    """Issue 27 case 1: the meta-schema check costs about a millisecond per subschema, and 300,000 bounded
    integer properties (a 15 MB body) held the server for minutes. Counted first, they are a named 400."""
    schema = _many_properties(guard.MAX_SCHEMA_OBJECTS)
    shapes: dict[str, Any] = {
        "function": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
        "json_schema": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        "flat": [{"type": "function", "name": "f", "parameters": schema}],
        "format": {"format": {"type": "json_schema", "name": "r", "schema": schema}},
        "input_schema": [{"name": "f", "input_schema": schema}],
    }
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 8}
    body |= {"input": "hi"} if path == "/v1/responses" else {"messages": CHAT["messages"]}
    body |= {k: shapes.get(v, v) if isinstance(v, str) else v for k, v in fields.items()}
    status, reply = request(
        server, "POST", path, json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    assert status == 400
    if path == "/v1/messages":
        assert "more than 4096 JSON objects" in reply["error"]["message"]
    else:
        assert reply["error"]["code"] == "schema_too_large"
    assert health(server) == 200


def test_a_request_is_parsed_off_the_event_loop(
    server: BackgroundServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding and checking a body (a 16 MiB one, or schemas up to the limit: seconds of Python) runs in a
    worker thread: /health answers while a parse is held in the middle. On the event loop it waited for it."""
    entered, release = threading.Event(), threading.Event()
    real_parse = oa.parse_chat

    def held_parse(body: Any, names: tuple[str, ...]) -> Any:
        entered.set()
        release.wait(120)  # longer than the /health request waits (30 s)
        return real_parse(body, names)

    monkeypatch.setattr(adapters, "CHAT", replace(adapters.CHAT, parse=held_parse))
    replies: list[int] = []
    sender = threading.Thread(target=lambda: replies.append(post_json(server, CHAT)[0]), daemon=True)
    sender.start()
    try:
        assert entered.wait(30)
        assert health(server) == 200  # while the parse is held
    finally:
        release.set()
    sender.join(30)
    assert replies == [200]


def test_the_key_comes_from_the_environment_or_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any, capsys: Any
) -> None:
    args = argparse.Namespace(api_key=None, api_key_file=None)
    monkeypatch.setenv("CLOVER_API_KEY", " from-env ")
    assert read_api_key(args) == "from-env"
    key_file = tmp_path / "key"
    key_file.write_text("# comment\nfrom-file\n")
    assert read_api_key(argparse.Namespace(api_key=None, api_key_file=str(key_file))) == "from-file"
    assert read_api_key(argparse.Namespace(api_key="on-argv", api_key_file=None)) == "on-argv"
    assert "ps" in capsys.readouterr().err


def test_health_answers_while_a_hostile_body_is_held(server: BackgroundServer) -> None:
    """A 16 MiB-announcing sender keeps its connection; other clients are served."""
    sock = _open_body(server, 16 * 1024 * 1024, b"[" * 1000)
    try:
        done = threading.Event()
        statuses: list[int] = []

        def probe() -> None:
            statuses.append(health(server))
            done.set()

        threading.Thread(target=probe, daemon=True).start()
        assert done.wait(30) and statuses == [200]
    finally:
        sock.close()
