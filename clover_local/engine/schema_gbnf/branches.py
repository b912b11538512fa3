"""Conditions on an object's keys, written as alternatives the grammar can hold: ``if``/``then``/``else`` whose
``if`` asks which keys are present and what ``const``/``enum`` value a key has, ``dependentRequired``,
``dependentSchemas`` and draft-7 ``dependencies``, and ``not`` of such a condition (or of a ``type``). The keys
the conditions read are given every state they can have (absent, present, present with each value named), each
combination decides every condition, and the schema becomes an ``anyOf`` of one object schema a combination.
A condition on anything else is refused by name.

And ``oneOf``: its alternatives must never both match, or a reply could be valid under two. Alternatives are
checked pairwise for a difference that keeps them apart (types, values, a key one requires and the other
forbids); where none is found, a key the other alternative requires is made absent in this one."""

from __future__ import annotations

import itertools
from typing import Any

from clover_local.engine.schema_gbnf.common import Document, pointer
from clover_local.engine.schema_gbnf.keywords import valid_in_document
from clover_local.engine.schema_gbnf.limits import SchemaRefused, Unsatisfiable
from clover_local.engine.schema_gbnf.merge import (
    ANNOTATIONS,
    CONDITIONS,
    NOT_IN,
    _same,
    lift,
    merge,
    types_meeting,
)
from clover_local.engine.schema_gbnf.pattern import first_chars

MAX_COMBINATIONS = 256
"""States of the keys the conditions read, multiplied out: beyond this a schema is refused."""
_CONDITIONAL = ("if", CONDITIONS, "dependentRequired", "dependentSchemas", "dependencies", "not")
_ALL_TYPES = ("null", "boolean", "object", "array", "number", "string")
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
        then, otherwise = (_deref(triple.get(k, True), doc, where) for k in ("then", "else"))
        rules.append((_condition(_deref(triple["if"], doc, where), doc, where), then, otherwise))
        kinds_of_rules.append(True)
    for key in ("dependentRequired", "dependentSchemas", "dependencies"):
        deps = schema.get(key)
        if deps is None:
            continue
        if not isinstance(deps, dict):
            raise SchemaRefused(key, path, "must be an object.")
        for trigger, then in deps.items():
            then = (
                {"required": then}
                if isinstance(then, list)
                else _deref(then, doc, pointer(path, key, trigger))
            )
            rules.append(({trigger: _PRESENT}, then, True))
            kinds_of_rules.append(False)
    if "not" in schema:
        base, negated = _negation(
            base, _deref(schema["not"], doc, pointer(path, "not")), doc, pointer(path, "not")
        )
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
    for condition, _then, _else in rules:
        for key, state in condition.items():
            keys.setdefault(key, [])
            if state[0] == "in":
                keys[key] += [("in", (v,)) for v in state[1] if not any(_same(v, s[1][0]) for s in keys[key])]
    states: list[list[tuple[Any, ...]]] = []
    for key, values in keys.items():
        declared = _deref((base.get("properties") or {}).get(key, True), doc, path)
        named = _finite(declared)
        if values and isinstance(named, list):
            options: list[tuple[Any, ...]] = [("in", (v,)) for v in named]
        else:
            # A value no condition names, on a key whose values are not listed, is not written: a subset of
            # what the schema allows, never a reply it refuses.
            options = list(values) if values else [_PRESENT]
        if key not in required and declared is not False:
            options.append(_ABSENT)
        elif declared is False:
            options = [_ABSENT]
        states.append(options)
    count = 1
    for options in states:
        count *= len(options)
    if count > MAX_COMBINATIONS:
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
    return {"required": [key], "properties": {key: {"const": state[1][0]}}}


def _holds(condition: dict[str, tuple[Any, ...]], chosen: dict[str, tuple[Any, ...]]) -> bool:
    for key, want in condition.items():
        have = chosen[key]
        if want == _PRESENT and have == _ABSENT:
            return False
        if want[0] == "in":  # present with one of the values, or absent when ``optional``
            if have == _ABSENT:
                if not want[2]:
                    return False
            elif not any(_same(have[1][0], v) for v in want[1]):
                return False
    return True


def _condition(schema: Any, doc: Document, path: str, keyword: str = "if") -> dict[str, tuple[Any, ...]]:
    """An ``if`` schema (or what a ``not`` excludes) as what it asks of each key: ``("present",)``, or
    ``("in", values, absent_ok)``."""
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
        values = _finite(_deref(sub, doc, pointer(path, "properties", key)))
        if values is None:
            raise SchemaRefused(
                keyword, pointer(path, "properties", key), "only a const or enum value can be tested."
            )
        if isinstance(values, list):
            out[key] = ("in", tuple(values), key not in required)
    return out


