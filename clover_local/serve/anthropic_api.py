"""Anthropic's Messages API (``POST /v1/messages``) over the same engine code: ``system``, text and
``tool_use`` / ``tool_result`` blocks become chat messages; the reply becomes ``text`` and ``tool_use`` blocks,
streamed as Anthropic's events. Errors use Anthropic's shape (``{"type": "error", "error": {...}}``).

Images, documents, extended thinking and server tools get a named 400.
"""

from __future__ import annotations

import json
from typing import Any

from clover_local.engine.types import ChatMessage, GenerationStats, ToolCall, ToolCallMade
from clover_local.serve import openai_schema as oa
from clover_local.serve import tools as agent
from clover_local.serve.api_errors import ApiError, json_object
from clover_local.serve.openai_schema import ParsedRequest
from clover_local.serve.request_fields import check_fields

_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "cancelled": "end_turn"}


def error_body(exc: ApiError) -> dict[str, Any]:
    kind = {401: "authentication_error", 404: "not_found_error"}.get(exc.status, "invalid_request_error")
    if exc.status >= 500:
        kind = "api_error"
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


def parse(body: Any, known_models: tuple[str, ...]) -> ParsedRequest:
    """Validate a ``/v1/messages`` body into a generation request."""
    body = json_object(body)
    ignored = check_fields(body, "/v1/messages")
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise ApiError(400, "'max_tokens' is required and must be a positive integer.", param="max_tokens")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'messages' must be a non-empty list.", param="messages")
    messages: list[ChatMessage] = []
    params: list[str] = []
    system = _system(body.get("system"))
    if system:
        messages.append(ChatMessage("system", system))
        params.append("system")
    for i, m in enumerate(raw):
        for j, message in enumerate(_message(m, f"messages[{i}]")):
            messages.append(message)
            params.append(f"messages[{i}].content[{j}].tool_use_id")
    agent.check_tool_results(tuple(messages), params)
    tools = tuple(_tool(t, i) for i, t in enumerate(body.get("tools") or []))
    choice, parallel = _tool_choice(body.get("tool_choice"), tools)
    fields = {
        "messages": tuple(messages),
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": parallel,
    }
    return oa.parsed_request(body, known_models, ignored, names={"stop": "stop_sequences"}, **fields)


def _system(raw: Any) -> str:
    if raw is None or isinstance(raw, str):
        return raw or ""
    if isinstance(raw, list) and all(isinstance(b, dict) and b.get("type") == "text" for b in raw):
        return "\n\n".join(str(b.get("text", "")) for b in raw)
    raise ApiError(400, "'system' must be a string or a list of text blocks.", param="system")


def _tool(raw: Any, index: int) -> Any:
    p = f"tools[{index}]"
    if not isinstance(raw, dict) or raw.get("type", "custom") != "custom":
        kind = raw.get("type") if isinstance(raw, dict) else raw
        raise ApiError(
            400,
            f"{p}: tool type {kind!r} is not supported; only client tools with an input_schema.",
            param=p,
            code="invalid_tools",
        )
    return agent.tool_spec(raw.get("name"), raw.get("description"), raw.get("input_schema"), p)


def _tool_choice(raw: Any, tools: tuple[Any, ...]) -> tuple[str, bool]:
    if raw is None:
        return "auto", bool(tools)
    if not isinstance(raw, dict) or raw.get("type") not in ("auto", "any", "tool", "none"):
        raise ApiError(
            400, "'tool_choice' must be {'type': 'auto' | 'any' | 'tool' | 'none'}.", param="tool_choice"
        )
    flag = "tool_choice.disable_parallel_tool_use"
    parallel = not agent.parse_flag(raw.get("disable_parallel_tool_use"), flag, default=False)
    kind = raw["type"]
    if kind == "tool":
        return agent.parse_tool_choice({"type": "function", "name": raw.get("name")}, tools), False
    return agent.parse_tool_choice("required" if kind == "any" else kind, tools), parallel


