"""Which keys an object's grammar writes, and with which value schema: ``properties`` and ``required``, the keys
``patternProperties`` and ``propertyNames`` allow, ``additionalProperties``, ``minProperties`` and
``maxProperties``. A pure plan (:class:`ObjectPlan`); the converter writes it.

The grammar writes a subset of what the schema allows where the exact set needs a grammar to exclude one
regular language from another (a key that matches no pattern, a key that matches ``propertyNames`` but is not
a declared property): such keys are not written, so no reply holds a key the schema refuses."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clover_local.engine.schema_gbnf.common import class_char, count_of, pointer, required_of
from clover_local.engine.schema_gbnf.limits import SchemaRefused, Unsatisfiable
from clover_local.engine.schema_gbnf.merge import allows_nothing, key_schema, merge_lazy, search
from clover_local.engine.schema_gbnf.pattern import UNSAFE


@dataclass(frozen=True)
class ExtraKeys:
    """Keys beyond the declared ones: ``pattern`` (a JSON Schema pattern), ``names`` (a string schema the key
    matches, with ``excluded`` names left out), or any string but ``excluded``; each with ``value``."""

    value: Any
    path: str
    pattern: str | None = None
    names: Any = None
    excluded: tuple[str, ...] = ()


@dataclass(frozen=True)
class ObjectPlan:
    properties: list[tuple[str, Any, str]]
    """(name, schema, path) of each key the grammar may write, in the schema's order."""
    required: list[str]
    extras: list[ExtraKeys] = field(default_factory=list)
    min_extras: int = 0
    """Keys beyond the declared ones the object must have (``minProperties`` past them)."""


def plan_object(schema: dict[str, Any], path: str, names_ok: Any) -> ObjectPlan:
    """The keys of an object ``schema`` (one with no ``allOf``, ``$ref`` or condition left at its level).
    ``names_ok(name, schema)`` tells whether a property name matches a ``propertyNames`` schema."""
    props: dict[str, Any] = {}
    where: dict[str, str] = {}
    raw = schema.get("properties", {})
    if not isinstance(raw, dict):
        raise SchemaRefused("properties", path, "must be an object.")
    for name, sub in raw.items():
        props[name], where[name] = _plain_false(sub), pointer(path, "properties", name)
    required = list(dict.fromkeys(schema.get("required") or []))
    required_of(schema, path)
    patterns = schema.get("patternProperties", {})
    if not isinstance(patterns, dict):
        raise SchemaRefused("patternProperties", path, "must be an object.")
    patterns = {source: _plain_false(sub) for source, sub in patterns.items()}
    names = schema.get("propertyNames", True)
    names = True if names == {} else names
    has_additional = "additionalProperties" in schema
    additional = _plain_false(schema.get("additionalProperties", True))

    if names is not True:
        for name in [*props, *required]:
            if not names_ok(name, names):
                if name in required:
                    raise Unsatisfiable("propertyNames", path, f"refuses the required property {name!r}.")
                props[name] = False
    for name in list(props):
        for source, sub in patterns.items():
            if props[name] is not False and search(source, name, path):
                props[name] = merge_lazy(props[name], sub)
    for name in required:
        if name in props:
            continue
        value = key_schema(name, patterns, additional, path)
        if value is False:
            raise Unsatisfiable("required", path, f"names {name!r}, which 'additionalProperties' forbids.")
        props[name], where[name] = value, path
    for name in required:
        if props[name] is False:
            raise Unsatisfiable("required", path, f"names {name!r}, whose schema allows no value (false, or "
                                "'not' of a schema that allows everything).")  # fmt: skip

    live = [(n, s, where[n]) for n, s in props.items() if s is not False]
    required_live = [n for n, _s, _w in live if n in required]
    optional = [n for n, _s, _w in live if n not in required]
    lo = count_of(schema, "minProperties", path, 0)
    hi = count_of(schema, "maxProperties", path, None)
    min_extras = 0
    if len(required_live) < lo:
        # The first optional properties are written as required: every object then has enough keys.
        promoted = optional[: lo - len(required_live)]
        required_live += promoted
        optional = [n for n in optional if n not in promoted]
        min_extras = lo - len(required_live)
    if hi is not None:
        if len(required_live) > hi:
            raise Unsatisfiable(
                "maxProperties", path, f"{hi} is fewer than the {len(required_live)} required."
            )
        kept = set(optional[: hi - len(required_live)])
        live = [p for p in live if p[0] in required_live or p[0] in kept]
        return ObjectPlan(live, required_live)

    declared = tuple(props)
    extras: list[ExtraKeys] = []
    if patterns:
        if names is True:
            for source, sub in patterns.items():
                if any(search(source, n, path) for n in declared):
                    continue  # its keys could repeat a declared one
                value = sub
                for other, other_sub in patterns.items():
                    if other != source:  # a key of this pattern may match the others too
                        value = merge_lazy(value, other_sub)
                if value is not False:
                    extras.append(
                        ExtraKeys(value, pointer(path, "patternProperties", source), pattern=source)
                    )
    elif additional is not False and (has_additional or "properties" not in schema):
        extra_path = pointer(path, "additionalProperties") if has_additional else path
        if names is True:
            extras.append(ExtraKeys(additional, extra_path, excluded=declared))
        elif not any(names_ok(n, names) for n in declared):
            extras.append(ExtraKeys(additional, extra_path, names=names))
    if min_extras > (1 if extras else 0):
        # Two keys the grammar writes apart could still be one (a key written twice): one more is the most.
        raise SchemaRefused("minProperties", path, f"{lo} is more than the properties that can be written.")
    return ObjectPlan(live, required_live, extras, min_extras)


def _plain_false(schema: Any) -> Any:
    """``false`` for a schema that plainly allows no value (:func:`.merge.allows_nothing`, as ``{"not": {}}``):
    a key under it is never written, and never counted on to meet ``minProperties``."""
    return False if allows_nothing(schema) else schema


def not_strings_rule(strings: list[str], char: str) -> str:
    """GBNF for a JSON string that is none of ``strings`` (an extra key; a string ``not`` an ``enum``), its
    characters ``char`` (a rule of plain characters): never escapes, as ``"a\\u0062"`` is the name ``ab``,
    which a check on the text would let by."""
    trie: dict[str, Any] = {}
    for s in strings:
        if any(c in '"\\' or ord(c) < 0x20 or c == "\x7f" for c in s):
            continue  # a key written without escapes can never be this name
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[""] = {}

    def visit(node: dict[str, Any]) -> str:
        alts = [
            f"[{class_char(ch)}] ({visit(child)})" if set(child) - {""} else f"[{class_char(ch)}] {char}+"
            for ch, child in node.items()
            if ch
        ]
        if alts:
            rejects = "".join(class_char(c) for c in node if c)
            alts.append(f"[^{rejects}{UNSAFE}] {char}*")
        return " | ".join(alts)

    end = "" if "" in trie else "?"
    body = visit(trie)
    return f'["] ( {body} ){end} ["]' if body else f'["] {char}* ["]'
