"""GBNF grammars for structured output and forced tool calls, built from JSON schemas with llama-cpp-python's
converter (``llama_cpp.llama_grammar.SchemaConverter``, a port of llama.cpp's ``json_schema_to_grammar``).

Pure text in, text out: the grammar sampler that enforces them lives in :mod:`clover_local.engine.sampling`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from clover_local.engine.types import ToolSpec
from clover_local.errors import RequestRefused

ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


def _converter() -> Any:
    from llama_cpp.llama_grammar import SchemaConverter

    return SchemaConverter(  # type: ignore[no-untyped-call]
        prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False
    )


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


MAX_INT_RANGE = 4096
"""Integer ranges up to this many values are enforced as alternatives (the converter has no ``minimum``)."""
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def enforceable(schema: Any) -> Any:
    """``schema`` with what llama-cpp-python's converter ignores made explicit: a bounded integer becomes the
    ``enum`` of its values. A bound the grammar cannot enforce is refused by name rather than ignored."""
    if isinstance(schema, list):
        return [enforceable(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _enforceable_field(k, v) for k, v in schema.items()}
    bounds = {k: out.pop(k) for k in _BOUNDS if k in out}
    if not bounds:
        return out
    if out.get("type") != "integer" or "enum" in out:
        raise RequestRefused(
            f"The schema bounds a {out.get('type', 'value')} with {', '.join(bounds)}: the embedded engine's grammar "
            "enforces bounds only on integers.",
            "Drop the bound, use an enum, or serve with --engine llama-server.",
        )
    first = _bound(bounds.get("minimum"), bounds.get("exclusiveMinimum"), +1)
    last = _bound(bounds.get("maximum"), bounds.get("exclusiveMaximum"), -1)
    if first is None or last is None:
        raise RequestRefused(
            "The schema bounds an integer on one side only: the embedded engine's grammar enforces integer "
            f"bounds as a range of at most {MAX_INT_RANGE} values.",
            "Give both minimum and maximum, or serve with --engine llama-server.",
        )
    if last - first + 1 > MAX_INT_RANGE or last < first:
        raise RequestRefused(
            f"The integer range {first}..{last} is wider than the {MAX_INT_RANGE} values the embedded engine's "
            "grammar enforces.",
            "Narrow it, or serve with --engine llama-server.",
        )
    return {**{k: v for k, v in out.items() if k != "type"}, "enum": list(range(first, last + 1))}


def _enforceable_field(key: str, value: Any) -> Any:
    if key in ("enum", "const", "default", "examples"):
        return value
    if key in ("properties", "$defs", "definitions", "patternProperties") and isinstance(value, dict):
        return {name: enforceable(sub) for name, sub in value.items()}
    return enforceable(value)


def _bound(inclusive: Any, exclusive: Any, step: int) -> int | None:
    """The last allowed integer on one side (``step`` +1 for a lower bound, -1 for an upper one); draft-4
    boolean ``exclusiveMinimum``/``exclusiveMaximum`` included."""
    import math

    if isinstance(exclusive, bool):
        exclusive, inclusive = (inclusive if exclusive else None), (None if exclusive else inclusive)
    if isinstance(inclusive, int | float) and not isinstance(inclusive, bool):
        return math.ceil(inclusive) if step > 0 else math.floor(inclusive)
    if isinstance(exclusive, int | float):
        return math.floor(exclusive) + 1 if step > 0 else math.ceil(exclusive) - 1
    return None


def json_grammar(schema: dict[str, Any] | None) -> str:
    """A grammar whose sentences are exactly the JSON texts matching ``schema`` (None or ``{}``: any object)."""
    converter = _converter()
    try:
        resolved = converter.resolve_refs(enforceable(schema or ANY_JSON_OBJECT), "request")
        converter.visit(resolved, "")
        return str(converter.format_grammar())
    except (
        Exception
    ) as exc:  # the converter raises plain exceptions (ValueError, KeyError, ...) on bad schemas
        raise RequestRefused(f"This JSON schema cannot be turned into a grammar: {exc}") from None


def call_object_schema(tools: Sequence[ToolSpec]) -> dict[str, Any]:
    """``{"name": ..., "arguments": {...}}`` for any of ``tools`` (Hermes / Qwen3 JSON tool calls)."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": t.name},
                "arguments": enforceable(t.parameters or ANY_JSON_OBJECT),
            },
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return variants[0] if len(variants) == 1 else {"anyOf": variants}


def hermes_calls_grammar(tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    """``<tool_call>\\n{json}\\n</tool_call>``, once (or repeated when ``parallel``), then the end of the reply."""
    converter = _converter()
    try:
        converter.visit(converter.resolve_refs(call_object_schema(tools), "request"), "call-json")
    except Exception as exc:
        raise RequestRefused(f"A tool's parameters cannot be turned into a grammar: {exc}") from None
    call = 'call ::= "<tool_call>\\n" call-json "\\n</tool_call>"'
    root = 'root ::= call ("\\n" call)*' if parallel else "root ::= call"
    return "\n".join([root, call, str(converter.format_grammar())])


def qwen3_coder_calls_grammar(tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    """Qwen3-Coder / Qwen3.5 XML calls: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
    </function>\\n</tool_call>``. String values are raw text; other values are JSON of their schema."""
    converter = _converter()
    functions: list[str] = []
    for i, tool in enumerate(tools):
        params = tool.parameters or {}
        props: dict[str, Any] = params.get("properties") or {}
        required = [p for p in params.get("required") or [] if p in props]
        parts = [_literal(f"<function={tool.name}>\n")]
        for j, name in enumerate(required):
            rule = f"fn{i}-p{j}"
            schema = props[name] if isinstance(props[name], dict) else {}
            converter._add_rule(rule, _xml_value_rule(converter, schema, rule))
            parts += [_literal(f"<parameter={name}>\n"), rule, _literal("\n</parameter>\n")]
        parts.append(_literal("</function>"))
        functions.append(" ".join(parts))
    fn = "fn ::= " + " | ".join(f"( {f} )" for f in functions)
    call = 'call ::= "<tool_call>\\n" fn "\\n</tool_call>"'
    root = 'root ::= call ("\\n" call)*' if parallel else "root ::= call"
    return "\n".join([root, call, fn, str(converter.format_grammar())])


def _xml_value_rule(converter: Any, schema: dict[str, Any], name: str) -> str:
    if schema.get("type") == "string" and "enum" not in schema and "const" not in schema:
        limit = schema.get("maxLength")
        return f"[^<\\n]{{1,{int(limit)}}}" if isinstance(limit, int) and limit > 0 else "[^<\\n]+"
    if schema.get("type") == "string":
        options = schema.get("enum") or [schema.get("const")]
        return " | ".join(_literal(str(o)) for o in options)
    try:
        return str(converter.visit(converter.resolve_refs(enforceable(schema), "request"), f"{name}-json"))
    except Exception as exc:
        raise RequestRefused(f"A tool's parameters cannot be turned into a grammar: {exc}") from None
