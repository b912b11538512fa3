"""How a reply's JSON schema fares with llama-server's own converter (``common/json-schema.cpp`` and
``common/json-schema-to-grammar.cpp`` of the pinned llama.cpp), read from that source:

- what no grammar enforces (:mod:`.keywords`) is refused by name and path, as on the embedded engine;
- what it accepts without enforcing, where clover-local's grammar does enforce it: a number's bounds and
  ``multipleOf``, an integer's ``multipleOf`` or ``exclusiveMinimum`` beside ``minimum`` (it reads one), the
  string formats besides ``time`` and ``uuid`` (its ``date`` allows February 30th), any ``pattern`` (it takes
  an unanchored one, a lookaround or ``\\d`` as any string in silence, and its ``.`` and ``[^...]`` can write
  a raw ``"`` into the JSON), lengths beside a format, ``allOf`` (it keeps the properties of object parts and
  drops the rest), ``prefixItems`` beside ``items`` (it reads ``items`` only), a tuple's
  ``minItems``/``maxItems``, a ``required`` name missing from ``properties``, constraints beside
  ``anyOf``/``oneOf`` (it reads only the alternatives), a subschema that is ``true`` or ``false`` (it fails on
  any schema that is not an object). Such a schema is sent as clover-local's grammar instead.

Any other schema goes to llama-server as it came, held to none of the embedded engine's limits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from clover_local.engine.schema_gbnf.common import Document
from clover_local.engine.schema_gbnf.keywords import beside, refuse_unenforceable
from clover_local.engine.schema_gbnf.rules import FORMATS

_NUMBER_KEYS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_UPSTREAM_FORMATS = {"time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4", "uuid5"}
"""The formats llama-server's converter enforces exactly."""
_OWN_FORMATS = set(FORMATS) - _UPSTREAM_FORMATS


def unenforced_upstream(schema: Any) -> str | None:
    """The first keyword of ``schema`` that llama-server would accept and not enforce (None: it enforces all
    of it). A keyword no grammar enforces is a ``SchemaRefused`` naming it and its path."""
    found: str | None = None
    for node, path in _subschemas(schema):
        if isinstance(node, bool):
            found = found or "$"  # llama-server fails on a schema that is not an object ("true", "false")
            continue
        refuse_unenforceable(node, path)
        found = found or _gap(node)
    return found


def _subschemas(schema: Any) -> Iterator[tuple[dict[str, Any] | bool, str]]:
    """Each schema object the converters visit, with its path (a reference's target under the reference's
    name, as the converters name it): references are followed, unused ``$defs`` and the names in
    ``properties`` are not schemas and are passed over. Iterative, so nesting costs no stack."""
    doc = Document(schema, "")
    seen: set[int] = set()
    stack: list[tuple[Any, str]] = [(schema, "#")]
    while stack:
        node, path = stack.pop()
        if isinstance(node, bool):
            yield node, path
            continue
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        yield node, path
        children: list[tuple[Any, str]] = []
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#"):
            children.append((doc.resolve(ref, path), ref))
        for key in ("anyOf", "oneOf", "allOf", "prefixItems", "items"):
            value = node.get(key)
            if isinstance(value, list):
                children += [(s, f"{path}/{key}/{i}") for i, s in enumerate(value)]
        if isinstance(node.get("items"), dict | bool):
            children.append((node["items"], f"{path}/items"))
        if isinstance(node.get("additionalProperties"), dict):
            children.append((node["additionalProperties"], f"{path}/additionalProperties"))
        props = node.get("properties")
        if isinstance(props, dict):
            children += [(s, f"{path}/properties/{name}") for name, s in props.items()]
        stack += reversed(children)


def _gap(node: dict[str, Any]) -> str | None:
    """A keyword of this one schema object that llama-server's converter would pass over."""
    kind = node.get("type")
    kinds: list[Any] = kind if isinstance(kind, list) else [kind]
    if "number" in kinds and any(k in node for k in _NUMBER_KEYS):
        return str(next(k for k in node if k in _NUMBER_KEYS))
    if "integer" in kinds and "multipleOf" in node:
        return "multipleOf"
    for inclusive, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if "integer" in kinds and inclusive in node and exclusive in node:
            return exclusive  # it reads the inclusive bound only (and a draft-4 boolean not at all)
    if node.get("format") in _OWN_FORMATS:
        return "format"
    if "pattern" in node:
        return "pattern"
    if node.get("format") in _UPSTREAM_FORMATS and ("minLength" in node or "maxLength" in node):
        return "minLength" if "minLength" in node else "maxLength"
    if "allOf" in node:
        return "allOf"
    for key in ("oneOf", "anyOf"):
        if key in node and (constraints := beside(node, key)):
            return next(iter(constraints))
    if "prefixItems" in node and "items" in node:
        return "prefixItems"
    tuple_items = "prefixItems" in node or isinstance(node.get("items"), list)
    if tuple_items and ("minItems" in node or "maxItems" in node):
        return "minItems" if "minItems" in node else "maxItems"
    required, props = node.get("required"), node.get("properties")
    if isinstance(required, list) and any(
        r not in (props if isinstance(props, dict) else {}) for r in required
    ):
        return "required"
    return None
