"""Two schemas as one: what ``allOf`` means, written so the converter can enforce it as a single schema. Each
keyword meets the other's (types intersect, bounds tighten, ``required`` unites, properties merge); a
property one part declares is held to the other part's ``additionalProperties``, as JSON Schema says. What
cannot be met exactly (two different patterns or formats) is a ``SchemaRefused`` naming the keyword."""

from __future__ import annotations

import json
import re
from typing import Any

from clover_local.engine.schema_gbnf.limits import SchemaRefused

CONDITIONS = "\x00conditions"
"""Internal key: the ``if``/``then``/``else`` triples of the parts merged (one schema holds one ``if``; a merge
of several keeps them all, and the converter expands them together, :mod:`.branches`)."""

NOT_IN = "\x00not-in"
"""Internal key: strings a plain ``string`` schema must not be (``not`` of an ``enum``; a ``oneOf`` kept apart)."""

ANNOTATIONS = frozenset(
    ("title", "description", "default", "examples", "$comment", "$schema", "$id", "id", "definitions", "$defs",
     "deprecated", "readOnly", "writeOnly", "markdownDescription", "$anchor", "contentMediaType",
     "contentEncoding")
)  # fmt: skip
"""Keywords that constrain nothing: the first part's value is kept."""
_PLAIN_DEPTH = 16
"""How deep :func:`allows_everything` and :func:`allows_nothing` look: past it a schema is not shown trivial."""

_LOWER = ("minLength", "minItems", "minProperties", "minimum", "exclusiveMinimum", "minContains")
_UPPER = ("maxLength", "maxItems", "maxProperties", "maximum", "exclusiveMaximum", "maxContains")
_SCHEMA_MAPS = ("properties", "patternProperties", "dependentSchemas")
_SCHEMAS = ("additionalProperties", "propertyNames", "items", "additionalItems", "contains")
MAX_PRODUCT = 64
"""Alternatives a merge of two ``anyOf``/``oneOf`` may write (their cross product)."""


