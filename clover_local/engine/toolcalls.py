"""Tool calls in the model's own words: which format a chat template uses, how tools and earlier calls reach a
template that cannot show them, and how the model's text is split into content and :class:`ToolCall` values.

Two formats, chosen from the template text as llama.cpp's ``common/chat.cpp`` chooses them:

- ``hermes`` (Qwen3, Hermes 2 Pro, and the fallback): ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``
- ``qwen3_coder`` (Qwen3-Coder, Qwen3.5/3.6, Clover's backbone): ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\n
  VALUE\\n</parameter>\\n</function>\\n</tool_call>``

A template that never mentions ``tools`` (llama.cpp built-ins, plain completion, the tiny test models' ChatML)
gets the tools described in a system message and the Hermes format, and earlier calls and results folded into
ordinary text, which is what llama.cpp's generic handler does too.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

from clover_local.engine import grammar
from clover_local.engine.schema_gbnf.shortest import shortest_json
from clover_local.engine.textstream import partial_stop
from clover_local.engine.types import (
    ChatMessage,
    Finished,
    GenerationEvent,
    GenerationRequest,
    TextDelta,
    ToolCall,
    ToolCallMade,
    ToolFormat,
    ToolSpec,
)
from clover_local.errors import RequestRefused

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"


def detect_format(template_source: str | None) -> ToolFormat:
    src = template_source or ""
    if CALL_START in src and "<function=" in src and "<parameter=" in src:
        return "qwen3_coder"
    return "hermes"


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


# --- prompts ----------------------------------------------------------------------------------------------------


def shown_tools(request: GenerationRequest) -> tuple[ToolSpec, ...]:
    """The tools a request shows the model (none with ``tool_choice`` none): what the prompt lists, and what
    replies are searched for calls of."""
    return request.tools if request.tool_choice != "none" else ()


def has_tool_turns(messages: Sequence[ChatMessage]) -> bool:
    """Earlier calls or their results are in the conversation."""
    return any(m.role == "tool" or m.tool_calls for m in messages)


def fallback_messages(
    messages: Sequence[ChatMessage], tools: Sequence[ToolSpec], choice: str
) -> tuple[ChatMessage, ...]:
    """Messages for a template that knows nothing of tools: a system note listing them and the call format,
    earlier calls written as the model would write them, results as user turns (without tools or tool turns,
    the messages as they are)."""
    out: list[ChatMessage] = []
    if tools and choice != "none":
        note = _tools_note(tools)
        if messages and messages[0].role == "system":
            out.append(ChatMessage("system", messages[0].content + "\n\n" + note))
            messages = messages[1:]
        else:
            out.append(ChatMessage("system", note))
    for i, m in enumerate(messages):
        if m.role == "tool":
            result = f"<tool_response>\n{m.content}\n</tool_response>"
            if out and out[-1].role == "user" and i and messages[i - 1].role == "tool":
                out[-1] = ChatMessage("user", out[-1].content + "\n" + result)  # results of one turn's calls
            else:
                out.append(ChatMessage("user", result))
            if i + 1 == len(messages) or messages[i + 1].role != "tool":
                out[-1] = ChatMessage("user", out[-1].content + "\n" + _results_hint(choice))
        elif m.tool_calls:
            calls = "\n".join(format_call_hermes(c) for c in m.tool_calls)
            out.append(ChatMessage("assistant", (m.content + "\n" if m.content else "") + calls))
        else:
            out.append(m)
    return tuple(out)


def _results_hint(choice: str) -> str:
    """What a model without tool syntax is told after the results: without it SmolLM2 135M repeats the results
    back; with it (and ``tool_choice`` none) it answers with them."""
    if choice == "none":
        return "Answer the user's question with these results."
    return "Answer the user's question with these results, or call a function again if you need more."


def _tools_note(tools: Sequence[ToolSpec]) -> str:
    listed = "\n".join(json.dumps(t.as_openai(), ensure_ascii=False) for t in tools)
    return (
        "You may call one or more functions to assist with the user query.\n\n"
        f"You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
        "</tool_call>"
    )


def format_call_hermes(call: ToolCall) -> str:
    args = _arguments_object(call.arguments)
    body = json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)
    return f"{CALL_START}\n{body}\n{CALL_END}"


def _arguments_object(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments else {}
    except ValueError:
        return arguments


def template_message(m: ChatMessage) -> dict[str, Any]:
    """A message as Hugging Face chat templates read it (``tool_calls[].function.arguments`` as a mapping)."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _arguments_object(c.arguments)},
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.name is not None:
        out["name"] = m.name
    return out


