"""Conditions on an object's keys, written as alternatives the grammar can hold: ``if``/``then``/``else`` whose
``if`` asks which keys are present and what ``const``/``enum`` value a key has, ``dependentRequired``,
``dependentSchemas`` and draft-7 ``dependencies``, and ``not`` of such a condition (or of a ``type``). The keys
the conditions read are given every state they can have (absent, present, present with each value named), each
combination decides every condition, and the schema becomes an ``anyOf`` of one object schema a combination.
A condition on anything else is refused by name."""

from __future__ import annotations

import itertools
import math
from typing import Any

from clover_local.engine.schema_gbnf.common import Document, pointer
from clover_local.engine.schema_gbnf.limits import SchemaRefused, Unsatisfiable
from clover_local.engine.schema_gbnf.merge import (
    ANNOTATIONS,
    CONDITIONS,
    NOT_IN,
    _same,
    allows_everything,
    allows_nothing,
    lift,
    merge,
    only,
    types_meeting,
)

MAX_COMBINATIONS = 256
"""States of the keys the conditions read, multiplied out: beyond this a schema is refused."""
_CONDITIONAL = ("if", CONDITIONS, "dependentRequired", "dependentSchemas", "dependencies", "not")
ALL_TYPES = ("null", "boolean", "object", "array", "number", "string")
_ABSENT = ("absent",)
_PRESENT = ("present",)


def conditional(schema: dict[str, Any]) -> bool:
    return any(k in schema for k in _CONDITIONAL)


def expand(schema: dict[str, Any], doc: Document, path: str) -> list[Any]:
    """The alternatives (object schemas with no condition left at this level) ``schema``'s conditions make."""
    schema = lift(schema)
    base = {k: v for k, v in schema.items() if k not in _CONDITIONAL}
    rules: list[tuple[dict[str, tuple[Any, ...]], Any, Any]] = []  # (condition, then, else)
    kinds_of_rules: list[bool] = []  # whether each rule holds for a value that is not an object
    for i, triple in enumerate(schema.get(CONDITIONS, [])):
        where = path if i else pointer(path, "if")
        then, otherwise = (resolved(triple.get(k, True), doc, where) for k in ("then", "else"))
        test = resolved(triple["if"], doc, where)
        if only(test, "not"):  # if not C then A else B
            test, then, otherwise = resolved(test["not"], doc, pointer(where, "not")), otherwise, then
        rules.append((_condition(test, doc, where), then, otherwise))
        kinds_of_rules.append(True)
    for key in ("dependentRequired", "dependentSchemas", "dependencies"):
        if (deps := schema.get(key)) is None:
            continue
        if not isinstance(deps, dict):
            raise SchemaRefused(key, path, "must be an object.")
        for trigger, then in deps.items():
            then = (
                {"required": then}
                if isinstance(then, list)
                else resolved(then, doc, pointer(path, key, trigger))
            )
            rules.append(({trigger: _PRESENT}, then, True))
            kinds_of_rules.append(False)
    if "not" in schema:
        where = pointer(path, "not")
        base, negated = _negation(base, resolved(schema["not"], doc, where), doc, where)
        rules += [(c, False, True) for c in negated]
        kinds_of_rules += [True] * len(negated)
    if not rules:
        return [base]
    kind = base.get("type")
    kinds = [kind] if isinstance(kind, str) else list(kind) if isinstance(kind, list) else None
    if kinds is not None and "object" not in kinds:
        # Not an object: an ``if`` on keys holds (its keywords ask nothing of other values), so does what a
        # ``not`` excludes; no key is present to trigger a dependency.
        for (_, then, _otherwise), from_if in zip(rules, kinds_of_rules, strict=True):
            base = merge(base, then if from_if else True, path)
            if base is False:
                raise Unsatisfiable("not" if then is False else "if", path, "no value meets every condition.")
        return [base]
    # Only objects are written: a value of another type would meet the conditions otherwise than they read.
    return _combinations({**base, "type": "object"}, rules, doc, path)


