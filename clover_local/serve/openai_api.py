"""OpenAI's chat completions (``POST /v1/chat/completions``) and legacy completions (``POST /v1/completions``),
as the Responses and Messages adapters have them (``serve.adapters``): the ``response`` of a finished generation
and its stream (an event writer); ``openai_schema`` parses their bodies."""

from __future__ import annotations

import json
import time
from typing import Any

from clover_local.engine.types import GenerationStats, ToolCall, ToolCallMade
from clover_local.serve import openai_schema as oa
from clover_local.serve import tools as agent
from clover_local.serve.openai_schema import ParsedRequest

DONE = "data: [DONE]\n\n"
"""OpenAI's last line of a stream, after its last chunk or an error."""


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def openai_finish(reason: str) -> str:
    return reason if reason in ("length", "tool_calls") else "stop"


def usage(stats: GenerationStats) -> dict[str, Any]:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.completion_tokens,
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def timings(stats: GenerationStats) -> dict[str, Any]:
    """Speed figures in llama-server's ``timings`` names, so a client reads both servers the same way."""
    out: dict[str, Any] = {
        "cache_n": stats.cached_tokens,
        "prompt_n": stats.prompt_tokens - stats.cached_tokens,
        "prompt_per_second": stats.prefill_tokens_per_s,
        "predicted_n": stats.completion_tokens,
        "predicted_per_second": stats.decode_tokens_per_s,
        "ttft_ms": stats.ttft_s * 1000.0,
    }
    if stats.drafted_tokens:
        out["draft_n"] = stats.drafted_tokens
        out["draft_n_accepted"] = stats.accepted_tokens
    return out


def _object(
    kind: str, rid: str, model: str, created: int, choice: dict[str, Any], finish: str | None
) -> dict[str, Any]:
    """A completion object or chunk of either API with its one choice."""
    return {
        "id": rid,
        "object": kind,
        "created": created,
        "model": model,
        "choices": [{"index": 0, **choice, "finish_reason": finish, "logprobs": None}],
    }


def _finished(
    kind: str, prefix: str, model: str, choice: dict[str, Any], stats: GenerationStats
) -> dict[str, Any]:
    body = _object(
        kind, oa.new_id(prefix), model, int(time.time()), choice, openai_finish(stats.finish_reason)
    )
    return {**body, "usage": usage(stats), "timings": timings(stats)}


def chat_response(
    parsed: ParsedRequest, text: str, calls: list[ToolCall], stats: GenerationStats
) -> dict[str, Any]:
    """The ``chat.completion`` object of a finished generation; tool calls in its message, content null then
    unless text came with them."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["content"] = text or None
        message["tool_calls"] = [agent.openai_call(c) for c in calls]
    return _finished("chat.completion", "chatcmpl", parsed.model, {"message": message}, stats)


def completion_response(
    parsed: ParsedRequest, text: str, calls: list[ToolCall], stats: GenerationStats
) -> dict[str, Any]:
    """The ``text_completion`` object of a finished generation."""
    return _finished("text_completion", "cmpl", parsed.model, {"text": text}, stats)


class _EventWriter:
    """What both streams share: one id and creation time on every chunk, and an error followed by ``[DONE]``."""

    kind = ""
    prefix = ""

    def __init__(self, parsed: ParsedRequest) -> None:
        self._parsed = parsed
        self._rid, self._created = oa.new_id(self.prefix), int(time.time())

    def _chunk(self, choice: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return _object(self.kind, self._rid, self._parsed.model, self._created, choice, finish)

    def error(self, body: dict[str, Any]) -> list[str]:
        return [sse(body), DONE]


class ChatEventWriter(_EventWriter):
    """Chat completion chunks: the role first, a chunk per text delta and per tool call, the finish reason with
    llama.cpp's ``timings``, the usage chunk when ``stream_options.include_usage`` asks, then ``[DONE]``."""

    kind, prefix = "chat.completion.chunk", "chatcmpl"

    def start(self) -> list[str]:
        return [sse(self._chunk({"delta": {"role": "assistant", "content": ""}}))]

    def text(self, delta: str) -> list[str]:
        return [sse(self._chunk({"delta": {"content": delta}}))]

    def call(self, made: ToolCallMade) -> list[str]:
        return [sse(self._chunk({"delta": {"tool_calls": [agent.openai_call(made.call, made.index)]}}))]

    def done(self, stats: GenerationStats) -> list[str]:
        last = {**self._chunk({"delta": {}}, openai_finish(stats.finish_reason)), "timings": timings(stats)}
        out = [sse(last)]
        if self._parsed.include_usage:
            out.append(sse({**self._chunk({"delta": {}}), "choices": [], "usage": usage(stats)}))
        return [*out, DONE]


class CompletionEventWriter(_EventWriter):
    """Legacy completion chunks: one per text delta, the finish reason with ``timings`` (and usage when asked),
    then ``[DONE]``. Tool calls have no place in this API."""

    kind, prefix = "text_completion", "cmpl"

    def start(self) -> list[str]:
        return []

    def text(self, delta: str) -> list[str]:
        return [sse(self._chunk({"text": delta}))]

    def call(self, made: ToolCallMade) -> list[str]:
        return []

    def done(self, stats: GenerationStats) -> list[str]:
        last = {**self._chunk({"text": ""}, openai_finish(stats.finish_reason)), "timings": timings(stats)}
        if self._parsed.include_usage:
            last["usage"] = usage(stats)
        return [sse(last), DONE]
