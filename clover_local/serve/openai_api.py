"""OpenAI's chat completions (``POST /v1/chat/completions``) and legacy completions (``POST /v1/completions``) as
adapters of the one request path (``serve.api``), in the shape the Responses and Messages adapters have: ``parse``
a body, build the ``response`` of a finished generation, write its stream (an event writer), and the
``error_body`` of a refusal (``serve.adapters`` puts each route's together)."""

from __future__ import annotations

import json
import time
from typing import Any

from clover_local.engine.types import GenerationStats, ToolCall, ToolCallMade
from clover_local.serve import openai_schema as oa
from clover_local.serve import tools as agent
from clover_local.serve.api_errors import ApiError
from clover_local.serve.openai_schema import ParsedRequest

DONE = "data: [DONE]\n\n"
"""OpenAI's last line of a stream, after its last chunk or an error."""


def sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def error_body(exc: ApiError) -> dict[str, Any]:
    """OpenAI's error object (the Responses API uses it too)."""
    return exc.body()


class ChatEventWriter:
    """Chat completion chunks: the role first, a chunk per text delta and per tool call, the finish reason with
    llama.cpp's ``timings``, the usage chunk when ``stream_options.include_usage`` asks, then ``[DONE]``."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self._parsed = parsed
        self._rid, self._created = oa.new_id("chatcmpl"), int(time.time())

    def _chunk(self, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
        return oa.chat_chunk(self._rid, self._parsed.model, self._created, delta, finish)

    def start(self) -> list[str]:
        return [sse(self._chunk({"role": "assistant", "content": ""}, None))]

    def text(self, delta: str) -> list[str]:
        return [sse(self._chunk({"content": delta}, None))]

    def call(self, made: ToolCallMade) -> list[str]:
        return [sse(self._chunk({"tool_calls": [agent.openai_call(made.call, made.index)]}, None))]

    def done(self, stats: GenerationStats) -> list[str]:
        last = self._chunk({}, oa.openai_finish(stats.finish_reason))
        last["timings"] = oa.timings(stats)
        out = [sse(last)]
        if self._parsed.include_usage:
            usage_chunk = self._chunk({}, None)
            usage_chunk["choices"] = []
            usage_chunk["usage"] = oa.usage(stats)
            out.append(sse(usage_chunk))
        return [*out, DONE]

    def error(self, body: dict[str, Any]) -> list[str]:
        return [sse(body), DONE]


class CompletionEventWriter:
    """Legacy completion chunks: one per text delta, the finish reason with ``timings`` (and usage when asked),
    then ``[DONE]``. Tool calls have no place in this API."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self._parsed = parsed
        self._rid, self._created = oa.new_id("cmpl"), int(time.time())

    def _chunk(self, text: str, finish: str | None) -> dict[str, Any]:
        return oa.completion_chunk(self._rid, self._parsed.model, self._created, text, finish)

    def start(self) -> list[str]:
        return []

    def text(self, delta: str) -> list[str]:
        return [sse(self._chunk(delta, None))]

    def call(self, made: ToolCallMade) -> list[str]:
        return []

    def done(self, stats: GenerationStats) -> list[str]:
        last = self._chunk("", oa.openai_finish(stats.finish_reason))
        last["timings"] = oa.timings(stats)
        if self._parsed.include_usage:
            last["usage"] = oa.usage(stats)
        return [sse(last), DONE]

    def error(self, body: dict[str, Any]) -> list[str]:
        return [sse(body), DONE]


def chat_response(
    parsed: ParsedRequest, text: str, calls: list[ToolCall], stats: GenerationStats
) -> dict[str, Any]:
    """The ``chat.completion`` object of a finished generation; tool calls in its message, content null then
    unless text came with them."""
    body = oa.chat_response(oa.new_id("chatcmpl"), parsed.model, text, stats)
    if calls:
        message = body["choices"][0]["message"]
        message["content"] = message["content"] or None
        message["tool_calls"] = [agent.openai_call(c) for c in calls]
    return body


def completion_response(
    parsed: ParsedRequest, text: str, calls: list[ToolCall], stats: GenerationStats
) -> dict[str, Any]:
    """The ``text_completion`` object of a finished generation."""
    return oa.completion_response(oa.new_id("cmpl"), parsed.model, text, stats)
