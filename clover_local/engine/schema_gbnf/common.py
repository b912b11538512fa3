"""Helpers the schema walk and the shortest-value search share: literals, references, keyword readers."""

from __future__ import annotations

import json
import re
from typing import Any

from clover_local.engine.schema_gbnf.limits import SchemaRefused

INVALID_RULE_CHARS = re.compile(r"[^a-zA-Z0-9-]+")
_LITERAL_ESCAPES = {"\r": "\\r", "\n": "\\n", '"': '\\"', "\\": "\\\\"}
_LITERAL_ESCAPE_RE = re.compile(r'[\r\n"\\]')


def format_literal(text: str) -> str:
    return '"' + _LITERAL_ESCAPE_RE.sub(lambda m: _LITERAL_ESCAPES[m.group(0)], text) + '"'


def constant(value: Any) -> str:
    return format_literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


class Document:
    """One schema document: the root its ``#/...`` references resolve against."""

    def __init__(self, root: Any, prefix: str) -> None:
        self.root = root
        self.prefix = prefix

    def resolve(self, ref: str, path: str) -> Any:
        target = self.root
        for token in ref[1:].split("/")[1:] if ref != "#" else []:
            token = token.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and token in target:
                target = target[token]
            elif isinstance(target, list) and token.isdigit() and int(token) < len(target):
                target = target[int(token)]
            else:
                raise SchemaRefused("$ref", path, f"cannot resolve {ref!r}: {token!r} not found.")
        return target


def build_repetition(item: str, lo: int, hi: int | None, sep: str = "") -> str:
    """llama.cpp's ``build_repetition`` (``hi`` None: no maximum)."""
    if hi == 0:
        return ""
    if lo == 0 and hi == 1:
        return f"{item}?"
    if not sep:
        if lo == 1 and hi is None:
            return f"{item}+"
        if lo == 0 and hi is None:
            return f"{item}*"
        return f"{item}{{{lo},{'' if hi is None else hi}}}"
    result = item + " " + build_repetition(f"({sep} {item})", max(lo - 1, 0), None if hi is None else hi - 1)
    return f"({result})?" if lo == 0 else result


def class_char(ch: str) -> str:
    return {"\\": "\\\\", "]": "\\]", "-": "\\-", "\n": "\\n", "\r": "\\r", '"': '\\"', "^": "\\^"}.get(
        ch, ch
    )


def schema_list(value: Any, key: str, path: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise SchemaRefused(key, path, "must be a non-empty array of schemas.")
    return value


def properties_of(schema: dict[str, Any], path: str) -> list[tuple[str, Any]]:
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        raise SchemaRefused("properties", path, "must be an object.")
    return list(props.items())


def required_of(schema: dict[str, Any], path: str) -> set[str]:
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise SchemaRefused("required", path, "must be an array of property names.")
    return set(required)


def count_of(schema: dict[str, Any], key: str, path: str, default: int | None) -> Any:
    if key not in schema:
        return default
    value = schema[key]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaRefused(key, path, "must be a non-negative integer.")
    return value
