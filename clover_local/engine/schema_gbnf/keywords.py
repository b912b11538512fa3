"""The one table of what a grammar here cannot enforce, for both engines: the embedded engine samples under
clover-local's grammar, and the llama-server route sends llama-server the same grammar
(``llamacpp.server_tools.schema_fields``), so a schema is accepted or refused alike, with the same keyword and
path. A schema that uses a keyword below is refused by name and path, never answered with a reply that
ignores it. Everything else a schema says is enforced, or written as a subset of what it allows (the converter
and ``docs/agents.md`` say where)."""

from __future__ import annotations

import json
from typing import Any

from clover_local.engine.schema_gbnf.branches import type_of
from clover_local.engine.schema_gbnf.limits import SchemaRefused, Unsatisfiable
from clover_local.engine.schema_gbnf.merge import merge

UNENFORCEABLE: dict[str, str] = {
    "contains": "the grammar cannot require one item among any others",
    "unevaluatedProperties": "unevaluated properties cannot be tracked",
    "unevaluatedItems": "unevaluated items cannot be tracked",
    "$dynamicRef": "dynamic references cannot be resolved",
    "$recursiveRef": "dynamic references cannot be resolved",
}
"""Each keyword, with why the grammar cannot enforce it."""

CONSTRAINTS = frozenset(
    ("$ref", "anyOf", "oneOf", "allOf", "type", "const", "enum", "properties", "required", "additionalProperties",
     "items", "prefixItems", "minItems", "maxItems", "pattern", "format", "minLength", "maxLength", "minimum",
     "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "patternProperties", "propertyNames",
     "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies", "uniqueItems",
     "not", "if", "then", "else", *UNENFORCEABLE)
)  # fmt: skip
"""The keywords the converter reads. Any other (``title``, ``description``, ``default``, pydantic's
``discriminator``) is an annotation that constrains nothing."""

_NO_OP: dict[str, object] = {"unevaluatedProperties": True, "unevaluatedItems": True}
"""Values that constrain nothing: accepted."""
_LOCAL = ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength",
          "maxLength", "pattern", "minItems", "maxItems", "required", "minProperties", "maxProperties",
          "uniqueItems", "$schema")  # fmt: skip


def refuse_unenforceable(schema: dict[str, Any], path: str) -> None:
    """A ``SchemaRefused`` naming the first keyword of this one schema object (its subschemas aside) that no
    grammar enforces."""
    for key in schema:
        if key in UNENFORCEABLE and not (key in _NO_OP and schema[key] == _NO_OP[key]):
            raise SchemaRefused(key, path, UNENFORCEABLE[key] + ".", f"Drop '{key}' from the schema.")


def beside(schema: dict[str, Any]) -> dict[str, Any]:
    """The constraints written beside ``anyOf``/``oneOf`` in ``schema``: they hold for every alternative
    (pydantic writes ``{"anyOf": [{"type": "string"}, {"type": "null"}], "format": "email"}``)."""
    return {k: v for k, v in schema.items() if k in CONSTRAINTS and k not in ("anyOf", "oneOf")}


def with_constraints(alternative: Any, constraints: dict[str, Any], path: str) -> Any:
    """``alternative`` with ``constraints`` (:func:`beside`) folded in, as one schema; False when no value can
    match both. What cannot be folded is refused by name."""
    if alternative is False:
        return False
    if not constraints:
        return alternative if isinstance(alternative, dict) else {}
    return merge(constraints, True if alternative == {} else alternative, path)


def listed_values(schema: dict[str, Any], path: str, max_enum: int) -> list[Any]:
    """The values of ``const``/``enum`` that the schema's other keywords (those of this one object) allow: a
    listed value of the wrong type is never written."""
    import jsonschema

    key = "const" if "const" in schema else "enum"
    values = [schema["const"]] if key == "const" else schema["enum"]
    if not isinstance(values, list) or not values:
        raise SchemaRefused("enum", path, "must be a non-empty array.")
    if len(values) > max_enum:
        raise SchemaRefused("enum", path, f"{len(values)} values, over the limit of {max_enum}.")
    local = {k: v for k, v in schema.items() if k in _LOCAL}
    if set(local) - {"$schema"} == {"type"}:  # the common case, without a validator per value
        kinds = {local["type"]} if isinstance(local["type"], str) else set(local["type"])
        values = [v for v in values if type_of(v) in kinds or (type_of(v) == "integer" and "number" in kinds)]
    elif len(local) > ("$schema" in local):
        check = jsonschema.validators.validator_for(local, default=jsonschema.Draft202012Validator)(local)
        values = [v for v in values if _valid(check, v)]
    unique = list({json.dumps(v, sort_keys=True): v for v in values}.values())
    if not unique:
        raise Unsatisfiable(key, path, "no value listed matches the schema's other keywords.")
    return unique


def name_matches(name: str, schema: Any) -> bool:
    """Whether a property name matches a ``propertyNames`` schema (its own keywords; references followed)."""
    import jsonschema

    if schema is True:
        return True
    if schema is False or not isinstance(schema, dict):
        return False
    return _valid(jsonschema.Draft202012Validator(schema), name)


def valid_in_document(value: Any, schema: Any, root: Any) -> bool | None:
    """Whether ``value`` matches ``schema``, a subschema of the document ``root`` (its references resolve
    against it); None when that cannot be told here."""
    import jsonschema
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    try:
        cls = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)
        resource = Resource.from_contents(root, default_specification=DRAFT202012)
        registry: Registry[Any] = Registry().with_resource("", resource)
        return bool(cls(schema, registry=registry).is_valid(value))
    except Exception:
        return None


def _valid(check: Any, value: Any) -> bool:
    try:
        return bool(check.is_valid(value))
    except Exception:  # a pattern Python's re cannot read, a reference left inside: not shown valid
        return False
