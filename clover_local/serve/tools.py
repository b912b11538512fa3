"""OpenAI's agent fields in, checked: ``tools``, ``tool_choice``, ``parallel_tool_calls``, ``response_format``,
assistant ``tool_calls`` and ``tool`` messages; tool calls back out in OpenAI's shapes.

Every problem names its field in a 400 (``ApiError``); nothing is silently dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from clover_local.engine import toolcalls
from clover_local.engine.types import ChatMessage, GenerationRequest, ToolCall, ToolFormat, ToolSpec
from clover_local.serve import api_errors as oa
from clover_local.serve.schema_check import check_schema

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


def parse_tools(raw: Any, param: str = "tools") -> tuple[ToolSpec, ...]:
    """``[{"type": "function", "function": {"name", "description", "parameters"}}]``."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise oa.ApiError(400, f"'{param}' must be a list of tools.", param=param, code="invalid_tools")
    tools: list[ToolSpec] = []
    for i, item in enumerate(raw):
        p = f"{param}[{i}]"
        if (
            not isinstance(item, dict)
            or item.get("type") != "function"
            or not isinstance(item.get("function"), dict)
        ):
            raise oa.ApiError(
                400,
                f"{p} must be {{'type': 'function', 'function': {{...}}}}; only function tools are supported.",
                param=p,
                code="invalid_tools",
            )
        fn = item["function"]
        tools.append(tool_spec(fn.get("name"), fn.get("description"), fn.get("parameters"), f"{p}.function"))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise oa.ApiError(
            400, f"'{param}' has two tools with the same name.", param=param, code="invalid_tools"
        )
    return tuple(tools)


def tool_spec(name: Any, description: Any, parameters: Any, param: str) -> ToolSpec:
    """One checked tool; shared by the chat, Responses and Messages APIs."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise oa.ApiError(
            400,
            f"{param}.name must be 1-64 letters, digits, '_', '.' or '-' (got {name!r}).",
            param=f"{param}.name",
            code="invalid_tools",
        )
    if description is not None and not isinstance(description, str):
        raise oa.ApiError(400, f"{param}.description must be a string.", param=f"{param}.description")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    check_schema(parameters, f"{param}.parameters")
    if parameters.get("type", "object") != "object":
        raise oa.ApiError(
            400,
            f"{param}.parameters must describe an object (type 'object').",
            param=f"{param}.parameters",
            code="invalid_tools",
        )
    return ToolSpec(name=name, description=description or "", parameters=parameters)


def parse_tool_choice(raw: Any, tools: tuple[ToolSpec, ...], param: str = "tool_choice") -> str:
    """``auto``, ``none``, ``required``, or a function name (from ``{"type": "function", "function": {"name"}}``)."""
    if raw is None:
        return "auto"
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise oa.ApiError(400, "tool_choice 'required' needs 'tools'.", param=param)
        return str(raw)
    name = None
    if isinstance(raw, dict) and raw.get("type") == "function":
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else raw.get("name")
    if not isinstance(name, str):
        raise oa.ApiError(
            400,
            f"'{param}' must be 'auto', 'none', 'required' or {{'type': 'function', 'function': {{'name': ...}}}}.",
            param=param,
        )
    if name not in {t.name for t in tools}:
        raise oa.ApiError(400, f"'{param}' names {name!r}, which is not one of the tools.", param=param)
    return name


def parse_response_format(raw: Any, param: str = "response_format") -> dict[str, Any] | None:
    """The JSON schema a ``response_format`` asks for (``{}`` for ``json_object``), or None for text."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise oa.ApiError(400, f"'{param}' must be an object with a 'type'.", param=param)
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise oa.ApiError(
                400,
                f"'{param}.json_schema' must be {{'name': ..., 'schema': {{...}}, 'strict': true}}.",
                param=f"{param}.json_schema",
            )
        schema = spec.get("schema") or {}
        check_schema(schema, f"{param}.json_schema.schema")
        return schema
    raise oa.ApiError(
        400,
        f"{param}.type {kind!r} is not supported; use 'text', 'json_object' or 'json_schema'.",
        param=f"{param}.type",
    )


def parse_tool_message(raw: dict[str, Any], param: str) -> ChatMessage:
    """A ``tool`` message: the result of one earlier call."""
    call_id = raw.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise oa.ApiError(
            400,
            f"{param}.tool_call_id must name the call this is the result of.",
            param=f"{param}.tool_call_id",
        )
    content = text_content(raw.get("content"), f"{param}.content")
    name = raw.get("name")
    return ChatMessage("tool", content, tool_call_id=call_id, name=name if isinstance(name, str) else None)


