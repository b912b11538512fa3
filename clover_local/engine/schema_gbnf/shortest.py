"""The shortest JSON value a schema's grammar allows, found in time and memory bounded by the schema's size:
its length is computed first (a number, however large), and the value is written only when it is short.
``minItems`` 30 five levels deep is a length of ~24 million, known in microseconds, and never a string."""

from __future__ import annotations

import json
import math
from typing import Any

from clover_local.engine.schema_gbnf import numbers
from clover_local.engine.schema_gbnf.common import Document
from clover_local.errors import RequestRefused

INFINITE = math.inf


class _Shortest:
    def __init__(self, root: Any) -> None:
        self.doc = Document(root, "")
        # By id: a schema is kept with its length, so no other dict (the ``{**s, "type": t}`` made for each of a
        # type list's types) can take its id while the memo holds it.
        self.memo: dict[int, tuple[Any, float]] = {}
        self.busy: set[int] = set()

    def length(self, schema: Any, depth: int = 0) -> float:
        """Characters of the shortest compact JSON ``schema`` accepts (inf: none found, or a cycle)."""
        if depth > 64:
            return INFINITE
        if not isinstance(schema, dict):
            return 4.0  # true (any value): null
        key = id(schema)
        if key in self.memo:
            return self.memo[key][1]
        if key in self.busy:
            return INFINITE
        self.busy.add(key)
        try:
            value = self._length(schema, depth)
        finally:
            self.busy.discard(key)
        self.memo[key] = (schema, value)
        return value

    def _length(self, s: dict[str, Any], depth: int) -> float:
        if isinstance(s.get("$ref"), str) and s["$ref"].startswith("#"):
            try:
                return self.length(self.doc.resolve(s["$ref"], "#"), depth + 1)
            except RequestRefused:
                return INFINITE
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list) and s[key]:
                return min((self.length(a, depth + 1) for a in s[key]), default=INFINITE)
        if "const" in s:
            return float(len(_dump(s["const"])))
        if isinstance(s.get("enum"), list) and s["enum"]:
            return float(min(len(_dump(v)) for v in s["enum"]))
        if isinstance(s.get("allOf"), list) and s["allOf"]:
            return max((self.length(a, depth + 1) for a in s["allOf"]), default=INFINITE)
        kind = s.get("type")
        if isinstance(kind, list):
            return min((self.length({**s, "type": t}, depth + 1) for t in kind), default=INFINITE)
        if kind == "object" or (kind is None and "properties" in s):
            props: dict[str, Any] = s["properties"] if isinstance(s.get("properties"), dict) else {}
            required = [k for k in s.get("required") or [] if k in props]
            return (
                2.0
                + sum(len(_dump(k)) + 1 + self.length(props[k], depth + 1) for k in required)
                + max(len(required) - 1, 0)
            )
        if kind == "array":
            n = _int(s.get("minItems"))
            prefix = s.get("prefixItems")
            if isinstance(prefix, list):
                return 2.0 + sum(self.length(p, depth + 1) for p in prefix) + max(len(prefix) - 1, 0)
            return 2.0 + n * self.length(s.get("items", True), depth + 1) + max(n - 1, 0) if n else 2.0
        if kind == "string":
            return 2.0 + _shortest_string(s)
        if kind in ("integer", "number"):
            return float(len(_dump(_nearest_zero(s))))
        return {"boolean": 4.0, "null": 4.0}.get(str(kind), 1.0)

    def value(self, schema: Any) -> Any:
        """A shortest value (call only when its length is small: it is written out)."""
        if not isinstance(schema, dict):
            return None
        s = schema
        if isinstance(s.get("$ref"), str):
            return self.value(self.doc.resolve(s["$ref"], "#"))
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list) and s[key]:
                return self.value(min(s[key], key=self.length))
        if "const" in s:
            return s["const"]
        if isinstance(s.get("enum"), list) and s["enum"]:
            return min(s["enum"], key=lambda v: len(_dump(v)))
        if isinstance(s.get("allOf"), list) and s["allOf"]:
            merged: dict[str, Any] = {}
            for part in s["allOf"]:
                v = self.value(part)
                if isinstance(v, dict):
                    merged.update(v)
            return merged
        kind = s.get("type")
        if isinstance(kind, list):
            return self.value(min(({**s, "type": t} for t in kind), key=self.length)) if kind else None
        if kind == "object" or (kind is None and "properties" in s):
            props: dict[str, Any] = s["properties"] if isinstance(s.get("properties"), dict) else {}
            return {k: self.value(props[k]) for k in s.get("required") or [] if k in props}
        if kind == "array":
            prefix = s.get("prefixItems")
            if isinstance(prefix, list):
                return [self.value(p) for p in prefix]
            return [self.value(s.get("items", True))] * _int(s.get("minItems"))
        if kind == "string":
            return "x" * _shortest_string(s)  # its length is what counts: a forced call is measured by it
        if kind in ("integer", "number"):
            return _nearest_zero(s)
        return {"boolean": True, "null": None}.get(str(kind), 0)


def _shortest_string(s: dict[str, Any]) -> int:
    """Characters of the shortest string: ``minLength``, and the shortest match of ``pattern`` (``a{1000000000}``
    is a billion characters, enforced by nested repetitions in the grammar, however short ``minLength`` is)."""
    shortest = _int(s.get("minLength"))
    if isinstance(s.get("pattern"), str):
        from contextlib import suppress

        from clover_local.engine.schema_gbnf.regex_facts import Unsupported, width

        with suppress(Unsupported):  # a pattern the converter cannot read is refused there, by name
            shortest = max(shortest, width(s["pattern"])[0])
    return shortest


def shortest_json(schema: Any, limit: int, *, root: Any = None) -> tuple[float, Any]:
    """(length of the shortest compact JSON ``schema`` allows, that value or None when over ``limit``);
    ``$ref``s resolve against ``root`` (default: ``schema``)."""
    finder = _Shortest(schema if root is None else root)
    length = finder.length(schema)
    return length, finder.value(schema) if length <= limit else None


def _dump(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _nearest_zero(s: dict[str, Any]) -> int | float:
    """The integer or number nearest zero that ``numbers.number_rule``'s grammar writes for ``s``: an integer in
    range (a multiple of a whole ``multipleOf``), else the decimal ``k.1`` nearest zero."""
    try:
        lo, lo_excl, hi, hi_excl = numbers.bounds(s, "#")
    except RequestRefused:
        return 0
    first, last = numbers.whole_range(lo, lo_excl, hi, hi_excl)
    raw = s.get("multipleOf")
    step = 1
    if isinstance(raw, int | float) and not isinstance(raw, bool) and raw >= 1 and float(raw).is_integer():
        step = int(raw)
    if first is None or last is None or first <= last:
        if (first is None or first <= 0) and (last is None or last >= 0):
            return 0
        if first is not None and first > 0:
            return -(-first // step) * step
        return (last // step) * step if last is not None else 0
    if lo is not None and lo >= 0:
        return math.ceil(lo) + 0.1
    return -(math.ceil(-hi) + 0.1) if hi is not None else 0