def _finite(schema: Any) -> list[Any] | bool | None:
    """The values a schema allows when it names them (``const``, ``enum``, ``boolean``, ``null``); True when it
    allows anything; None otherwise."""
    if schema is True or schema == {}:
        return True
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return [schema["const"]]
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    if schema.get("type") == "boolean":
        return [True, False]
    if schema.get("type") == "null":
        return [None]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and set(schema) - ANNOTATIONS == {key}:
            parts = [_finite(p) for p in schema[key]]
            if all(isinstance(p, list) for p in parts):
                return [v for p in parts if isinstance(p, list) for v in p]
    if all(k in ANNOTATIONS for k in schema):
        return True
    return None


def _negation(base: dict[str, Any], negated: Any, doc: Document,
              path: str) -> tuple[dict[str, Any], list[dict[str, tuple[Any, ...]]]]:  # fmt: skip
    """``base`` and ``not negated``: a type taken away, values taken out of an enum, or conditions that must
    not hold."""
    if negated is True or negated == {}:
        raise SchemaRefused("not", path, "'not' of a schema that allows everything allows nothing.")
    if isinstance(negated, dict) and set(negated) - ANNOTATIONS == {"type"}:
        kinds = [negated["type"]] if isinstance(negated["type"], str) else list(negated["type"])
        left = [
            t for t in types_meeting(base.get("type", list(_ALL_TYPES)), list(_ALL_TYPES)) if t not in kinds
        ]
        left = [t for t in left if not (t == "integer" and "number" in kinds)]
        if "number" in left and "integer" in kinds:
            raise SchemaRefused("not", path, "a number that is not an integer cannot be enforced.")
        if not left:
            raise SchemaRefused("not", path, "no type is left.")
        return {**base, "type": left[0] if len(left) == 1 else left}, []
    values = _finite(negated) if isinstance(negated, dict) else None
    allowed = _finite(base)
    if isinstance(values, list) and isinstance(allowed, list):
        kept = [v for v in allowed if not any(_same(v, w) for w in values)]
        if not kept:
            raise Unsatisfiable("not", path, "every value the schema allows is excluded.")
        return {**{k: v for k, v in base.items() if k != "const"}, "enum": kept}, []
    if isinstance(values, list):
        excluded = without(base, values)
        if excluded is not None:
            return excluded, []
    parts = (
        negated.get("anyOf")
        if isinstance(negated, dict) and set(negated) - ANNOTATIONS == {"anyOf"}
        else None
    )
    if isinstance(parts, list):
        return base, [_condition(_deref(p, doc, pointer(path, "anyOf", i)), doc, pointer(path, "anyOf", i), "not")
                      for i, p in enumerate(parts)]  # fmt: skip
    try:
        return base, [_condition(negated, doc, path)]
    except SchemaRefused:
        raise SchemaRefused("not", path, "only 'not' of a type, of values, or of keys being present can be "
                            "enforced.") from None  # fmt: skip


def listed(schema: Any) -> list[Any] | None:
    """The values a schema lists (``const``, ``enum``, ``boolean``, ``null``); None when it lists none."""
    values = _finite(schema)
    return values if isinstance(values, list) else None


def resolved(schema: Any, doc: Document, path: str) -> Any:
    """``schema`` with its top-level ``$ref`` followed (keywords beside it merged in)."""
    return _deref(schema, doc, path)


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
    integers = [int(v) for v in values if _type_of(v) == "integer"]
    if kind == "integer" and "anyOf" not in base and len(integers) < 64:
        ranges: list[dict[str, Any]] = []
        below: int | None = None
        for v in sorted(set(integers)):
            ranges.append({"maximum": v - 1} if below is None else {"minimum": below, "maximum": v - 1})
            below = v + 1
        ranges.append({} if below is None else {"minimum": below})
        return {**base, "anyOf": [r for r in ranges if r.get("minimum", -(2**62)) <= r.get("maximum", 2**62)]}
    return None


def _deref(schema: Any, doc: Document, path: str) -> Any:
    for _ in range(64):
        if not (isinstance(schema, dict) and isinstance(schema.get("$ref"), str)):
            return schema
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        target = doc.resolve(schema["$ref"], path)
        schema = merge(target, rest, path) if set(rest) - ANNOTATIONS else target
    raise SchemaRefused("$ref", path, "references loop.")


# --- oneOf ------------------------------------------------------------------------------------------------


