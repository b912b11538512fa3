"""Agent requests to ``llama-server`` and its tool calls back: tools, tool choice and JSON schemas passed in
the OpenAI shape it reads (with ``--jinja`` it renders tools through the model's template and parses the
model's calls itself, ``common/chat.cpp``), and its streamed ``tool_calls`` deltas put back together."""

from __future__ import annotations

import json
from typing import Any

from clover_local.engine.toolcalls import template_message
from clover_local.engine.types import ChatMessage, GenerationRequest, ToolCall


def openai_message(m: ChatMessage) -> dict[str, Any]:
    """A message as OpenAI's chat API sends it (tool-call arguments as JSON text)."""
    out = template_message(m)
    for call, raw in zip(out.get("tool_calls", []), m.tool_calls, strict=True):
        call["function"]["arguments"] = raw.arguments
    if m.tool_calls and not m.content:
        out["content"] = None
    return out


def agent_payload(request: GenerationRequest) -> dict[str, Any]:
    """``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``response_format`` for llama-server.

    llama-server's ``tool_choice`` takes only ``auto``, ``none`` and ``required``: a named function is sent as
    ``required`` with that one tool, which asks for the same thing."""
    out: dict[str, Any] = {}
    if request.tools:
        choice = request.tool_choice
        tools = request.tools
        if choice not in ("auto", "none", "required"):
            tools = tuple(t for t in tools if t.name == choice)
            choice = "required"
        out["tools"] = [t.as_openai() for t in tools]
        out["tool_choice"] = choice
        out["parallel_tool_calls"] = request.parallel_tool_calls
    if request.json_schema is not None:
        schema = request.json_schema or {"type": "object"}
        out["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema}}
    return out


class ToolCallCollector:
    """Puts streamed ``delta.tool_calls`` pieces (id and name first, arguments in fragments) back together."""

    def __init__(self) -> None:
        self._parts: dict[int, dict[str, str]] = {}

    def add(self, event: dict[str, Any]) -> None:
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices:
            return
        delta = choices[0].get("delta") or choices[0].get("message") or {}
        for piece in delta.get("tool_calls") or []:
            index = int(piece.get("index", len(self._parts)))
            part = self._parts.setdefault(index, {"id": "", "name": "", "arguments": ""})
            if piece.get("id"):
                part["id"] = str(piece["id"])
            fn = piece.get("function") or {}
            if fn.get("name"):
                part["name"] += str(fn["name"])
            args = fn.get("arguments")
            if args:
                part["arguments"] += args if isinstance(args, str) else json.dumps(args)

    def calls(self) -> list[ToolCall]:
        return [
            ToolCall(p["id"] or f"call_{i}", p["name"], p["arguments"] or "{}")
            for i, p in sorted(self._parts.items())
        ]
