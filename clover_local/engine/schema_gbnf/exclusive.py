"""``oneOf``: its alternatives must never both match, or a reply could be valid under two (both upstream
converters wrote ``oneOf`` as ``anyOf``). Each alternative is checked against every other as the schema gives
it, for a difference that keeps what it writes from matching the other (types, listed values, the first
characters of patterns, a key one requires and the other forbids); where none is found it is made apart (a key
the other requires made absent, a key the other forbids made required, the other's listed strings excluded),
or left out."""

from __future__ import annotations

from typing import Any

from clover_local.engine.schema_gbnf.branches import ALL_TYPES, finite, resolved, type_of, without
from clover_local.engine.schema_gbnf.common import Document
from clover_local.engine.schema_gbnf.keywords import valid_in_document
from clover_local.engine.schema_gbnf.limits import SchemaRefused
from clover_local.engine.schema_gbnf.merge import NOT_IN, canonical, merge
from clover_local.engine.schema_gbnf.regex_facts import first_chars

MAX_ALTERNATIVES = 64
"""``oneOf`` alternatives checked pairwise (each pair costs up to a validation per listed value)."""
MAX_VALUES_CHECKED = 256
"""Listed values checked one by one against another alternative; past this, the two are not shown apart."""


def exclusive(alternatives: list[Any], doc: Document, path: str) -> list[tuple[int, Any]]:
    """``oneOf``'s alternatives, each written so that what it writes matches none of the others as the schema
    gives them: apart already, or made so by making a key another requires absent. One that cannot be kept
    apart is not written (a subset); when none is left the schema is refused."""
    if len(alternatives) > MAX_ALTERNATIVES:
        raise SchemaRefused("oneOf", path, f"{len(alternatives)} alternatives; at most {MAX_ALTERNATIVES} are kept "
                            "apart from each other.")  # fmt: skip
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
    mine_d, other_d = resolved(mine, doc, path), resolved(other, doc, path)
    if not isinstance(mine_d, dict) or not isinstance(other_d, dict):
        return None
    listed_other = finite(other_d)
    if isinstance(listed_other, list) and not isinstance(finite(mine_d), list):
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
        return set(ALL_TYPES) | {"integer"}
    values = finite(schema)
    if isinstance(values, list):
        return set(_listed_facts(values)[1])
    kind = schema.get("type")
    if kind is None:
        if written and ("properties" in schema or "required" in schema or "additionalProperties" in schema):
            return {"object"}
        return set(ALL_TYPES) | {"integer"}
    kinds = {kind} if isinstance(kind, str) else set(kind)
    return kinds | ({"integer"} if "number" in kinds else set())


def _apart(a: Any, b: Any, doc: Document, depth: int) -> bool:
    """Whether no value the converter writes for ``a`` matches ``b`` (False: not shown)."""
    if depth > 8:
        return False
    a, b = resolved(a, doc, "#"), resolved(b, doc, "#")
    if a is False or b is False:
        return True
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    ta, tb = _types(a, written=True), _types(b, written=False)
    if not (ta & tb):
        return True
    va, vb = finite(a), finite(b)
    if isinstance(va, list) and isinstance(vb, list) and not _listed_facts(va)[0] & _listed_facts(vb)[0]:
        return True
    for values, other in ((va, b), (vb, a)):
        if (
            isinstance(values, list)
            and len(values) <= MAX_VALUES_CHECKED
            and (
                all(isinstance(v, str) and v in other.get(NOT_IN, ()) for v in values)
                or all(valid_in_document(v, other, doc.root) is False for v in values)
            )
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


_FACTS: dict[int, tuple[list[Any], frozenset[str], frozenset[str]]] = {}


def _listed_facts(values: list[Any]) -> tuple[frozenset[str], frozenset[str]]:
    """The canonical texts of listed values and their types, kept for the list while it is the one at that
    address: one ``oneOf``'s lists are compared with each other many times."""
    kept = _FACTS.get(id(values))
    if kept is None or kept[0] is not values:
        if len(_FACTS) > 4096:
            _FACTS.clear()
        kept = (values, frozenset(canonical(v) for v in values), frozenset(type_of(v) for v in values))
        _FACTS[id(values)] = kept
    return kept[1], kept[2]


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
