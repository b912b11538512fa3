"""The shortest JSON value a schema's grammar allows, found in time and memory bounded by the schema's size:
its length is computed first (a number, however large), and the value is written only when it is short.
``minItems`` 30 five levels deep is a length of ~24 million, known in microseconds, and never a string."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from clover_local.engine.schema_gbnf import numbers
from clover_local.engine.schema_gbnf.common import Document
from clover_local.engine.schema_gbnf.regex_facts import Unsupported, width
from clover_local.errors import RequestRefused

INFINITE = math.inf


Found = tuple[float, Callable[[], Any]]
"""The length of a schema's shortest compact JSON (inf: none found, or a cycle), and how to write that value."""


class _Shortest:
    def __init__(self, root: Any) -> None:
        self.doc = Document(root, "")
        # By id: a schema is kept with what was found, so no other dict (the ``{**s, "type": t}`` made for each of
        # a type list's types) can take its id while the memo holds it.
        self.memo: dict[int, tuple[Any, Found]] = {}
        self.busy: set[int] = set()

    def walk(self, schema: Any, depth: int = 0) -> Found:
        if depth > 64:
            return INFINITE, lambda: self.walk(schema)[1]()
        if not isinstance(schema, dict):
            return 4.0, lambda: None  # true (any value): null
        key = id(schema)
        if key in self.memo:
            return self.memo[key][1]
        if key in self.busy:
            return INFINITE, lambda: self.walk(schema)[1]()
        self.busy.add(key)
        try:
            found = self._walk(schema, depth)
        finally:
            self.busy.discard(key)
        self.memo[key] = (schema, found)
        return found

    def _walk(self, s: dict[str, Any], depth: int) -> Found:
        ref = s.get("$ref")
        if not isinstance(ref, str):
            return self._by_keyword(s, depth)

        def target() -> Any:
            return self.walk(self.doc.locate(ref, "#")[0], depth + 1)[1]()

        if not ref.startswith("#"):  # measured by its other keywords, written as what it resolves to
            return self._by_keyword(s, depth)[0], target
        try:
            return self.walk(self.doc.locate(ref, "#")[0], depth + 1)[0], target
        except RequestRefused:
            return INFINITE, target

    def _by_keyword(self, s: dict[str, Any], depth: int) -> Found:
        for key in ("anyOf", "oneOf"):
            if isinstance(s.get(key), list) and s[key]:
                return min((self.walk(a, depth + 1) for a in s[key]), key=_length)
        if "const" in s:
            return float(len(_dump(s["const"]))), lambda: s["const"]
        if isinstance(s.get("enum"), list) and s["enum"]:
            shortest = min(s["enum"], key=lambda v: len(_dump(v)))
            return float(len(_dump(shortest))), lambda: shortest
        if isinstance(s.get("allOf"), list) and s["allOf"]:
            parts = [self.walk(a, depth + 1) for a in s["allOf"]]

            def merged() -> dict[str, Any]:
                out: dict[str, Any] = {}
                for _, value in parts:
                    if isinstance(v := value(), dict):
                        out.update(v)
                return out

            return max(map(_length, parts)), merged
        kind = s.get("type")
        if isinstance(kind, list):
            types = (self.walk({**s, "type": t}, depth + 1) for t in kind)
            return min(types, key=_length, default=(INFINITE, lambda: None))
        if kind == "object" or (kind is None and "properties" in s):
            props: dict[str, Any] = s["properties"] if isinstance(s.get("properties"), dict) else {}
            fields = [(k, self.walk(props[k], depth + 1)) for k in s.get("required") or [] if k in props]
            length = 2.0 + sum(len(_dump(k)) + 1 + f[0] for k, f in fields) + max(len(fields) - 1, 0)
            return length, lambda: {k: f[1]() for k, f in fields}
        if kind == "array":
            prefix = s.get("prefixItems")
            if isinstance(prefix, list):
                parts = [self.walk(p, depth + 1) for p in prefix]
                length = 2.0 + sum(map(_length, parts)) + max(len(parts) - 1, 0)
                return length, lambda: [p[1]() for p in parts]
            n = _int(s.get("minItems"))
            items = s.get("items", True)
            length, value = self.walk(items, depth + 1) if n else (0.0, lambda: self.walk(items)[1]())
            return 2.0 + n * length + max(n - 1, 0), lambda: [value()] * n
        if kind == "string":
            chars = _shortest_string(
                s
            )  # written as x's: its length is what counts, a forced call is measured by it
            return 2.0 + chars, lambda: "x" * chars
        if kind in ("integer", "number"):
            number = _nearest_zero(s)
            return float(len(_dump(number))), lambda: number
        length, constant = {"boolean": (4.0, True), "null": (4.0, None)}.get(str(kind), (1.0, 0))
        return length, lambda: constant


def _length(found: Found) -> float:
    return found[0]


def _shortest_string(s: dict[str, Any]) -> int:
    """Characters of the shortest string: ``minLength``, and the shortest match of ``pattern`` (``a{1000000000}``
    is a billion characters, enforced by nested repetitions in the grammar, however short ``minLength`` is)."""
    shortest = _int(s.get("minLength"))
    if isinstance(s.get("pattern"), str):
        with suppress(Unsupported):  # a pattern the converter cannot read is refused there, by name
            shortest = max(shortest, width(s["pattern"])[0])
    return shortest


def shortest_json(schema: Any, limit: int, *, root: Any = None) -> tuple[float, Any]:
    """(length of the shortest compact JSON ``schema`` allows, that value or None when over ``limit``);
    ``$ref``s resolve against ``root`` (default: ``schema``)."""
    length, value = _Shortest(schema if root is None else root).walk(schema)
    return length, value() if length <= limit else None


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
