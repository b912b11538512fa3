"""Agent requests to ``llama-server`` and its tool calls back.

Two ways a chat request goes (:func:`clover_enforces`):

- llama-server's own chat route (``/v1/chat/completions``): tools, tool choice and JSON schemas in the OpenAI
  shape it reads; with ``--jinja`` it renders tools through the model's template and parses the model's calls
  itself (``common/chat.cpp``); its streamed ``tool_calls`` deltas are put back together here.
- clover-local's route, where llama-server would not enforce what was asked: a JSON schema for the reply (its
  chat route puts the template's generation prompt inside the schema's grammar), a forced tool choice (its grammar
  lets free text come first, and a template without tool syntax gets none at all, ``common/chat-auto-parser-
  generator.cpp``), tools on a template that cannot show them, and chat on a GGUF without a template. The prompt
  is rendered by llama-server's own template (``/apply-template``; tools folded into the messages where the
  template cannot show them), and ``/completion`` runs it under the same grammar the embedded engine uses; the
  reply's calls are parsed as the embedded engine parses them.
"""

from __future__ import annotations

import json
from typing import Any

from clover_local.engine.schema_gbnf import schema_grammar
from clover_local.engine.templates import TemplateChoice, renders_tools
from clover_local.engine.toolcalls import (
    CALL_END,
    CALL_START,
    forced_tools,
    has_tool_turns,
    reply_stop_strings,
    template_message,
)
from clover_local.engine.types import ChatMessage, GenerationRequest, ToolCall


def clover_enforces(template: TemplateChoice, request: GenerationRequest) -> bool:
    """Whether this chat request must run through clover-local's route (module docstring) rather than
    llama-server's chat route, which would ignore part of it."""
    if request.messages is None:
        return False
    if template.kind == "completion" or forced_tools(request):
        return True
    if request.json_schema is not None:
        # llama-server's chat route writes the generation prompt into a schema's grammar ("root ::=
        # "<|im_start|>assistant\n" ..."), which no reply can match: every ChatML model got "Failed to
        # initialize samplers". /completion with the rendered prompt enforces the schema.
        return True
    # Tools even with tool_choice none: llama-server refuses them without --jinja.
    agentic = bool(request.tools) or has_tool_turns(request.messages)
    return agentic and not renders_tools(template)


def completion_payload(
    request: GenerationRequest,
    prompt: str,
    grammar: str | None,
    turn_markers: tuple[str, ...],
    opening_tokens: tuple[int, ...] = (),
) -> dict[str, Any]:
    """The ``/completion`` fields for clover-local's route (besides sampling): the prompt, the grammar or JSON
    schema, the template's turn markers as stop strings, and those markers and the call tags kept as text in
    the reply (``preserved_tokens``: llama-server otherwise drops control tokens from the text).

    Under a grammar (a forced call, a JSON schema) the grammar says where the reply ends: a marker that opens
    a turn (``<|im_start|>``, one token the vocabulary does not mark as an end) is read by llama.cpp's grammar
    as its text, which a JSON string admits, so as a stop string it cut calls mid-string (the soak's one miss on
    this route). There it is no stop string, and its token (``opening_tokens``) is barred (``logit_bias``
    false), as the embedded engine's grammar gate bars it; nor is the call's end (``</tool_call>``, text a string
    may hold: the grammar ends after the call); markers that close a turn stay stop strings (the grammar admits
    them only at its end, and llama-server writes them as text): ``toolcalls.reply_stop_strings``."""
    under_grammar = grammar is not None or request.json_schema is not None
    out: dict[str, Any] = {
        "prompt": prompt,
        "n_predict": request.max_tokens,
        "stop": list(reply_stop_strings(request, turn_markers, under_grammar=under_grammar)),
        "preserved_tokens": [CALL_START, CALL_END, *turn_markers],
    }
    if under_grammar and opening_tokens:
        out["logit_bias"] = [[token, False] for token in opening_tokens]
    if grammar is not None:
        out["grammar"] = grammar
    elif request.json_schema is not None:
        out.update(schema_fields(request.json_schema))
    return out


def schema_fields(schema: dict[str, Any]) -> dict[str, Any]:
    """How a reply's JSON schema goes to llama-server: as clover-local's ``grammar`` of it, the one the embedded
    engine samples under, so both engines accept and refuse the same schemas (one keyword table decides,
    ``schema_gbnf.keywords``) and every repetition stays inside what llama.cpp's grammar parser holds. Its own
    converter resolved ``#name`` references, lengths over 2,000 and percent-encoded pointers otherwise than
    JSON Schema does, and passes over keywords it does not read. A schema the grammar cannot enforce is a
    ``SchemaRefused`` naming the keyword and its path, as on the embedded engine."""
    return {"grammar": schema_grammar(schema or {"type": "object"})}


def withhold_unfinished(calls: list[ToolCall]) -> list[ToolCall]:
    """The calls of a reply that ran out of tokens, without the one cut off (arguments that are not JSON)."""
    kept = []
    for call in calls:
        try:
            json.loads(call.arguments)
        except ValueError:
            continue
        kept.append(call)
    return kept


def openai_message(m: ChatMessage) -> dict[str, Any]:
    """A message as OpenAI's chat API sends it (tool-call arguments as JSON text)."""
    out = template_message(m)
    for call, raw in zip(out.get("tool_calls", []), m.tool_calls, strict=True):
        call["function"]["arguments"] = raw.arguments
    if m.tool_calls and not m.content:
        out["content"] = None
    return out


def agent_payload(request: GenerationRequest) -> dict[str, Any]:
    """``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``response_format`` for llama-server's chat route.

    Only ``auto`` and ``none`` come this way: a forced choice takes clover-local's route
    (:func:`clover_enforces`)."""
    if forced_tools(request):
        raise ValueError("a forced tool choice takes clover-local's route, not llama-server's chat route")
    out: dict[str, Any] = {}
    if request.tools:
        out["tools"] = [t.as_openai() for t in request.tools]
        out["tool_choice"] = request.tool_choice
        out["parallel_tool_calls"] = request.parallel_tool_calls
    if request.json_schema is not None:
        out.update(schema_fields(request.json_schema))
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