def _combinations(base: dict[str, Any], rules: list[tuple[dict[str, tuple[Any, ...]], Any, Any]],
                  doc: Document, path: str) -> list[Any]:  # fmt: skip
    required = set(base.get("required") or [])
    keys: dict[str, list[tuple[Any, ...]]] = {}
    nested: dict[str, Any] = {}  # a key whose value's own keys a condition reads: that condition
    for condition, _then, _else in rules:
        for key, state in condition.items():
            keys.setdefault(key, [])
            if state[0] == "in":
                keys[key] += [("in", (v,)) for v in state[1] if not any(_same(v, s[1][0]) for s in keys[key])]
            elif state[0] == "obj" and nested.setdefault(key, state[1]) != state[1]:
                raise SchemaRefused("if", path, f"two conditions read the value of {key!r} differently.")
    states: list[list[tuple[Any, ...]]] = []
    for key, values in keys.items():
        declared = resolved((base.get("properties") or {}).get(key, True), doc, path)
        named = finite(declared)
        if key in nested:
            if values:
                raise SchemaRefused("if", path, f"conditions read both the value and the keys of {key!r}.")
            options: list[tuple[Any, ...]] = [("sat", nested[key]), ("unsat", nested[key])]
        elif values and isinstance(named, list):
            options = [("in", (v,)) for v in named]
        else:
            # A value no condition names, on a key whose values are not listed, is not written: a subset of
            # what the schema allows, never a reply it refuses.
            options = list(values) if values else [_PRESENT]
        if key not in required and declared is not False:
            options.append(_ABSENT)
        elif declared is False:
            options = [_ABSENT]
        states.append(options)
    if math.prod(len(options) for options in states) > MAX_COMBINATIONS:
        raise SchemaRefused(
            "if", path, f"the conditions read {len(keys)} keys in over {MAX_COMBINATIONS} combinations."
        )
    out = []
    for combination in itertools.product(*states):
        chosen = dict(zip(keys, combination, strict=True))
        schema: Any = base
        for key, state in chosen.items():
            schema = merge(schema, _state_schema(key, state), path)
        for condition, then, otherwise in rules:
            schema = merge(schema, then if _holds(condition, chosen) else otherwise, path)
            if schema is False:
                break
        if schema is not False:
            out.append(schema)
    if not out:
        raise Unsatisfiable("if", path, "no object meets every condition.")
    return out


def _state_schema(key: str, state: tuple[Any, ...]) -> dict[str, Any]:
    if state == _ABSENT:
        return {"properties": {key: False}}
    if state == _PRESENT:
        return {"required": [key]}
    if state[0] == "sat":
        return {"required": [key], "properties": {key: state[1]}}
    if state[0] == "unsat":
        return {"required": [key], "properties": {key: {"not": state[1]}}}
    return {"required": [key], "properties": {key: {"const": state[1][0]}}}


def _holds(condition: dict[str, tuple[Any, ...]], chosen: dict[str, tuple[Any, ...]]) -> bool:
    for key, want in condition.items():
        have = chosen[key]
        if want == _PRESENT and have == _ABSENT:
            return False
        if want[0] == "obj" and (have[0] == "unsat" or (have == _ABSENT and not want[2])):
            return False
        if want[0] == "in":  # present with one of the values, or absent when ``optional``
            if have == _ABSENT:
                if not want[2]:
                    return False
            elif not any(_same(have[1][0], v) for v in want[1]):
                return False
    return True


def _condition(schema: Any, doc: Document, path: str, keyword: str = "if") -> dict[str, tuple[Any, ...]]:
    """An ``if`` schema (or what a ``not`` excludes) as what it asks of each key: ``("present",)``,
    ``("in", values, absent_ok)``, or ``("obj", condition, absent_ok)`` (the value under the key is an object
    whose own keys meet a condition of the same kind)."""
    if schema is True or schema == {}:
        return {}
    if (
        not isinstance(schema, dict)
        or any(k not in ("required", "properties", "type") and k not in ANNOTATIONS for k in schema)
        or schema.get("type", "object") != "object"
    ):
        raise SchemaRefused(keyword, path, "only a condition on which keys are present and their const/enum "
                            "values can be enforced.")  # fmt: skip
    required = schema.get("required") or []
    out: dict[str, tuple[Any, ...]] = {k: _PRESENT for k in required}
    for key, sub in (schema.get("properties") or {}).items():
        where = pointer(path, "properties", key)
        sub = resolved(sub, doc, where)
        if (values := finite(sub)) is None:
            try:
                _condition(sub, doc, where, keyword)  # a condition on the keys of the value under ``key``
            except SchemaRefused:
                raise SchemaRefused(keyword, where, "only a const or enum value, or keys of an object, can be "
                                    "tested.") from None  # fmt: skip
            out[key] = ("obj", sub, key not in required)
        elif isinstance(values, list):
            out[key] = ("in", tuple(values), key not in required)
    return out


