"""OpenAI's Responses API (``POST /v1/responses``) over the same engine code as chat completions: ``input``
items (messages, ``function_call``, ``function_call_output``) become chat messages, the reply's text and tool
calls become ``output`` items, streamed as Responses events.

Stateless: ``previous_response_id``, ``store: true`` recall and built-in tools (web search, files...) get a
named 400, as does any other field this server would otherwise ignore.
"""

from __future__ import annotations

import json
import time
from typing import Any

from clover_local.engine.types import ChatMessage, GenerationStats, ToolCall, ToolCallMade
from clover_local.serve import openai_schema as oa
from clover_local.serve import tools as agent
from clover_local.serve.api_errors import ApiError, json_object
from clover_local.serve.openai_schema import ParsedRequest
from clover_local.serve.request_fields import check_fields

_IGNORED_DEFAULTS = {
    "store": (None, False, True),
    "truncation": (None, "disabled"),
    "service_tier": (None, "auto"),
}


def parse(body: Any, known_models: tuple[str, ...]) -> ParsedRequest:
    """Validate a ``/v1/responses`` body into a generation request."""
    body = json_object(body)
    ignored = check_fields(body, "/v1/responses")
    for key, allowed in _IGNORED_DEFAULTS.items():
        if body.get(key) not in allowed:
            raise ApiError(
                400, f"'{key}': {body[key]!r} is not supported.", param=key, code="unsupported_parameter"
            )
    messages = _input_messages(body.get("input"), body.get("instructions"))
    agent.check_tool_results(messages, ["input.call_id"] * len(messages))
    tools = tuple(_tool(t, i) for i, t in enumerate(body.get("tools") or []))
    choice = agent.parse_tool_choice(body.get("tool_choice"), tools)  # {"type": "function", "name": ...}
    parallel = agent.parse_flag(body.get("parallel_tool_calls"), "parallel_tool_calls", default=False)
    fields = {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel}
    fields["json_schema"] = _text_format(body.get("text"))
    names = {"max_tokens": "max_output_tokens"}
    return oa.parsed_request(body, known_models, ignored, names=names, messages=messages, **fields)


def _tool(raw: Any, index: int) -> Any:
    p = f"tools[{index}]"
    if not isinstance(raw, dict) or raw.get("type") != "function":
        kind = raw.get("type") if isinstance(raw, dict) else raw
        raise ApiError(
            400,
            f"{p}: tool type {kind!r} is not supported; only 'function' tools are.",
            param=p,
            code="invalid_tools",
        )
    return agent.tool_spec(raw.get("name"), raw.get("description"), raw.get("parameters"), p)


def _text_format(raw: Any) -> dict[str, Any] | None:
    if raw is None:
        return None
    fmt = raw.get("format") if isinstance(raw, dict) else None
    if fmt is None:
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt = {"type": "json_schema", "json_schema": {"schema": fmt.get("schema"), "name": fmt.get("name")}}
    return agent.parse_response_format(fmt, "text.format")


def _input_messages(raw: Any, instructions: Any) -> tuple[ChatMessage, ...]:
    out: list[ChatMessage] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ApiError(400, "'instructions' must be a string.", param="instructions")
        out.append(ChatMessage("system", instructions))
    if isinstance(raw, str):
        return (*out, ChatMessage("user", raw))
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "'input' must be a string or a non-empty list of items.", param="input")
    for i, item in enumerate(raw):
        out.append(_item(item, f"input[{i}]", out))
    return tuple(out)


def _item(item: Any, p: str, so_far: list[ChatMessage]) -> ChatMessage:
    if not isinstance(item, dict):
        raise ApiError(400, f"{p} must be an object.", param=p)
    kind = item.get("type", "message")
    if kind == "function_call":
        name, call_id, args = item.get("name"), item.get("call_id"), item.get("arguments", "{}")
        if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, str):
            raise ApiError(
                400,
                f"{p}: a function_call needs 'call_id', 'name' and 'arguments' (text).",
                param=p,
                code="invalid_tool_message",
            )
        call = agent.parse_assistant_calls(
            [{"id": call_id, "function": {"name": name, "arguments": args}}], p
        )
        if so_far and so_far[-1].role == "assistant" and so_far[-1].tool_calls:
            last = so_far.pop()
            return ChatMessage("assistant", last.content, tool_calls=(*last.tool_calls, *call))
        return ChatMessage("assistant", "", tool_calls=call)
    if kind == "function_call_output":
        output = item.get("output")
        if not isinstance(output, str):
            output = json.dumps(output)
        return agent.parse_tool_message({"tool_call_id": item.get("call_id"), "content": output}, p)
    if kind != "message":
        raise ApiError(400, f"{p}: input item type {kind!r} is not supported.", param=f"{p}.type")
    role = oa.ROLES.get(str(item.get("role")))
    if role is None:
        raise ApiError(400, f"{p}.role {item.get('role')!r} is not supported.", param=f"{p}.role")
    content = item.get("content")
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text"):
                kind = part.get("type") if isinstance(part, dict) else part
                raise ApiError(
                    400,
                    f"{p}.content[{j}]: {kind!r} parts are not supported; only text.",
                    param=f"{p}.content[{j}]",
                )
            texts.append(str(part.get("text", "")))
        content = "".join(texts)
    if not isinstance(content, str):
        raise ApiError(400, f"{p}.content must be a string or a list of text parts.", param=f"{p}.content")
    return ChatMessage(role, content)


