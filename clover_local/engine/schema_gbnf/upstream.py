"""What llama-server's own converter (the C++ ``common/json-schema.cpp`` of the pinned llama.cpp) accepts but
does not enforce: a number's bounds and ``multipleOf``, the string formats besides date/time/date-time/uuid,
``\\d``/``\\w``/``\\s`` in patterns (it widens an unsupported pattern to any string), lengths beside a pattern or
format, ``allOf`` beside ``properties``. A schema using one of them is sent to llama-server as clover-local's
grammar instead, so a ``response_format`` it accepts is enforced; any other schema goes to llama-server as it
came, held to none of the embedded engine's limits."""

from __future__ import annotations

from typing import Any

_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_UPSTREAM_FORMATS = {"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
_OWN_FORMATS = {"email", "hostname", "ipv4", "ipv6", "duration"}


def unenforced_upstream(schema: Any, depth: int = 0) -> str | None:
    """The first keyword of ``schema`` (anywhere in it) that llama-server would accept and not enforce."""
    if depth > 64:
        return "$"
    if isinstance(schema, list):
        return next((k for s in schema if (k := unenforced_upstream(s, depth + 1))), None)
    if not isinstance(schema, dict):
        return None
    kind = schema.get("type")
    kinds: list[Any] = kind if isinstance(kind, list) else [kind]
    if "number" in kinds and any(k in schema for k in _NUMBER_KEYS):
        return str(next(k for k in schema if k in _NUMBER_KEYS))
    if "integer" in kinds and "multipleOf" in schema:
        return "multipleOf"
    if schema.get("format") in _OWN_FORMATS:
        return "format"
    pattern = schema.get("pattern")
    if isinstance(pattern, str) and any(e in pattern for e in ("\\d", "\\w", "\\s", "\\D", "\\W", "\\S")):
        return "pattern"
    shaped = "pattern" in schema or schema.get("format") in _UPSTREAM_FORMATS
    if shaped and ("minLength" in schema or "maxLength" in schema):
        return "minLength" if "minLength" in schema else "maxLength"
    if "allOf" in schema and "properties" in schema:
        return "allOf"
    for key, value in schema.items():
        if key in ("enum", "const", "default", "examples"):
            continue
        if isinstance(value, dict | list) and (found := unenforced_upstream(value, depth + 1)):
            return found
    return None