def finite(schema: Any) -> list[Any] | bool | None:
    """The values a schema allows when it names them (``const``, ``enum``, ``boolean``, ``null``); True when it
    allows anything; None otherwise."""
    if schema is True or schema == {}:
        return True
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        listed: list[Any] = schema["enum"]  # the list itself: its facts are kept by identity (exclusive.py)
        return listed
    if schema.get("type") == "boolean":
        return [True, False]
    if schema.get("type") == "null":
        return [None]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and only(schema, key):
            parts = [finite(p) for p in schema[key]]
            if all(isinstance(p, list) for p in parts):
                return [v for p in parts if isinstance(p, list) for v in p]
    if all(k in ANNOTATIONS for k in schema):
        return True
    return None


def _negation(base: dict[str, Any], negated: Any, doc: Document,
              path: str) -> tuple[dict[str, Any], list[dict[str, tuple[Any, ...]]]]:  # fmt: skip
    """``base`` and ``not negated``: a type taken away, values taken out of an enum, or conditions that must
    not hold."""
    if allows_everything(negated):
        # Unsatisfiable, not refused: a property under it is left out where it is optional, an alternative
        # under it is never written.
        raise Unsatisfiable("not", path, "no value matches 'not' of a schema that allows everything.")
    if allows_nothing(negated):
        return base, []
    if only(negated, "type"):
        kinds = [negated["type"]] if isinstance(negated["type"], str) else list(negated["type"])
        left = [
            t for t in types_meeting(base.get("type", list(ALL_TYPES)), list(ALL_TYPES)) if t not in kinds
        ]
        left = [t for t in left if not (t == "integer" and "number" in kinds)]
        if "number" in left and "integer" in kinds:
            raise SchemaRefused("not", path, "a number that is not an integer cannot be enforced.")
        if not left:
            raise SchemaRefused("not", path, "no type is left.")
        return {**base, "type": left[0] if len(left) == 1 else left}, []
    values = finite(negated) if isinstance(negated, dict) else None
    allowed = finite(base)
    if isinstance(values, list) and isinstance(allowed, list):
        kept = [v for v in allowed if not any(_same(v, w) for w in values)]
        if not kept:
            raise Unsatisfiable("not", path, "every value the schema allows is excluded.")
        return {**{k: v for k, v in base.items() if k != "const"}, "enum": kept}, []
    if isinstance(values, list) and (excluded := without(base, values)) is not None:
        return excluded, []
    parts = negated["anyOf"] if only(negated, "anyOf") else None
    if isinstance(parts, list):
        return base, [_condition(resolved(p, doc, pointer(path, "anyOf", i)), doc, pointer(path, "anyOf", i), "not")
                      for i, p in enumerate(parts)]  # fmt: skip
    try:
        return base, [_condition(negated, doc, path)]
    except SchemaRefused:
        raise SchemaRefused("not", path, "only 'not' of a type, of values, or of keys being present can be "
                            "enforced.") from None  # fmt: skip


def without(base: dict[str, Any], values: list[Any]) -> dict[str, Any] | None:
    """``base`` less some listed values, where that can be written: a plain string (:data:`NOT_IN`) or an
    integer (the ranges between them). None otherwise."""
    kind = base.get("type")
    if (
        kind == "string"
        and all(isinstance(v, str) for v in values)
        and not ({"pattern", "format", "maxLength", "enum", "const"} & set(base))
        and base.get("minLength", 0) <= 1
    ):
        excluded = [*base.get(NOT_IN, []), *values, *([""] if base.get("minLength", 0) == 1 else [])]
        return {**{k: v for k, v in base.items() if k != "minLength"}, NOT_IN: sorted(set(excluded))}
    integers = [int(v) for v in values if type_of(v) == "integer"]
    if kind == "integer" and "anyOf" not in base and len(integers) < 64:
        ranges: list[dict[str, Any]] = []
        below: int | None = None
        for v in sorted(set(integers)):
            ranges.append({"maximum": v - 1} if below is None else {"minimum": below, "maximum": v - 1})
            below = v + 1
        ranges.append({} if below is None else {"minimum": below})
        return {**base, "anyOf": [r for r in ranges if r.get("minimum", -(2**62)) <= r.get("maximum", 2**62)]}
    return None


def resolved(schema: Any, doc: Document, path: str) -> Any:
    """``schema`` with its top-level ``$ref`` followed (keywords beside it merged in)."""
    for _ in range(64):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            return schema
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        target = doc.locate(schema["$ref"], path)[0]
        schema = merge(target, rest, path) if set(rest) - ANNOTATIONS else target
    raise SchemaRefused("$ref", path, "references loop.")


def type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "string")
