"""An OpenAI-compatible endpoint someone already runs (Ollama, LM Studio, llama-server, a hosted API) as a
``ChatEngine``: ``POST {base}/chat/completions``, streamed, so the time to the first token is seen here.

The key comes from an environment variable the person names; it goes only into the ``Authorization`` header
and is cut out of anything the endpoint says back, so it is never printed, logged or saved. A reply is read up
to :data:`MAX_REPLY_BYTES`: an endpoint that streams without end fails that task, it does not fill memory.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from clover_local.engine.types import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    GenerationStats,
    RunnerHealth,
    TextDelta,
    ToolCallMade,
    ToolFormat,
)
from clover_local.errors import EngineError, ServerError
from clover_local.llamacpp.server_tools import ToolCallCollector, openai_message

MAX_REPLY_BYTES = 1024 * 1024
"""Bytes of one streamed reply (all its events) read at most."""
MAX_ERROR_BYTES = 16 * 1024
TIMEOUT_S = 300.0
"""No byte for this long: the endpoint is taken to be stuck."""
PROBE_TIMEOUT_S = 15.0


class EndpointUnreachable(ServerError):
    """The endpoint cannot be reached (down, wrong address): its contender stops, the others still run."""


class ReplyTooLarge(EngineError):
    """The endpoint sent more than :data:`MAX_REPLY_BYTES` for one reply."""


class EndpointEngine:
    """Chat completions from ``base_url`` (ending in ``/v1`` or the API's root) for ``model``."""

    submit = None
    """Each request is an HTTP stream read on its caller's thread (``ChatEngine.submit``)."""
    n_ctx = 0  # not told by the OpenAI API
    tool_format: ToolFormat = "hermes"  # the endpoint parses its model's calls itself
    slots = 1  # compare sends one task at a time
    runner_pid = None  # not a process of this machine's

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        timeout_s: float = TIMEOUT_S,
        max_reply_bytes: int = MAX_REPLY_BYTES,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ServerError(f"{base_url} is not an http:// or https:// URL.")
        self.base_url = base_url.rstrip("/")
        self._parts = parts
        self.model_name = model
        self._key = api_key or None
        self._timeout_s = timeout_s
        self.max_reply_bytes = max_reply_bytes

    def check_request(self, request: GenerationRequest) -> None:
        """Nothing refused here: the endpoint answers what it cannot do."""

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str | None:
        return None  # the endpoint applies its own template

    def count_tokens(self, text: str) -> int:
        raise EngineError("An OpenAI-compatible endpoint does not count tokens.")

    def health(self) -> RunnerHealth:
        return RunnerHealth()  # what the endpoint runs on is its own: a reply that fails says so

    def measure_verify_costs(self, n_max_batch: int) -> None:
        """Nothing to measure: the endpoint drafts (or not) by its own rule."""

    def close(self) -> None:
        """Nothing to unload: the endpoint belongs to someone else."""

    def redact(self, text: str) -> str:
        """``text`` with the key cut out (an endpoint may echo what it was sent)."""
        return text.replace(self._key, "***") if self._key else text

    # -- HTTP -------------------------------------------------------------------------------------------

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        https = self._parts.scheme == "https"
        kind = http.client.HTTPSConnection if https else http.client.HTTPConnection
        return kind(self._parts.hostname or "", self._parts.port or (443 if https else 80), timeout=timeout_s)

    def _headers(self, body: bool) -> dict[str, str]:
        headers = {"Accept": "application/json, text/event-stream"}
        if body:
            headers["Content-Type"] = "application/json"
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _path(self, route: str) -> str:
        return (self._parts.path.rstrip("/") or "") + route

    def probe(self) -> None:
        """Reach the endpoint before any task (``GET /models``): an endpoint that is down, or refuses the key,
        is one clear error for this contender, not one per task."""
        conn = self._connection(PROBE_TIMEOUT_S)
        try:
            conn.request("GET", self._path("/models"), headers=self._headers(False))
            resp = conn.getresponse()
            body = resp.read(MAX_ERROR_BYTES)
        except (OSError, http.client.HTTPException) as exc:
            raise EndpointUnreachable(
                f"Could not reach the endpoint {self.base_url}: {self.redact(str(exc))}.",
                "Start it, or check the URL (http://HOST:PORT/v1#MODEL).",
            ) from None
        finally:
            conn.close()
        if resp.status in (401, 403):
            raise ServerError(
                f"The endpoint {self.base_url} refused the key (HTTP {resp.status}).",
                "Name the variable holding its key with --key-env VAR.",
            )
        if resp.status >= 500:
            raise ServerError(f"The endpoint {self.base_url} answered HTTP {resp.status}: {self._said(body)}")

    def _said(self, body: bytes) -> str:
        text = body[:MAX_ERROR_BYTES].decode("utf-8", errors="replace")
        try:
            data = json.loads(text)
            error = data.get("error") if isinstance(data, dict) else None
            text = str(error.get("message") if isinstance(error, dict) else error or text)
        except ValueError:
            pass
        return self.redact(text.strip())[:500]

    def _payload(self, request: GenerationRequest) -> dict[str, Any]:
        if request.messages is None:
            raise EngineError("An endpoint contender chats: give the task messages, not a bare prompt.")
        payload: dict[str, Any] = {
            "model": self.model_name,
            "messages": [openai_message(m) for m in request.messages],
            "max_tokens": request.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        sampling = {"temperature": request.temperature, "top_p": request.top_p, "seed": request.seed}
        payload.update({k: v for k, v in sampling.items() if v is not None})
        if request.tools:
            payload["tools"] = [t.as_openai() for t in request.tools]
            payload["tool_choice"] = request.tool_choice
        return payload

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        """Stream one reply: text, then the tool calls the endpoint parsed, then the stats (times measured
        here, tokens as the endpoint's ``usage`` counts them)."""
        body = json.dumps(self._payload(request)).encode()
        started = time.perf_counter()
        conn = self._connection(self._timeout_s)
        try:
            try:
                conn.request("POST", self._path("/chat/completions"), body=body, headers=self._headers(True))
                resp = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                raise EndpointUnreachable(
                    f"Could not reach the endpoint {self.base_url}: {self.redact(str(exc))}."
                ) from None
            if resp.status != 200:
                raise ServerError(
                    f"The endpoint answered HTTP {resp.status}: {self._said(resp.read(MAX_ERROR_BYTES))}"
                )
            yield from self._read(resp, started, cancel)
        finally:
            conn.close()

    def _read(
        self, resp: http.client.HTTPResponse, started: float, cancel: threading.Event | None
    ) -> Iterator[GenerationEvent]:
        calls = ToolCallCollector()
        usage: dict[str, Any] = {}
        finish: FinishReason = "stop"
        first: float | None = None
        deltas, read = 0, 0
        for event in self._events(resp):
            read += event.pop("__bytes__", 0)
            if read > self.max_reply_bytes:
                raise ReplyTooLarge(
                    f"The endpoint's reply went past {self.max_reply_bytes} bytes; it was cut off."
                )
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            if isinstance(event.get("usage"), dict):
                usage = event["usage"]
            choices = event.get("choices")
            if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                continue
            choice = choices[0]
            delta = choice.get("delta") or choice.get("message") or {}
            calls.add(event)
            text = delta.get("content") if isinstance(delta, dict) else None
            if (text or (isinstance(delta, dict) and delta.get("tool_calls"))) and first is None:
                first = time.perf_counter()
            if isinstance(text, str) and text:
                deltas += 1
                yield TextDelta(text)
            reason = choice.get("finish_reason")
            if reason:
                finish = reason if reason in ("length", "tool_calls") else "stop"
        for index, call in enumerate(calls.calls()):
            yield ToolCallMade(index, call)
        end = time.perf_counter()
        first = first or end
        completion = int(usage.get("completion_tokens") or deltas)
        decode_s = end - first
        yield Finished(
            GenerationStats(
                prompt_tokens=int(usage.get("prompt_tokens") or 0),
                completion_tokens=completion,
                cached_tokens=0,
                ttft_s=first - started,
                prefill_tokens_per_s=0.0,
                decode_tokens_per_s=(completion - 1) / decode_s if completion > 1 and decode_s > 0 else 0.0,
                draft_acceptance=None,
                finish_reason=finish,
            )
        )

    def _events(self, resp: http.client.HTTPResponse) -> Iterator[dict[str, Any]]:
        """The JSON events of a streamed answer (or the one object of an endpoint that does not stream), each
        with ``__bytes__``: how much of the answer it took."""
        kind = resp.getheader("Content-Type", "")
        try:
            if "text/event-stream" not in kind:
                raw = resp.read(self.max_reply_bytes + 1)
                data = json.loads(raw or b"null")
                if isinstance(data, dict):
                    yield {**data, "__bytes__": len(raw)}
                return
            while True:
                line = resp.readline(self.max_reply_bytes + 1)
                if not line:
                    return
                text = line.decode("utf-8", errors="replace").strip()
                if not text.startswith("data:"):
                    if len(line) > self.max_reply_bytes:
                        yield {"__bytes__": len(line)}
                    continue
                data_text = text[5:].strip()
                if data_text == "[DONE]":
                    return
                try:
                    event = json.loads(data_text)
                except ValueError:
                    event = None  # not JSON: only its bytes count
                if isinstance(event, dict) and "error" in event and not event.get("choices"):
                    raise ServerError(f"The endpoint stopped the reply: {self._said(data_text.encode())}")
                yield {**(event if isinstance(event, dict) else {}), "__bytes__": len(line)}
        except (OSError, http.client.HTTPException) as exc:
            raise ServerError(f"The reply from {self.base_url} broke off: {self.redact(str(exc))}.") from None
        except RecursionError:
            raise ServerError(f"The reply from {self.base_url} nests too deeply.") from None