# --- out --------------------------------------------------------------------------------------------------------


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _message_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    content = [_text_part(text)] if status == "completed" else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def _call_item(call: ToolCall, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": "fc_" + call.id,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _usage(stats: GenerationStats) -> dict[str, Any]:
    return {
        "input_tokens": stats.prompt_tokens,
        "input_tokens_details": {"cached_tokens": stats.cached_tokens},
        "output_tokens": stats.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": stats.prompt_tokens + stats.completion_tokens,
    }


def _envelope(rid: str, parsed: ParsedRequest, created: int, status: str) -> dict[str, Any]:
    req = parsed.request
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": parsed.model,
        "output": [],
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "metadata": {},
        "parallel_tool_calls": req.parallel_tool_calls,
        "temperature": req.temperature,
        "top_p": req.top_p,
        "tool_choice": req.tool_choice
        if req.tool_choice in ("auto", "none", "required")
        else {"type": "function", "name": req.tool_choice},
        "tools": [
            {
                "type": "function",
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "strict": False,
            }
            for t in req.tools
        ],
        "text": {"format": {"type": "text"}},
        "usage": None,
    }


def _finish(body: dict[str, Any], stats: GenerationStats) -> dict[str, Any]:
    incomplete = stats.finish_reason == "length"
    body["status"] = "incomplete" if incomplete else "completed"
    body["incomplete_details"] = {"reason": "max_output_tokens"} if incomplete else None
    body["usage"] = _usage(stats)
    return body


def response(
    parsed: ParsedRequest, text: str, calls: list[ToolCall], stats: GenerationStats
) -> dict[str, Any]:
    """The whole ``response`` object of a finished generation."""
    body = _envelope(oa.new_id("resp"), parsed, int(time.time()), "completed")
    if text or not calls:
        body["output"].append(_message_item(oa.new_id("msg"), text, "completed"))
    body["output"] += [_call_item(c, c.arguments, "completed") for c in calls]
    return _finish(body, stats)


class EventWriter:
    """Responses streaming events, as server-sent events with ``event:`` names and sequence numbers."""

    def __init__(self, parsed: ParsedRequest) -> None:
        self._parsed = parsed
        self._body = _envelope(oa.new_id("resp"), parsed, int(time.time()), "in_progress")
        self._seq = 0
        self._msg_id = oa.new_id("msg")
        self._text: list[str] | None = None
        self._msg_index = -1

    def _event(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self._seq, **fields}
        self._seq += 1
        return f"event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n"

    def start(self) -> list[str]:
        return [
            self._event("response.created", response=self._body),
            self._event("response.in_progress", response=self._body),
        ]

    def _part_event(self, kind: str, **fields: Any) -> str:
        """An event of the reply message's one text part."""
        return self._event(
            kind, item_id=self._msg_id, output_index=self._msg_index, content_index=0, **fields
        )

    def text(self, delta: str) -> list[str]:
        out: list[str] = []
        if self._text is None:
            self._text, self._msg_index = [], len(self._body["output"])
            item = _message_item(self._msg_id, "", "in_progress")
            self._body["output"].append(item)
            out += [
                self._event("response.output_item.added", output_index=self._msg_index, item=item),
                self._part_event("response.content_part.added", part=_text_part("")),
            ]
        self._text.append(delta)
        return [*out, self._part_event("response.output_text.delta", delta=delta, logprobs=[])]

    def _close_text(self) -> list[str]:
        if self._text is None:
            return []
        text = "".join(self._text)
        item = _message_item(self._msg_id, text, "completed")
        self._body["output"][self._msg_index] = item
        self._text = None
        return [
            self._part_event("response.output_text.done", text=text, logprobs=[]),
            self._part_event("response.content_part.done", part=_text_part(text)),
            self._event("response.output_item.done", output_index=self._msg_index, item=item),
        ]

    def call(self, made: ToolCallMade) -> list[str]:
        out = self._close_text()
        index, arguments = len(self._body["output"]), made.call.arguments
        done = _call_item(made.call, arguments, "completed")
        self._body["output"].append(done)
        at = {"item_id": done["id"], "output_index": index}
        started = _call_item(made.call, "", "in_progress")
        return [
            *out,
            self._event("response.output_item.added", output_index=index, item=started),
            self._event("response.function_call_arguments.delta", **at, delta=arguments),
            self._event("response.function_call_arguments.done", **at, arguments=arguments),
            self._event("response.output_item.done", output_index=index, item=done),
        ]

    def done(self, stats: GenerationStats) -> list[str]:
        out = self._close_text()
        body = _finish(self._body, stats)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        return [*out, self._event(kind, response=body)]

    def error(self, body: dict[str, Any]) -> list[str]:
        err = body.get("error") or {}
        return [
            self._event("error", code=err.get("code"), message=err.get("message"), param=err.get("param"))
        ]
