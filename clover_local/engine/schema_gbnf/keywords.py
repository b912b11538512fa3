"""The JSON Schema keywords no grammar here enforces, on either engine: neither clover-local's converter nor
llama-server's (``common/json-schema.cpp`` of the pinned llama.cpp reads ``$ref``, ``anyOf``/``oneOf``,
``allOf``, ``type``, ``const``, ``enum``, ``properties``, ``required``, ``additionalProperties``, ``items``,
``prefixItems``, ``minItems``/``maxItems``, ``pattern``, ``format``, ``minLength``/``maxLength`` and integer
bounds, and passes over every other keyword in silence). A schema that uses one is refused by name and path on
both engines, never answered with a reply that ignores it."""

from __future__ import annotations

from typing import Any

from clover_local.engine.schema_gbnf.limits import SchemaRefused

UNENFORCEABLE: dict[str, str] = {
    "not": "a grammar cannot exclude what a subschema allows",
    "if": "conditional schemas cannot be enforced",
    "then": "conditional schemas cannot be enforced",
    "else": "conditional schemas cannot be enforced",
    "contains": "the grammar cannot require one item among any others",
    "uniqueItems": "the grammar cannot enforce unique items",
    "patternProperties": "property names matching a pattern cannot be enforced",
    "propertyNames": "property names cannot be constrained",
    "minProperties": "a count of properties cannot be enforced",
    "maxProperties": "a count of properties cannot be enforced",
    "dependentRequired": "properties required by others cannot be enforced",
    "dependentSchemas": "schemas depending on a property cannot be enforced",
    "dependencies": "properties required by others cannot be enforced",
    "unevaluatedProperties": "unevaluated properties cannot be tracked",
    "unevaluatedItems": "unevaluated items cannot be tracked",
    "$dynamicRef": "dynamic references cannot be resolved",
    "$recursiveRef": "dynamic references cannot be resolved",
}
"""Each keyword, with why the grammar cannot enforce it."""

CONSTRAINTS = frozenset(
    ("$ref", "anyOf", "oneOf", "allOf", "type", "const", "enum", "properties", "required", "additionalProperties",
     "items", "prefixItems", "minItems", "maxItems", "pattern", "format", "minLength", "maxLength", "minimum",
     "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
)  # fmt: skip
"""The keywords the converters read. Any other (``title``, ``description``, ``default``, pydantic's
``discriminator``) is an annotation that constrains nothing, unless it is in :data:`UNENFORCEABLE`."""

_NO_OP: dict[str, object] = {"uniqueItems": False, "minProperties": 0}
"""Values that constrain nothing: accepted."""


def refuse_unenforceable(schema: dict[str, Any], path: str) -> None:
    """A ``SchemaRefused`` naming the first keyword of this one schema object (its subschemas aside) that no
    grammar enforces, or a reference to another document (never fetched)."""
    for key in schema:
        if key in UNENFORCEABLE and not (key in _NO_OP and schema[key] == _NO_OP[key]):
            raise SchemaRefused(key, path, UNENFORCEABLE[key] + ".", f"Drop '{key}' from the schema.")
    ref = schema.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        raise SchemaRefused(
            "$ref", path, f"{ref!r} points outside the schema; remote references are never fetched.",
            "Put the definition under '$defs' and refer to it as '#/$defs/NAME'.",
        )  # fmt: skip


def beside(schema: dict[str, Any], combinator: str) -> dict[str, Any]:
    """The constraints written beside ``anyOf``/``oneOf`` in ``schema``: they hold for every alternative
    (pydantic writes ``{"anyOf": [{"type": "string"}, {"type": "null"}], "format": "email"}``)."""
    return {k: v for k, v in schema.items() if k in CONSTRAINTS and k != combinator}


def with_constraints(alternative: Any, constraints: dict[str, Any], path: str) -> dict[str, Any] | None:
    """``alternative`` with ``constraints`` (:func:`beside`) folded in, as one schema; None when no value can
    match both (their types do not meet). What cannot be folded is refused by name."""
    if not constraints:
        return alternative if isinstance(alternative, dict) else {}
    if alternative is True:
        alternative = {}
    if not isinstance(alternative, dict):
        raise SchemaRefused("$", path, "a schema must be an object (or true); false allows no value.")
    if "$ref" in alternative:
        key = next(iter(constraints))
        raise SchemaRefused(key, path, "beside the alternatives cannot be applied to one that is a '$ref'.")
    merged = {**constraints, **alternative}
    for key in constraints.keys() & alternative.keys():
        mine, theirs = constraints[key], alternative[key]
        if key == "type":
            kinds = _types_meeting(mine, theirs)
            if not kinds:
                return None
            merged["type"] = kinds[0] if len(kinds) == 1 else kinds
        elif key == "required" and isinstance(mine, list) and isinstance(theirs, list):
            merged["required"] = list(dict.fromkeys([*mine, *theirs]))
        elif mine != theirs:
            raise SchemaRefused(key, path, "is given both beside the alternatives and in this one.")
    return merged


def _types_meeting(a: Any, b: Any) -> list[str]:
    """The types both ``type`` values allow (an integer is a number)."""
    left = [a] if isinstance(a, str) else list(a)
    right = [b] if isinstance(b, str) else list(b)
    out = [t for t in right if t in left or (t == "integer" and "number" in left)]
    out += ["integer" for t in right if t == "number" and "integer" in left and "integer" not in out]
    return list(dict.fromkeys(out))
