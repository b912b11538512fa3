"""A small HTTP client for talking to a local ``llama-server``: JSON requests and server-sent event streams.

The standard library's ``http.client`` is enough for one local connection and keeps the dependency list short.
A stream is read line by line, so closing it (on cancel) closes the socket, which makes llama-server stop
generating for that request.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from clover_local.errors import RequestRefused, ServerError


@dataclass(frozen=True)
class HttpResponse:
    status: int
    body: bytes

    def json(self) -> Any:
        try:
            return json.loads(self.body or b"null")
        except ValueError:
            return None


def _connection(base_url: str, timeout_s: float) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ServerError(f"Only plain http:// URLs are supported, not {base_url!r}.")
    conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
    return conn, parts.path.rstrip("/")


def _headers(api_key: str | None, body: bytes | None) -> dict[str, str]:
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def request(
    base_url: str,
    method: str,
    path: str,
    payload: Any = None,
    *,
    api_key: str | None = None,
    timeout_s: float = 30.0,
) -> HttpResponse:
    """One request; connection errors become ``ServerError``. Any status is returned, not raised."""
    conn, prefix = _connection(base_url, timeout_s)
    body = None if payload is None else json.dumps(payload).encode()
    try:
        conn.request(method, prefix + path, body=body, headers=_headers(api_key, body))
        resp = conn.getresponse()
        return HttpResponse(resp.status, resp.read())
    except (OSError, http.client.HTTPException) as exc:
        raise ServerError(f"Could not reach llama-server at {base_url}{path}: {exc}.") from None
    finally:
        conn.close()


class EventStream:
    """The ``data:`` payloads of a server-sent event response, decoded from JSON, until ``[DONE]``."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn = conn
        self._resp = resp

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            while True:
                line = self._resp.readline()
                if not line:
                    return
                text = line.decode("utf-8", errors="replace").strip()
                if not text.startswith("data:"):
                    if text.startswith("error:"):
                        raise ServerError(f"llama-server stopped the stream: {text[6:].strip()}")
                    continue
                data = text[5:].strip()
                if data == "[DONE]":
                    return
                try:
                    event = json.loads(data)
                except ValueError:
                    continue
                if isinstance(event, dict):
                    if "error" in event and not event.get("choices"):
                        raise ServerError(f"llama-server reported an error: {_error_text(event)}")
                    yield event
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(f"The stream from llama-server broke off: {exc}.") from None

    def close(self) -> None:
        """Close the socket: llama-server notices and stops generating for this request."""
        self._resp.close()
        self._conn.close()


def stream(
    base_url: str, path: str, payload: Any, *, api_key: str | None = None, timeout_s: float = 600.0
) -> EventStream:
    """POST and return the event stream; a non-200 answer raises ``ServerError`` with its message."""
    conn, prefix = _connection(base_url, timeout_s)
    body = json.dumps(payload).encode()
    try:
        conn.request("POST", prefix + path, body=body, headers=_headers(api_key, body))
        resp = conn.getresponse()
    except (OSError, http.client.HTTPException) as exc:
        conn.close()
        raise ServerError(f"Could not reach llama-server at {base_url}{path}: {exc}.") from None
    if resp.status != 200:
        answer = HttpResponse(resp.status, resp.read())
        conn.close()
        error = RequestRefused if 400 <= resp.status < 500 else ServerError
        raise error(f"llama-server answered {resp.status}: {_error_text(answer.json())}")
    return EventStream(conn, resp)


def _error_text(data: Any) -> str:
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])
        if isinstance(err, str):
            return err
    return str(data)[:500]