def _message(raw: Any, p: str) -> list[ChatMessage]:
    if not isinstance(raw, dict) or raw.get("role") not in ("user", "assistant"):
        raise ApiError(400, f"{p} must have role 'user' or 'assistant'.", param=f"{p}.role")
    role = raw["role"]
    content = raw.get("content")
    if isinstance(content, str):
        return [ChatMessage(role, content)]
    if not isinstance(content, list):
        raise ApiError(400, f"{p}.content must be a string or a list of blocks.", param=f"{p}.content")
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    for j, block in enumerate(content):
        bp = f"{p}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use" and role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise ApiError(
                    400, f"{bp}: tool_use needs 'id' and 'name'.", param=bp, code="invalid_tool_message"
                )
            args = block.get("input", {})
            if not isinstance(args, dict):
                raise ApiError(
                    400, f"{bp}.input must be an object.", param=f"{bp}.input", code="invalid_tool_message"
                )
            calls.append(ToolCall(block["id"], block["name"], json.dumps(args, ensure_ascii=False)))
        elif kind == "tool_result" and role == "user":
            results.append(_tool_result(block, bp))
        else:
            raise ApiError(
                400,
                f"{bp}: a {kind!r} block is not supported in a {role} message.",
                param=bp,
                code="unsupported_content",
            )
    text = "".join(texts)
    if role == "assistant":
        return [ChatMessage("assistant", text, tool_calls=tuple(calls))]
    return [*results, *([ChatMessage("user", text)] if text or not results else [])]


def _tool_result(block: dict[str, Any], p: str) -> ChatMessage:
    content = block.get("content", "")
    if isinstance(content, list):
        if not all(isinstance(b, dict) and b.get("type") == "text" for b in content):
            raise ApiError(400, f"{p}.content: only text is supported in tool results.", param=f"{p}.content")
        content = "".join(str(b.get("text", "")) for b in content)
    if not isinstance(content, str):
        raise ApiError(400, f"{p}.content must be text.", param=f"{p}.content", code="invalid_tool_message")
    if block.get("is_error"):
        content = "Error: " + content
    return agent.parse_tool_message({"tool_call_id": block.get("tool_use_id"), "content": content}, p)


# --- out --------------------------------------------------------------------------------------------------------


def _tool_use(call: ToolCall) -> dict[str, Any]:
    try:
        args = json.loads(call.arguments or "{}")
    except ValueError:
        args = {"_raw": call.arguments}
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": args}


def _usage(stats: GenerationStats) -> dict[str, Any]:
    return {
        "input_tokens": stats.prompt_tokens,
        "output_tokens": stats.completion_tokens,
        "cache_read_input_tokens": stats.cached_tokens,
    }


def _message_object(
    parsed: ParsedRequest, content: list[dict[str, Any]], stop: str | None, usage: dict[str, Any]
) -> dict[str, Any]:
    """A ``message`` object: the whole reply, or (empty, no stop reason) the one ``message_start`` carries."""
    return {
        "id": oa.new_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": parsed.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": None,
        "usage": usage,
    }


def response(
    parsed: ParsedRequest, text: str, calls: list[ToolCall], stats: GenerationStats
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": text}] if text or not calls else []
    content += [_tool_use(c) for c in calls]
    return _message_object(parsed, content, _STOP[stats.finish_reason], _usage(stats))


class EventWriter:
    """Anthropic streaming events: message_start, content blocks, message_delta, message_stop."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self._parsed = parsed
        self._index = -1
        self._text_open = False

    @staticmethod
    def _event(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields}, ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        message = _message_object(self._parsed, [], None, {"input_tokens": 0, "output_tokens": 0})
        return [self._event("message_start", message=message)]

    def text(self, delta: str) -> list[str]:
        out: list[str] = []
        if not self._text_open:
            self._index += 1
            self._text_open = True
            out.append(
                self._event(
                    "content_block_start", index=self._index, content_block={"type": "text", "text": ""}
                )
            )
        out.append(
            self._event("content_block_delta", index=self._index, delta={"type": "text_delta", "text": delta})
        )
        return out

    def _close_text(self) -> list[str]:
        if not self._text_open:
            return []
        self._text_open = False
        return [self._event("content_block_stop", index=self._index)]

    def call(self, made: ToolCallMade) -> list[str]:
        out = self._close_text()
        self._index += 1
        block = _tool_use(made.call)
        partial = json.dumps(block["input"], ensure_ascii=False)
        return [
            *out,
            self._event("content_block_start", index=self._index, content_block={**block, "input": {}}),
            self._event(
                "content_block_delta",
                index=self._index,
                delta={"type": "input_json_delta", "partial_json": partial},
            ),
            self._event("content_block_stop", index=self._index),
        ]

    def done(self, stats: GenerationStats) -> list[str]:
        out = self._close_text()
        delta = {"stop_reason": _STOP[stats.finish_reason], "stop_sequence": None}
        return [
            *out,
            self._event("message_delta", delta=delta, usage=_usage(stats)),
            self._event("message_stop"),
        ]

    def error(self, body: dict[str, Any]) -> list[str]:
        message = (body.get("error") or {}).get("message", "error")
        return [self._event("error", error={"type": "api_error", "message": message})]
