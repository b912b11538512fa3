"""What every request must pass before a route reads it: the checks of :class:`RequestGuard` (host, content
type, key, body size and time), JSON that decodes (not too deep, valid Unicode), and no field the server would
otherwise silently ignore. Kept apart from ``openai_schema`` (which turns a valid body into a
``GenerationRequest``): these checks are about hostile or mistaken input, the same for every route and both
engines, and each refusal is an OpenAI-shaped 4xx that names the problem, never a 500 with a traceback.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import time
from collections.abc import Iterable
from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clover_local.netaddr import is_loopback_host
from clover_local.serve.api_errors import ApiError, error_body

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body accepted: a 262K-token prompt is about 1 MB of text, so this leaves room for JSON
escaping and long conversations while refusing a flood at once."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted (an OpenAI request needs about 5)."""
BODY_TIMEOUT_S = 120.0
"""Longest time a request body may take to arrive (16 MiB at 140 KB/s): a client that sends a byte now and
then (slowloris) loses its connection instead of holding it."""
MAX_STOP_STRINGS = 16
"""Most stop strings one request may give (OpenAI allows 4); each is checked against every piece of text."""
MAX_STOP_CHARS = 256
"""Longest stop string accepted."""
MAX_SCHEMA_OBJECTS = 4096
"""Most JSON objects the schemas of one request may hold together (every tool's parameters, the reply
format): each costs about a millisecond of ``jsonschema``'s meta-schema check and at least a grammar rule, and
a grammar holds at most 4096 rules (``schema_gbnf.limits``). 300,000 properties took minutes."""
SCHEMA_FIELDS = ("tools", "response_format", "text")
"""Where a request carries schemas: tools (all three APIs), ``response_format`` (chat and text completions),
``text.format`` (Responses)."""
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""Host names a server bound to loopback always answers to (with any port)."""

UNSUPPORTED_FIELDS: dict[str, tuple[object, ...]] = {
    # field: the values that mean "not used" (anything else is refused rather than ignored)
    "logit_bias": (None, {}),
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "best_of": (None, 1),
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "repeat_penalty": (None, 1, 1.0),
}
"""OpenAI request fields the engines do not implement (and llama-server's ``repeat_penalty``). ``response_format``
and ``tools`` are handled by the request parser (the agents work), not here; the no-op values of some are
accepted and named back (``request_fields.NO_OP``)."""


def allowed_host(host_header: str, allowed: frozenset[str] | None) -> bool:
    """Whether a request's ``Host`` (port removed) is one this server answers to: a loopback name or
    address, a ``*.localhost`` name, or one of ``allowed``; any host when ``allowed`` is None.

    A page on ``evil.example`` that re-points its DNS name at 127.0.0.1 (DNS rebinding) sends
    ``Host: evil.example``: refusing it keeps the page from reading replies, as Ollama does."""
    if allowed is None:
        return True
    host = host_header.strip().lower()
    if host.startswith("["):  # [::1]:8080
        host = host[1 : host.find("]")] if "]" in host else host
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    host = host.rstrip(".")
    if host in LOOPBACK_NAMES or host.endswith(".localhost") or host in allowed:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def hosts_allowed(bind_host: str, extra: Iterable[str]) -> frozenset[str] | None:
    """The ``Host`` names to accept besides loopback ones, for a server bound to ``bind_host``: None (any)
    when it listens beyond this machine (as Ollama; the API key is what guards it then) or ``extra`` holds
    ``*``; else ``extra``."""
    names = frozenset(h.strip().lower() for h in extra if h.strip())
    if "*" in names or not is_loopback_host(bind_host):
        return None
    return names


class RequestGuard:
    """ASGI middleware, in this order (nothing is buffered before the host, type and key are checked):

    - 403 for a ``Host`` the server does not answer to (DNS rebinding, :func:`allowed_host`);
    - 415 for a body that is not JSON by its ``Content-Type``: a web page may POST ``text/plain``, form or bare
      bodies to localhost without asking (no CORS preflight), never ``application/json``;
    - 401 without ``Authorization: Bearer <key>`` (or ``x-api-key``) when a key is set;
    - 413 for a body over ``max_bytes``, at once when ``Content-Length`` says so (nothing is read), else as soon
      as the streamed body passes the limit; 408 when the body has not arrived within ``timeout_s`` (a slow
      sender does not hold its connection)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        allowed: frozenset[str] | None = frozenset(),
        api_key: str | None = None,
        max_bytes: int = MAX_BODY_BYTES,
        timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.app = app
        self.allowed = allowed
        self.key = api_key.encode() if api_key else None
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        refusal = self._refusal(headers, scope.get("method"))
        if refusal is None and scope.get("method") not in ("GET", "HEAD"):
            declared = headers.get(b"content-length", b"").strip()
            if declared.isdigit() and int(declared) > self.max_bytes:
                refusal = self._too_large()
            else:
                receive, refusal = await self._read_body(receive)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _refusal(self, headers: dict[bytes, bytes], method: str | None) -> Response | None:
        host = headers.get(b"host", b"").decode("latin-1")
        if not allowed_host(host, self.allowed):
            return _refuse(
                403,
                f"This server does not answer to the host name {host[:100]!r}. Use http://127.0.0.1, or start "
                "it with --allowed-host NAME (or CLOVER_ALLOWED_HOSTS) to accept that name.",
                "host_not_allowed",
            )
        if method not in ("GET", "HEAD", "OPTIONS"):
            kind = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
            if kind != b"application/json" and not kind.endswith(b"+json"):
                return _refuse(
                    415,
                    f"The request body must be JSON sent as 'Content-Type: application/json' "
                    f"(got {kind.decode('latin-1')[:100] or 'none'!r}).",
                    "unsupported_media_type",
                )
        if self.key is None:
            return None
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        if hmac.compare_digest(given, self.key):
            return None
        message = "Incorrect or missing API key. Send it as 'Authorization: Bearer <key>'."
        return JSONResponse(error_body(message, code="invalid_api_key"), status_code=401)

    async def _read_body(self, receive: Receive) -> tuple[Receive, Response | None]:
        """The body read here, bounded (a chunked one too), and a ``receive`` that hands it on whole; or the
        refusal when it is too large or too slow."""
        chunks: list[bytes] = []
        size = 0
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                return receive, _refuse(
                    408,
                    f"The request body did not arrive within {self.timeout_s:g} s; the connection is closed.",
                    "request_timeout",
                )
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return receive, self._too_large()
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return replay, None

    def _too_large(self) -> Response:
        mib = self.max_bytes / (1024 * 1024)
        message = f"The request body is larger than this server accepts ({mib:g} MiB)."
        return _refuse(413, message, "request_too_large")


def _refuse(status: int, message: str, code: str) -> Response:
    """A refusal that closes the connection (what was sent of the request is not read)."""
    return JSONResponse(error_body(message, code=code), status_code=status, headers={"Connection": "close"})


def check_stops(stops: list[str], param: str) -> None:
    """400 naming ``param`` for more than :data:`MAX_STOP_STRINGS` stop strings or one over
    :data:`MAX_STOP_CHARS`: each is searched for in every piece of the reply."""
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(
            400,
            f"'{param}' holds {len(stops)} strings; at most {MAX_STOP_STRINGS} are accepted.",
            code="too_many_stop_strings",
            param=param,
        )
    for s in stops:
        if len(s) > MAX_STOP_CHARS:
            raise ApiError(
                400,
                f"A stop string in '{param}' is {len(s)} characters; at most {MAX_STOP_CHARS} are accepted.",
                code="stop_string_too_long",
                param=param,
            )


def decode_json(raw: bytes) -> Any:
    """The request body as JSON; :class:`ApiError` (400) when it is not JSON, nests deeper than
    :data:`MAX_JSON_DEPTH`, or holds a string that is not valid Unicode (a lone surrogate)."""
    try:
        body = json.loads(raw, object_hook=_hand_over)
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    _check_structure(body)
    return body


def _hand_over(obj: dict[str, Any]) -> dict[str, Any]:
    """``json.loads``' object hook, which changes nothing: a Python call per object lets the interpreter hand
    the GIL to the event loop while a large body decodes (``json``'s C decoder alone kept it for the whole
    16 MiB, 0.6 s here, during which ``/health`` waited; with the hook the loop waits at most ~30 ms)."""
    return obj


def refuse_unsupported(body: Any) -> None:
    """400 naming the first field that asks for something the engines do not do (instead of ignoring it)."""
    if not isinstance(body, dict):
        return
    for field, unused in UNSUPPORTED_FIELDS.items():
        value = body.get(field)
        # type() as well as ==, so that `true` is not taken for 1 nor `false` for 0
        if not any(type(value) is type(u) and value == u for u in unused):
            raise ApiError(
                400,
                f"'{field}' is not supported by this server; remove it from the request.",
                code="unsupported_parameter",
                param=field,
            )


def check_schema_size(body: Any) -> None:
    """400 ``schema_too_large`` when the request's schemas (:data:`SCHEMA_FIELDS`) hold more than
    :data:`MAX_SCHEMA_OBJECTS` objects, counted before anything reads them as schemas."""
    if not isinstance(body, dict):
        return
    stack = [body[f] for f in SCHEMA_FIELDS if f in body]
    objects = 0
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            objects += 1
            if objects > MAX_SCHEMA_OBJECTS:
                raise ApiError(
                    400,
                    f"The request's schemas ({', '.join(f for f in SCHEMA_FIELDS if f in body)}) hold more than "
                    f"{MAX_SCHEMA_OBJECTS} JSON objects; a grammar can enforce at most that many. Send fewer "
                    "tools or smaller schemas.",
                    code="schema_too_large",
                )
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _check_structure(body: Any) -> None:
    """Walk the decoded body without recursion: depth, and strings that UTF-8 cannot encode."""
    stack: list[tuple[Any, str, int]] = [(body, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict):
            if depth >= MAX_JSON_DEPTH:
                raise _too_deep()
            for key, item in value.items():
                _check_text(key, f"{path} (a key)" if path else "a key")
                stack.append((item, f"{path}.{key}" if path else key, depth + 1))
        elif isinstance(value, list):
            if depth >= MAX_JSON_DEPTH:
                raise _too_deep()
            stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            _check_text(value, path or "the body")


def _check_text(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(
            400,
            f"{where} holds an invalid Unicode character (a lone surrogate, "
            f"\\u{ord(text[exc.start]):04x}); send valid UTF-8 text.",
            code="invalid_unicode",
            param=where,
        ) from None


def _too_deep() -> ApiError:
    return ApiError(
        400,
        f"The request body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels.",
        code="invalid_json",
    )