def reply_stops(request: GenerationRequest) -> tuple[str, ...]:
    """Stop strings a chat reply with tools needs: the end of the first call when parallel calls are off
    (``parallel_tool_calls`` false: one call at most, and no text written after it)."""
    if shown_tools(request) and not request.parallel_tool_calls:
        return (CALL_END,)
    return ()


ENDS_A_TURN = frozenset({"<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "[/INST]"})
"""The turn markers that close a turn (vocabularies mark them as ends, so a grammar admits them only where the
reply may end); the others open one, and a grammar reads them as text, which a JSON string admits."""


def opens_a_turn(marker: str) -> bool:
    """Whether ``marker`` opens a turn (or a header) rather than closing one (:data:`ENDS_A_TURN`)."""
    return marker not in ENDS_A_TURN


def reply_stop_strings(
    request: GenerationRequest, turn_markers: Sequence[str], *, under_grammar: bool
) -> tuple[str, ...]:
    """The stop strings of a chat reply, for both engines: the request's own, the template's turn markers and
    the end of the one call (:func:`reply_stops`). Under a grammar (a forced call, a JSON schema) the grammar says
    where the reply ends (``root ::= call`` ends after one call): a JSON string may hold a turn-opening marker's
    text or ``</tool_call>`` (the llama-server soak's misses: ``"Paris, France}}`` cut at the model's
    ``</tool_call>`` inside the string), so only the markers that close a turn stay (an engine that writes them
    as text needs them cut off)."""
    if not under_grammar:
        return (*request.stop, *turn_markers, *reply_stops(request))
    return (*request.stop, *(m for m in turn_markers if not opens_a_turn(m)))


def call_grammar(request: GenerationRequest, fmt: ToolFormat) -> str | None:
    """The grammar a forced choice needs (``required`` or one named function); None when the model is free."""
    tools = forced_tools(request)
    if not tools:
        return None
    build = grammar.qwen3_coder_calls_grammar if fmt == "qwen3_coder" else grammar.hermes_calls_grammar
    return build(tools, parallel=request.parallel_tool_calls)


def forced_tools(request: GenerationRequest) -> tuple[ToolSpec, ...]:
    """The tools one of which the reply must call (``required``: any; a name: that one); () when it is free."""
    if not request.tools or request.tool_choice in ("auto", "none"):
        return ()
    if request.tool_choice == "required":
        return request.tools
    return tuple(t for t in request.tools if t.name == request.tool_choice)


SHORTEST_CALL_LIMIT = 65_536
"""Characters: a forced call whose shortest form is longer is refused (its length is known without writing it)."""


def shortest_call(tools: Sequence[ToolSpec], fmt: ToolFormat) -> str:
    """The shortest text the forced-call grammar lets through, over ``tools``: the wrapper, the name, and
    each required argument with its shortest value (``""``, ``0``, ``[]``, the shortest enum value ...).
    Bounded: a schema whose shortest call is over ``SHORTEST_CALL_LIMIT`` characters is refused by length,
    before any of it is written."""
    return min((_shortest_call(t, fmt) for t in tools), key=len)


def _shortest_call(tool: ToolSpec, fmt: ToolFormat) -> str:
    params = tool.parameters or {}
    props: dict[str, Any] = params.get("properties") or {}
    required = [p for p in params.get("required") or [] if p in props]
    if fmt == "qwen3_coder":
        parts = [f"{CALL_START}\n<function={tool.name}>\n"]
        for name in required:
            value = _shortest_value(props[name], tool, root=params)
            # A string is raw text of one character at least; any other value is JSON.
            text = (value or "x") if isinstance(value, str) else json.dumps(value)
            parts.append(f"<parameter={name}>\n{text}\n</parameter>\n")
        return "".join([*parts, f"</function>\n{CALL_END}"])
    args = _shortest_value(params, tool, root=params)
    body = json.dumps({"name": tool.name, "arguments": args}, ensure_ascii=False, separators=(",", ":"))
    return f"{CALL_START}\n{body}\n{CALL_END}"


def _shortest_value(schema: Any, tool: ToolSpec, *, root: Any) -> Any:
    length, value = shortest_json(schema, SHORTEST_CALL_LIMIT, root=root)
    if length > SHORTEST_CALL_LIMIT:
        size = "no finite call" if length == float("inf") else f"at least {int(length)} characters"
        raise RequestRefused(
            f"tool_choice forces a call to {tool.name!r}, and its parameters allow {size} "
            f"(the limit is {SHORTEST_CALL_LIMIT}): minItems or minLength too large.",
            "Lower minItems/minLength in the tool's parameters, or leave tool_choice 'auto'.",
        )
    return value


# --- parsing ----------------------------------------------------------------------------------------------------

# Model output is scanned with str.find, never a backtracking regex: a reply of spaces or of unclosed tags must
# cost time linear in its length (8,000 spaces took 0.8 s through `<tool_call>\s*(.*?)\s*`).
_TAG_NAME_RE = re.compile(r"([^>\n]{1,256})>")
"""A ``<function=NAME>`` or ``<parameter=NAME>`` name: bounded, so scanning many unclosed openers stays linear."""


def _named_sections(text: str, start: str, ends: tuple[str, ...]) -> Iterator[tuple[str, str]]:
    """(name, body) of each ``<tag=NAME>body ... end`` section (one without a name is skipped), the last one may
    run to the end of ``text``; an end in ``ends`` that is itself ``start`` begins the next section. Each string
    is searched for once per occurrence (the next place of each end is remembered), so the scan is linear however
    hostile the text."""
    next_at = dict.fromkeys(ends, -1)
    pos = 0
    while (i := text.find(start, pos)) >= 0:
        body = i + len(start)
        for e in ends:
            if 0 <= next_at[e] < body or next_at[e] == -1:
                next_at[e] = text.find(e, body)
                if next_at[e] < 0:
                    next_at[e] = len(text) + 1  # never again
        j, e = min((at, e) for e, at in next_at.items())
        m = _TAG_NAME_RE.match(text, body, min(j, len(text)))
        if m is not None and m.group(1).strip():
            yield m.group(1).strip(), text[m.end() : min(j, len(text))]
        if j > len(text):
            return
        pos = j if e == start else j + len(e)


JSON_READS = 8
"""Calls a reply may have read as JSON past a ``</tool_call>`` in their strings: each read may run to the end of
the reply, so a hostile one of many unclosed calls stays linear-bounded."""


def _hermes_blocks(text: str) -> list[str]:
    """The body of each ``<tool_call> ... </tool_call>``. A body that is not JSON up to the first closing tag is
    read as JSON from its ``{`` (the decoder knows where its strings end): a model under the call's grammar may
    write ``</tool_call>`` inside a string (``"London, England}}</tool_call>You can use"``), which the grammar
    reads as text, so the call ends at the tag after the JSON. The scan stays linear: the next closing tag is
    searched for once per place, and at most :data:`JSON_READS` bodies are read past it."""
    blocks: list[str] = []
    decoder = json.JSONDecoder()
    never = len(text) + 1
    next_end, pos, reads = -1, 0, 0
    while (i := text.find(CALL_START, pos)) >= 0:
        body = i + len(CALL_START)
        if next_end != never and next_end < body:
            found = text.find(CALL_END, body)
            next_end = found if found >= 0 else never
        if next_end == never:  # the last call, unclosed: to the end of the reply
            blocks.append(text[body:].strip())
            break
        block, after = text[body:next_end].strip(), next_end + len(CALL_END)
        if reads < JSON_READS and not _is_json(block):
            reads += 1
            whole = _json_through_strings(decoder, text, body)
            if whole is not None:
                block, after = whole
        blocks.append(block)
        pos = after
    return blocks


def _is_json(block: str) -> bool:
    try:
        json.loads(block)
    except ValueError:
        return False
    return True


def _json_through_strings(decoder: json.JSONDecoder, text: str, body: int) -> tuple[str, int] | None:
    """The JSON object that starts at ``body`` (after whitespace) and is followed by ``</tool_call>``, and where
    scanning goes on; None when there is none."""
    at = body
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    if not text.startswith("{", at):
        return None
    try:
        _obj, stop = decoder.raw_decode(text, at)
    except ValueError:
        return None
    rest = stop
    while rest < len(text) and text[rest] in " \t\r\n":
        rest += 1
    if not text.startswith(CALL_END, rest):
        return None
    return text[at:stop], rest + len(CALL_END)


def parse_calls(text: str, fmt: ToolFormat, tools: Sequence[ToolSpec]) -> tuple[ToolCall, ...]:
    """The calls in a reply, in order (an unparseable call is skipped)."""
    calls: list[ToolCall] = []
    for block in _hermes_blocks(text):
        call = _parse_block(block, fmt, tools)
        if call is not None:
            calls.append(call)
    return tuple(calls)


def _parse_block(block: str, fmt: ToolFormat, tools: Sequence[ToolSpec]) -> ToolCall | None:
    if block.lstrip().startswith("<function="):
        return _parse_xml(block, tools)
    try:
        obj = json.loads(block)
    except ValueError:
        return _parse_xml(block, tools) if fmt == "qwen3_coder" else None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(new_call_id(), obj["name"], text)


def _parse_xml(block: str, tools: Sequence[ToolSpec]) -> ToolCall | None:
    found = next(_named_sections(block, "<function=", ("</function>",)), None)
    if found is None:
        return None
    name, body = found
    props = _properties(tools, name)
    args: dict[str, Any] = {}
    for pname, raw in _named_sections(body, "<parameter=", ("</parameter>", "<parameter=")):
        raw = raw.removeprefix("\n").removesuffix("\n")
        args[pname] = _xml_value(raw, props.get(pname))
    return ToolCall(new_call_id(), name, json.dumps(args, ensure_ascii=False))


def _properties(tools: Sequence[ToolSpec], name: str) -> dict[str, Any]:
    for t in tools:
        if t.name == name:
            props = (t.parameters or {}).get("properties")
            return props if isinstance(props, dict) else {}
    return {}


def _xml_value(raw: str, schema: Any) -> Any:
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


class CallSplitter:
    """Streams a reply's text until a tool call starts; from there holds text back, and hands out each call
    as soon as its closing tag arrives."""

    def __init__(self, fmt: ToolFormat, tools: Sequence[ToolSpec]) -> None:
        self._fmt = fmt
        self._tools = tools
        self._pending = ""
        self._in_calls = False
        self._calls_text = ""
        self._n_done = 0

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        """Text safe to show now, and calls completed by this piece."""
        if self._in_calls:
            self._calls_text += text
            return "", self._new_complete_calls(final=False)
        self._pending += text
        at = self._pending.find(CALL_START)
        if at >= 0:
            shown, self._calls_text = self._pending[:at], self._pending[at:]
            self._pending, self._in_calls = "", True
            return shown.rstrip(), self._new_complete_calls(final=False)
        keep = partial_stop(self._pending, (CALL_START,))
        shown = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(shown) :]
        return shown, []

    def finish(self, *, truncated: bool = False) -> tuple[str, list[ToolCall]]:
        """What is left at the end: held-back text, and a last call the model ended without its closing tag.
        ``truncated`` (the reply ran out of tokens): an unfinished call is withheld, never shown as text or as a
        call with half its arguments."""
        if not self._in_calls:
            shown, self._pending = self._pending, ""
            return shown, []
        if truncated:
            return "", []
        calls = self._new_complete_calls(final=True)
        if self._n_done == 0:  # it looked like a call but was not one: give the text back
            return self._calls_text, []
        return "", calls

    def _new_complete_calls(self, *, final: bool) -> list[ToolCall]:
        text = self._calls_text
        if not final:
            end = text.rfind(CALL_END)
            if end < 0:
                return []
            text = text[: end + len(CALL_END)]
        calls = parse_calls(text, self._fmt, self._tools)
        fresh = list(calls[self._n_done :])
        self._n_done = len(calls)
        return fresh


def split_events(
    events: Iterator[GenerationEvent], fmt: ToolFormat, tools: Sequence[ToolSpec]
) -> Iterator[GenerationEvent]:
    """An engine's text events with the tool calls taken out of the text and sent as :class:`ToolCallMade`;
    the finish reason becomes ``tool_calls`` when the reply made any."""
    out: list[Any] = []
    split = CallSink(fmt, tools, out.append)
    for event in events:
        split(event)
        yield from out
        out.clear()


class CallSink:
    """:func:`split_events` for a sink an engine's own thread calls: each item, split, goes on to ``sink``
    (items that are not text or the end, an exception say, pass as they are)."""

    def __init__(self, fmt: ToolFormat, tools: Sequence[ToolSpec], sink: Callable[[object], None]) -> None:
        self._splitter = CallSplitter(fmt, tools)
        self._sink = sink
        self._calls = 0

    def __call__(self, item: object) -> None:
        if isinstance(item, TextDelta):
            text, calls = self._splitter.push(item.text)
        elif isinstance(item, Finished):
            text, calls = self._splitter.finish(truncated=item.stats.finish_reason == "length")
        else:
            self._sink(item)
            return
        if text:
            self._sink(TextDelta(text))
        for call in calls:
            self._sink(ToolCallMade(self._calls, call))
            self._calls += 1
        if isinstance(item, Finished):
            stats = item.stats
            if self._calls and stats.finish_reason == "stop":
                stats = replace(stats, finish_reason="tool_calls")
            self._sink(Finished(stats))
