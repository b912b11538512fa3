"""What every request must pass before a route reads it: a body size limit, JSON that decodes (not too
deep, valid Unicode), and no field the server would otherwise silently ignore.

Kept apart from ``openai_schema`` (which turns a valid body into a ``GenerationRequest``): these checks
are about hostile or mistaken input, the same for every route and both engines, and each refusal is an
OpenAI-shaped 4xx that names the problem, never a 500 with a traceback.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clover_local.serve.api_errors import ApiError, error_body

MAX_BODY_BYTES = 16 * 1024 * 1024
"""Largest request body accepted: a 262K-token prompt is about 1 MB of text, so this leaves room for JSON
escaping and long conversations while refusing a flood at once."""
MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects accepted (an OpenAI request needs about 5)."""

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
}
"""OpenAI request fields the engines do not implement. ``response_format`` and ``tools`` are handled by the
request parser (the agents work), not here."""


class BodySizeLimit:
    """ASGI middleware: 413 for a request body over ``max_bytes``, at once when ``Content-Length`` says
    so (nothing is read), else as soon as the streamed body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length", b"").strip()
        if declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:  # a chunked body: read it here, bounded, and hand it on whole
            message = await receive()
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
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

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        mib = self.max_bytes / (1024 * 1024)
        body = error_body(
            f"The request body is larger than this server accepts ({mib:g} MiB).",
            code="request_too_large",
        )
        await JSONResponse(body, status_code=413, headers={"Connection": "close"})(scope, receive, send)


def decode_json(raw: bytes) -> Any:
    """The request body as JSON; :class:`ApiError` (400) when it is not JSON, nests deeper than
    :data:`MAX_JSON_DEPTH`, or holds a string that is not valid Unicode (a lone surrogate)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise _too_deep() from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"The request body is not valid JSON: {exc}.", code="invalid_json") from None
    _check_structure(body)
    return body


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