def exclusive(alternatives: list[Any], doc: Document, path: str) -> list[tuple[int, Any]]:
    """``oneOf``'s alternatives, each written so that what it writes matches none of the others as the schema
    gives them: apart already, or made so by making a key another requires absent. One that cannot be kept
    apart is not written (a subset); when none is left the schema is refused."""
    out = []
    for i, alternative in enumerate(alternatives):
        mine = alternative
        for j, other in enumerate(alternatives):
            if i == j or mine is None or _apart(mine, other, doc, 0):
                continue
            mine = _make_absent(mine, other, doc, path)
        if mine is not None:
            out.append((i, mine))
    if not out:
        raise SchemaRefused(
            "oneOf", path, "its alternatives overlap, and 'oneOf' allows exactly one to match."
        )
    return out


def _make_absent(mine: Any, other: Any, doc: Document, path: str) -> Any:
    """``mine`` made to differ from ``other``: a key that ``other`` requires made absent, or a key that
    ``other`` forbids made required; None when neither can be done."""
    mine_d, other_d = _deref(mine, doc, path), _deref(other, doc, path)
    if not isinstance(mine_d, dict) or not isinstance(other_d, dict):
        return None
    listed_other = _finite(other_d)
    if isinstance(listed_other, list) and not isinstance(_finite(mine_d), list):
        return without(mine_d, listed_other)
    if "object" not in _types(mine_d, written=True):
        return None
    own_required = mine_d.get("required") or []
    theirs = [r for r in other_d.get("required") or [] if r not in own_required]
    own = [k for k, v in (mine_d.get("properties") or {}).items() if v is not False and k not in own_required]
    forbidden = [k for k in own if _forbids(other_d, k)]
    if theirs:
        extra: dict[str, Any] = {"properties": {theirs[0]: False}}
    elif forbidden:
        extra = {"required": [forbidden[0]]}
    else:
        return None
    if isinstance(mine, dict) and "$ref" in mine:  # kept a reference, so a recursive schema stays one rule
        rest = merge({k: v for k, v in mine.items() if k != "$ref"}, extra, path)
        fixed = (
            False if rest is False or merge(mine_d, extra, path) is False else {"$ref": mine["$ref"], **rest}
        )
    else:
        fixed = merge(mine_d, extra, path)
    return None if fixed is False else fixed


def _types(schema: Any, *, written: bool) -> set[str]:
    """The types of the values a schema matches, or (``written``) of those the converter writes for it: a
    schema with ``properties`` and no ``type`` matches any string, but is written as an object."""
    if not isinstance(schema, dict):
        return set(_ALL_TYPES) | {"integer"}
    values = _finite(schema)
    if isinstance(values, list):
        return {_type_of(v) for v in values}
    kind = schema.get("type")
    if kind is None:
        if written and ("properties" in schema or "required" in schema or "additionalProperties" in schema):
            return {"object"}
        return set(_ALL_TYPES) | {"integer"}
    kinds = {kind} if isinstance(kind, str) else set(kind)
    return kinds | ({"integer"} if "number" in kinds else set())


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer()):
        return "integer"
    return {float: "number", str: "string", list: "array", dict: "object"}.get(type(value), "string")


def _apart(a: Any, b: Any, doc: Document, depth: int) -> bool:
    """Whether no value the converter writes for ``a`` matches ``b`` (False: not shown)."""
    if depth > 8:
        return False
    a, b = _deref(a, doc, "#"), _deref(b, doc, "#")
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = _types(a, written=True), _types(b, written=False)
    if not (ta & tb):
        return True
    va, vb = _finite(a), _finite(b)
    if isinstance(va, list) and isinstance(vb, list) and not any(_same(x, y) for x in va for y in vb):
        return True
    for values, other in ((va, b), (vb, a)):
        if isinstance(values, list) and (
            all(isinstance(v, str) and v in other.get(NOT_IN, ()) for v in values)
            or all(valid_in_document(v, other, doc.root) is False for v in values)
        ):
            return True
    if ta & tb <= {"string"} and _first_chars_apart(a, b):
        return True
    if ta <= {"object"}:
        pa, pb = a.get("properties") or {}, b.get("properties") or {}
        ra, rb = set(a.get("required") or []), set(b.get("required") or [])
        for key in ra & rb:
            if key in pa and key in pb and _apart(pa[key], pb[key], doc, depth + 1):
                return True
        if any(_forbids(b, k) for k in ra) or any(_forbids(a, k) for k in rb):
            return True
    return False


def _first_chars_apart(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two patterns whose matches cannot begin with the same character (nor be empty)."""
    firsts = [first_chars(s["pattern"]) if isinstance(s.get("pattern"), str) else None for s in (a, b)]
    return firsts[0] is not None and firsts[1] is not None and not (firsts[0] & firsts[1])


def _forbids(schema: dict[str, Any], key: str) -> bool:
    """Whether an object matching ``schema`` can never have ``key``."""
    props = schema.get("properties") or {}
    if key in props:
        return props[key] is False
    return schema.get("additionalProperties") is False and not schema.get("patternProperties")