def lift(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with its ``if``/``then``/``else`` moved under :data:`CONDITIONS` (an ``if`` alone, or a
    ``then``/``else`` without an ``if``, constrains nothing and is dropped)."""
    if not any(k in schema for k in ("if", "then", "else")):
        return schema
    out = {k: v for k, v in schema.items() if k not in ("if", "then", "else")}
    if "if" in schema and ("then" in schema or "else" in schema):
        triple = {k: schema[k] for k in ("if", "then", "else") if k in schema}
        out[CONDITIONS] = [*schema.get(CONDITIONS, []), triple]
    return out


def allows_everything(schema: Any, depth: int = 0) -> bool:
    """Whether ``schema`` plainly allows every value: ``true``, ``{}``, annotations only (``title``,
    ``description``, ``$comment``...), an ``anyOf`` with such a part, an ``allOf`` of such parts, or ``not`` of a
    schema that allows nothing. False where that is not plain (a ``$ref`` is not followed): never a guess."""
    if schema is True:
        return True
    if not isinstance(schema, dict) or depth > _PLAIN_DEPTH:
        return False
    keys = set(schema) - ANNOTATIONS
    parts = schema.get(next(iter(keys))) if len(keys) == 1 else None
    if not keys:
        return True
    if keys == {"anyOf"} and isinstance(parts, list):
        return any(allows_everything(p, depth + 1) for p in parts)
    if keys == {"allOf"} and isinstance(parts, list):
        return all(allows_everything(p, depth + 1) for p in parts)
    return keys == {"not"} and allows_nothing(parts, depth + 1)


def allows_nothing(schema: Any, depth: int = 0) -> bool:
    """Whether ``schema`` plainly allows no value: ``false``, ``not`` of a schema that allows everything (how
    draft 4, which has no ``false``, forbids a property: ``{"not": {}}``), whatever is beside it, an ``allOf``
    with such a part, an ``anyOf`` or ``oneOf`` whose parts all are."""
    if schema is False:
        return True
    if not isinstance(schema, dict) or depth > _PLAIN_DEPTH:
        return False
    if "not" in schema and allows_everything(schema["not"], depth + 1):
        return True
    parts = schema.get("allOf")
    if isinstance(parts, list) and any(allows_nothing(p, depth + 1) for p in parts):
        return True
    for key in ("anyOf", "oneOf"):
        parts = schema.get(key)
        if isinstance(parts, list) and parts and all(allows_nothing(p, depth + 1) for p in parts):
            return True
    return False


def merge(a: Any, b: Any, path: str) -> Any:
    """A schema that holds exactly when ``a`` and ``b`` both do (False: no value can)."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise SchemaRefused("allOf", path, "each part must be a schema object (or true).")
    if "$ref" in a and "$ref" in b and a["$ref"] != b["$ref"]:
        return {"allOf": [a, b]}  # merged once the converter has followed both
    a, b = lift(_held_to_additional(a, b, path)), lift(_held_to_additional(b, a, path))
    out = dict(a)
    for key, theirs in b.items():
        if key not in out:
            out[key] = theirs
            continue
        mine = out[key]
        if mine == theirs or key in ANNOTATIONS:
            continue
        met = _meet(key, mine, theirs, path)
        if met is _NOTHING:
            return False
        out[key] = met
    props = out.get("properties")
    if isinstance(props, dict) and any(props.get(r) is False for r in out.get("required") or []):
        return False  # a required property that cannot appear
    if "const" in out and "enum" in out:
        if not any(_same(out["const"], v) for v in out["enum"]):
            return False
        del out["enum"]
    return out


_NOTHING = object()


def _meet(key: str, mine: Any, theirs: Any, path: str) -> Any:
    """The value of ``key`` that holds both ``mine`` and ``theirs`` (``_NOTHING``: no value can)."""
    if key == "type":
        kinds = types_meeting(mine, theirs)
        return (kinds[0] if len(kinds) == 1 else kinds) if kinds else _NOTHING
    if key == "required" and isinstance(mine, list) and isinstance(theirs, list):
        return list(dict.fromkeys([*mine, *theirs]))
    if key == "enum" and isinstance(mine, list) and isinstance(theirs, list):
        both = [v for v in mine if any(_same(v, w) for w in theirs)]
        return both or _NOTHING
    if key == "const":
        return mine if _same(mine, theirs) else _NOTHING
    if key in _LOWER + _UPPER and _is_number(mine) and _is_number(theirs):
        return max(mine, theirs) if key in _LOWER else min(mine, theirs)
    if key == "uniqueItems":
        return bool(mine) or bool(theirs)
    if key == "multipleOf" and _is_number(mine) and _is_number(theirs):
        big, small = max(mine, theirs), min(mine, theirs)
        if float(big / small).is_integer():
            return big
    if key in _SCHEMA_MAPS and isinstance(mine, dict) and isinstance(theirs, dict):
        return {**mine, **theirs, **{k: merge_lazy(mine[k], theirs[k]) for k in mine.keys() & theirs.keys()}}
    if key in _SCHEMAS and not isinstance(mine, list) and not isinstance(theirs, list):
        return merge_lazy(mine, theirs)
    if key in ("dependentRequired", "dependencies") and isinstance(mine, dict) and isinstance(theirs, dict):
        out = {**mine, **theirs}
        for k in mine.keys() & theirs.keys():
            m, t = mine[k], theirs[k]
            out[k] = (
                list(dict.fromkeys([*m, *t]))
                if isinstance(m, list) and isinstance(t, list)
                else merge_lazy(
                    {"required": m} if isinstance(m, list) else m,
                    {"required": t} if isinstance(t, list) else t,
                )
            )
        return out
    if key in ("anyOf", "oneOf") and isinstance(mine, list) and isinstance(theirs, list):
        if len(mine) * len(theirs) > MAX_PRODUCT:
            raise SchemaRefused(key, path, f"two '{key}' of {len(mine)} and {len(theirs)} alternatives meet in "
                                f"more than {MAX_PRODUCT} ways.")  # fmt: skip
        if key == "oneOf":
            raise SchemaRefused(key, path, "two 'oneOf' cannot be combined (each must match exactly once).")
        return [merge_lazy(x, y) for x in mine for y in theirs]
    if key == "not":  # neither: not either (one flat anyOf, as a 'not' of an anyOf is enforced)
        return {"anyOf": [*_any_parts(mine), *_any_parts(theirs)]}
    if key == NOT_IN:
        return sorted({*mine, *theirs})
    if key in (CONDITIONS, "allOf") and isinstance(mine, list) and isinstance(theirs, list):
        return [*mine, *theirs]

    raise SchemaRefused(
        key, path, f"two different values ({_short(mine)} and {_short(theirs)}) cannot both be enforced."
    )


def _any_parts(schema: Any) -> list[Any]:
    """The parts of an ``anyOf`` that is all ``schema`` says; ``[schema]`` otherwise."""
    return list(schema["anyOf"]) if only(schema, "anyOf") and isinstance(schema["anyOf"], list) else [schema]


def only(schema: Any, key: str) -> bool:
    """Whether ``schema`` is an object that says nothing but ``key`` (annotations aside)."""
    return isinstance(schema, dict) and set(schema) - ANNOTATIONS == {key}


def merge_lazy(a: Any, b: Any) -> Any:
    """``a`` and ``b`` as one schema, merged when the converter reaches it (an ``allOf`` of the two)."""
    if a is True or a == {} or a == b:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


def _held_to_additional(part: dict[str, Any], other: dict[str, Any], path: str) -> dict[str, Any]:
    """``part`` with the properties ``other`` declares and ``part`` does not, held to ``part``'s own
    ``additionalProperties`` or matching ``patternProperties``: in ``allOf`` each part judges every property
    by its own keywords."""
    extra = other.get("properties")
    additional = part.get("additionalProperties", True)
    patterns: dict[str, Any] = (
        part["patternProperties"] if isinstance(part.get("patternProperties"), dict) else {}
    )
    their_patterns = other.get("patternProperties")
    if additional is not True and isinstance(their_patterns, dict):
        # Keys the other part's patterns allow are extra keys here too: held to this part's additionalProperties
        # (stricter than this part's own patterns may be, never looser).
        held = {p: merge_lazy(s, additional) for p, s in their_patterns.items() if p not in patterns}
        part = {**part, "patternProperties": {**patterns, **held}}
        patterns = part["patternProperties"]
    if not isinstance(extra, dict) or (additional is True and not patterns):
        return part
    own: dict[str, Any] = part["properties"] if isinstance(part.get("properties"), dict) else {}
    added = {
        name: schema
        for name in extra
        if name not in own and (schema := key_schema(name, patterns, additional, path)) is not True
    }
    return {**part, "properties": {**own, **added}} if added else part


def key_schema(name: str, patterns: dict[str, Any], additional: Any, path: str) -> Any:
    """What a key no ``properties`` declares is held to: the ``patternProperties`` it matches (all of them),
    else ``additionalProperties``."""
    schema: Any = True
    for s in [s for p, s in patterns.items() if search(p, name, path)] or [additional]:
        schema = merge_lazy(schema, s)
    return schema


def search(pattern: str, text: str, path: str = "#") -> bool:
    """Whether a JSON Schema ``pattern`` finds a match in ``text`` (Python's ``re`` reads the ECMA-262 subset
    schemas use); a pattern ``re`` cannot read is a ``SchemaRefused``."""
    try:
        return re.search(pattern, text) is not None
    except re.error as exc:
        raise SchemaRefused(
            "patternProperties", path, f"{pattern!r} is not a pattern this server reads: {exc}."
        ) from None


def types_meeting(a: Any, b: Any) -> list[str]:
    """The types both ``type`` values allow (an integer is a number)."""
    left = [a] if isinstance(a, str) else list(a)
    right = [b] if isinstance(b, str) else list(b)
    out = [t for t in right if t in left or (t == "integer" and "number" in left)]
    out += ["integer" for t in right if t == "number" and "integer" in left and "integer" not in out]
    return list(dict.fromkeys(out))


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def canonical(value: Any) -> str:
    """One text for each JSON value (``1`` and ``1.0`` alike), to compare many values as a set."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value, sort_keys=True)


def _same(a: Any, b: Any) -> bool:
    """JSON equality (``1`` is ``1.0``; ``true`` is not ``1``)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) or (
        _is_number(a) and _is_number(b) and a == b
    )


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) < 60 else text[:57] + "..."
