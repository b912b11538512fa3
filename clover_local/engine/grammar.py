"""GBNF grammars for structured output and forced tool calls, built from JSON schemas with clover-local's own
port of llama.cpp's converter (:mod:`clover_local.engine.schema_gbnf`).

Pure text in, text out: the grammar sampler that enforces them lives in :mod:`clover_local.engine.sampling`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from clover_local.engine.schema_gbnf import Converter, schema_grammar
from clover_local.engine.schema_gbnf.common import format_literal
from clover_local.engine.types import ToolSpec

ANY_JSON_OBJECT: dict[str, Any] = {"type": "object"}


def _literal(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def json_grammar(schema: dict[str, Any] | None) -> str:
    """A grammar whose sentences are JSON texts matching ``schema`` (None or ``{}``: any object); a schema it
    cannot enforce, or one over its limits, is a ``SchemaRefused`` naming the keyword and path."""
    return schema_grammar(schema or ANY_JSON_OBJECT)


def hermes_calls_grammar(tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``, once (or repeated when ``parallel``),
    then the end of the reply. Each tool's parameters are a schema document of their own, so their ``$ref``s
    resolve against them."""
    converter = Converter()
    variants = []
    for i, tool in enumerate(tools):
        args = converter.visit_document(
            tool.parameters or ANY_JSON_OBJECT, f"args{i}" if len(tools) > 1 else "args"
        )
        name = format_literal(_literal(tool.name))
        variants.append(
            f'"{{" space "\\"name\\"" space ":" space {name} "," space "\\"arguments\\"" space ":" space {args} space "}}"'
        )
    converter.add_rule("call-json", " | ".join(f"( {v} )" for v in variants))
    return "\n".join([*_calls("call-json", parallel), converter.format_grammar()])


def qwen3_coder_calls_grammar(tools: Sequence[ToolSpec], *, parallel: bool) -> str:
    """Qwen3-Coder / Qwen3.5 XML calls: ``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n
    </function>\\n</tool_call>``. String values are raw text; other values are JSON of their schema."""
    converter = Converter()
    functions: list[str] = []
    for i, tool in enumerate(tools):
        params = tool.parameters or {}
        props: dict[str, Any] = params.get("properties") or {}
        required = [p for p in params.get("required") or [] if p in props]
        parts = [_literal(f"<function={tool.name}>\n")]
        for j, name in enumerate(required):
            rule = f"fn{i}-p{j}"
            schema = props[name] if isinstance(props[name], dict) else {}
            converter.add_rule(rule, _xml_value_rule(converter, schema, rule, params))
            parts += [_literal(f"<parameter={name}>\n"), rule, _literal("\n</parameter>\n")]
        parts.append(_literal("</function>"))
        functions.append(" ".join(parts))
    fn = "fn ::= " + " | ".join(f"( {f} )" for f in functions)
    return "\n".join([*_calls("fn", parallel), fn, str(converter.format_grammar())])


def _calls(body: str, parallel: bool) -> tuple[str, str]:
    """``root`` (one call, or several when ``parallel``) and ``call``: ``body`` wrapped in the call tags."""
    root = 'root ::= call ("\\n" call)*' if parallel else "root ::= call"
    return root, f'call ::= "<tool_call>\\n" {body} "\\n</tool_call>"'


def _xml_value_rule(converter: Converter, schema: dict[str, Any], name: str, params: dict[str, Any]) -> str:
    if schema.get("type") == "string" and "enum" not in schema and "const" not in schema:
        limit = schema.get("maxLength")
        if isinstance(limit, int) and limit > 0:
            return converter.repetition("[^<\\n]", 1, limit, where=("maxLength", f"#/properties/{name}"))
        return "[^<\\n]+"
    if schema.get("type") == "string":
        options = schema.get("enum") or [schema.get("const")]
        return " | ".join(_literal(str(o)) for o in options)
    return converter.visit_document(schema, f"{name}-json", root=params)
