"""Each API the server speaks, as one adapter of the one request path (``serve.api``): how a body is parsed and
checked with that API's own field names, how a finished generation is answered, how a stream is written, and the
error body of a refusal. The request path itself (context fit, slots, cancel, the engine's events) is shared."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from clover_local.engine.types import GenerationStats, ToolCall, ToolCallMade
from clover_local.serve import anthropic_api, openai_api, responses_api
from clover_local.serve import openai_schema as oa
from clover_local.serve.api_errors import ApiError
from clover_local.serve.openai_schema import ParsedRequest


class EventWriter(Protocol):
    """Server-sent events of one streamed reply, in its API's shape."""

    def start(self) -> list[str]: ...

    def text(self, delta: str) -> list[str]: ...

    def call(self, made: ToolCallMade) -> list[str]: ...

    def done(self, stats: GenerationStats) -> list[str]: ...

    def error(self, body: dict[str, Any]) -> list[str]:
        """``body``: the refusal in OpenAI's error shape (``ApiError.body``)."""
        ...


@dataclass(frozen=True)
class Adapter:
    """One API's shapes around the one request path."""

    parse: Callable[[Any, tuple[str, ...]], ParsedRequest]
    response: Callable[[ParsedRequest, str, list[ToolCall], GenerationStats], dict[str, Any]]
    writer: Callable[[ParsedRequest], EventWriter]
    error_body: Callable[[ApiError], dict[str, Any]]
    """OpenAI's error object (``ApiError.body``) for OpenAI's APIs, the Responses API's included."""


CHAT = Adapter(oa.parse_chat, openai_api.chat_response, openai_api.ChatEventWriter, ApiError.body)
COMPLETIONS = Adapter(
    oa.parse_completion, openai_api.completion_response, openai_api.CompletionEventWriter, ApiError.body
)
RESPONSES = Adapter(responses_api.parse, responses_api.response, responses_api.EventWriter, ApiError.body)
MESSAGES = Adapter(
    anthropic_api.parse, anthropic_api.response, anthropic_api.EventWriter, anthropic_api.error_body
)