def parse_assistant_calls(raw: Any, param: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls``, fed back from an earlier turn."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise oa.ApiError(400, f"{param} must be a list of calls.", param=param)
    calls: list[ToolCall] = []
    for i, c in enumerate(raw):
        p = f"{param}[{i}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise oa.ApiError(
                400,
                f"{p} must be {{'id', 'type': 'function', 'function': {{'name', 'arguments'}}}}.",
                param=p,
            )
        args = fn.get("arguments", "{}")
        if not isinstance(args, str):
            args = json.dumps(args)
        try:
            json.loads(args or "{}")
        except ValueError:
            raise oa.ApiError(
                400, f"{p}.function.arguments is not JSON text.", param=f"{p}.function.arguments"
            ) from None
        call_id = c.get("id")
        calls.append(ToolCall(call_id if isinstance(call_id, str) else f"call_{i}", fn["name"], args or "{}"))
    return tuple(calls)


def check_tool_results(messages: tuple[ChatMessage, ...], params: Sequence[str] | None = None) -> None:
    """Every ``tool`` message answers a call an earlier assistant message made. ``params[i]`` names the field
    that holds message i's call id in the client's request (default: OpenAI's ``messages[i].tool_call_id``)."""
    made: set[str] = set()
    for i, m in enumerate(messages):
        made.update(c.id for c in m.tool_calls)
        if m.role == "tool" and m.tool_call_id not in made:
            param = params[i] if params is not None else f"messages[{i}].tool_call_id"
            raise oa.ApiError(
                400,
                f"{param} {m.tool_call_id!r} answers a call that no earlier assistant message made.",
                param=param,
                code="invalid_tool_message",
            )


def text_content(content: Any, param: str) -> str:
    """A message's content: text, or a list of text parts (``[{"type": "text", "text": "..."}]``) joined; a 400
    for anything else (an image part, a number)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    raise oa.ApiError(400, f"{param} must be a string or a list of text parts.", param=param)


# --- out --------------------------------------------------------------------------------------------------------


def openai_call(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }
    if index is not None:
        out["index"] = index
    return out


def parse_flag(raw: Any, param: str, *, default: bool) -> bool:
    """A true/false field (``parallel_tool_calls``, Anthropic's ``disable_parallel_tool_use``), the same on
    every route: absent or null is ``default``; anything but a JSON boolean (``"false"``, ``0``) is a 400, never
    read by its truthiness."""
    if raw is None:
        return default
    if not isinstance(raw, bool):
        raise oa.ApiError(400, f"'{param}' must be true or false (got {raw!r}).", param=param)
    return raw


def agent_fields(body: dict[str, Any]) -> dict[str, Any]:
    """The ``GenerationRequest`` fields of a chat body's ``tools``, ``tool_choice``, ``parallel_tool_calls`` and
    ``response_format``."""
    tools = parse_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = parse_flag(body.get("parallel_tool_calls"), "parallel_tool_calls", default=False)
    schema = parse_response_format(body.get("response_format"))
    if schema is not None and tools and choice != "none":
        raise oa.ApiError(
            400,
            "'response_format' with 'tools' is not supported: the reply is either JSON or tool calls.",
            param="response_format",
        )
    return {"tools": tools, "tool_choice": choice, "parallel_tool_calls": parallel, "json_schema": schema}


def tool_prompt_tokens(request: GenerationRequest, count: Callable[[str], int]) -> int:
    """About how many prompt tokens the tools and earlier calls add (for the context check)."""
    texts = [json.dumps(t.as_openai()) for t in request.tools if request.tool_choice != "none"]
    texts += [c.arguments + c.name for m in request.messages or () for c in m.tool_calls]
    return count("\n".join(texts)) + 10 * len(texts) if texts else 0  # one count: one llama-server round trip


def check_forced_call_fits(
    request: GenerationRequest, fmt: ToolFormat, count: Callable[[str], int], param: str
) -> None:
    """A forced tool call (``required``, a named function) must fit in the reply: a 400 naming ``param`` when
    even the shortest call the grammar allows (``toolcalls.shortest_call``) is longer than ``max_tokens``,
    rather than a reply cut inside the call."""
    tools = toolcalls.forced_tools(request)
    if not tools:
        return
    need = count(toolcalls.shortest_call(tools, fmt))
    if request.max_tokens < need:
        names = " or ".join(repr(t.name) for t in tools)
        raise oa.ApiError(
            400,
            f"tool_choice forces a call to {names}, and the shortest such call is {need} tokens for this model, "
            f"but '{param}' (or the room left in the context) allows {request.max_tokens}. "
            f"Raise '{param}' to at least {need}.",
            param=param,
            code="max_tokens_too_small",
        )
