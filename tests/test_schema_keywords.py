"""Issue 41: the keywords real schemas use, enforced on both engines by one grammar (the llama-server route
sends the embedded engine's grammar), the three soundness faults of 4 December fixed, and every refusal named
by keyword at a path that exists. Each grammar is read as a regex (``tests/gbnf_regex.py``) and sampled
(``tests/gbnf_sample.py``): what it writes, ``jsonschema`` accepts."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest

from clover_local.engine.schema_gbnf import LIMITS, SchemaRefused, schema_grammar
from clover_local.engine.schema_gbnf.limits import Limits
from clover_local.llamacpp.server_tools import schema_fields
from tests.gbnf_regex import to_regex
from tests.real_schemas import resolve_pointer, validator, violations


def _parses_in_llama_cpp(gbnf: str) -> None:
    from llama_cpp.llama_grammar import LlamaGrammar

    LlamaGrammar.from_string(gbnf, verbose=False)


def _enforced(schema: dict[str, Any], good: list[Any], bad: list[Any], left_out: list[Any] = ()) -> str:  # type: ignore[assignment]
    """The grammar parses in llama.cpp; it writes every ``good`` instance, none of ``bad`` (each invalid, as
    ``jsonschema`` agrees) nor of ``left_out`` (valid, but outside the subset the grammar writes); its random
    sentences are all valid; and the llama-server route sends the very same grammar."""
    gbnf = schema_grammar(schema)
    _parses_in_llama_cpp(gbnf)
    assert schema_fields(schema) == {"grammar": gbnf}, "both engines sample under one grammar"
    check = validator(schema)
    pattern = to_regex(gbnf)
    for value in good:
        assert check.is_valid(value), value
        assert pattern.fullmatch(json.dumps(value)), value
    for value in bad:
        assert not check.is_valid(value), value
        assert not pattern.fullmatch(json.dumps(value)), value
    for value in left_out:
        assert check.is_valid(value), value
        assert not pattern.fullmatch(json.dumps(value)), value
    assert list(violations(gbnf, schema, 60, seed=41)) == []
    return gbnf


def _refused(schema: dict[str, Any]) -> SchemaRefused:
    """The same refusal on both engines, at a place the schema has."""
    with pytest.raises(SchemaRefused) as embedded:
        schema_grammar(schema)
    with pytest.raises(SchemaRefused) as server:
        schema_fields(schema)
    refusal = embedded.value
    assert (refusal.keyword, refusal.path) == (server.value.keyword, server.value.path)
    resolve_pointer(schema, refusal.path)
    assert refusal.keyword in str(refusal) and refusal.path in str(refusal)
    return refusal


# --- the three faults ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
         "properties": {"x": {"$ref": "#num"}}, "required": ["x"],
         "definitions": {"n": {"$id": "#num", "type": "integer", "minimum": 1}}},
        {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
         "properties": {"x": {"$ref": "#num"}}, "required": ["x"],
         "definitions": {"n": {"id": "#num", "type": "integer", "minimum": 1}}},
        {"type": "object", "properties": {"x": {"$ref": "#num"}}, "required": ["x"],
         "$defs": {"n": {"$anchor": "num", "type": "integer", "minimum": 1}}},
    ],
)  # fmt: skip
def test_a_plain_name_reference_resolves_to_the_subschema_it_names(schema: dict[str, Any]) -> None:
    """4 December: ``"$ref": "#num"`` resolved to the root, and ``{"x": {"x": {...}}}`` came back as HTTP 200."""
    _enforced(schema, good=[{"x": 5}], bad=[{"x": {"x": 5}}, {"x": 0}])


def test_a_percent_encoded_reference_is_decoded() -> None:
    """RFC 6901 section 6: a JSON pointer in a URI fragment is percent-encoded; jsonschema resolves it."""
    schema = {"type": "object", "properties": {"a": {"$ref": "#/definitions/%5Bkind%5D%20x"}}, "required": ["a"],
              "definitions": {"[kind] x": {"enum": ["p", "q"]}}}  # fmt: skip
    _enforced(schema, good=[{"a": "p"}], bad=[{"a": "r"}])


@pytest.mark.parametrize("bound", [2001, 2048, 4096, 32767])
def test_a_bound_past_2000_is_written_so_llama_cpp_keeps_it(bound: int) -> None:
    """llama.cpp's grammar parser reads a maximum above 2,000 as no maximum: ``maxLength: 2001`` let 2,617
    characters through on the llama-server route. Past 2,000 a bound is written as nested repetitions, each
    at most 2,000, on both engines."""
    schema = {
        "type": "object",
        "properties": {"s": {"type": "string", "maxLength": bound}},
        "required": ["s"],
    }
    gbnf = _enforced(schema, good=[{"s": "a" * bound}, {"s": ""}], bad=[{"s": "a" * (bound + 1)}])
    assert all(int(n) <= LIMITS.max_count for n in __import__("re").findall(r"\{(?:\d+,)?(\d+)\}", gbnf))
    minimum = {"type": "string", "minLength": bound}
    _enforced(minimum, good=["b" * bound], bad=["b" * (bound - 1)])


@pytest.mark.parametrize(("lo", "hi"), [(0, 23), (3, 17), (7, None), (11, 11), (0, 5), (26, 26), (2, 40)])
def test_nested_repetitions_allow_exactly_the_counts_asked(lo: int, hi: int | None) -> None:
    """With repetitions of at most 5 (a small stand-in for 2,000), every count from ``lo`` to ``hi`` and no
    other is written, for characters and for array items."""
    small = Limits(max_count=5)
    schema: dict[str, Any] = {"type": "string", "minLength": lo}
    items: dict[str, Any] = {"type": "array", "items": {"const": 1}, "minItems": lo}
    if hi is not None:
        schema["maxLength"] = hi
        items["maxItems"] = hi
    chars, array = to_regex(schema_grammar(schema, small)), to_regex(schema_grammar(items, small))
    for n in range(0, 45):
        expected = n >= lo and (hi is None or n <= hi)
        assert bool(chars.fullmatch(json.dumps("x" * n))) == expected, n
        assert bool(array.fullmatch(json.dumps([1] * n))) == expected, n


# --- refusals named by keyword and a path that exists -----------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "if": {"properties": {"a": {"minimum": 3}}},
          "then": {"required": ["a"]}}, "if", "#/if/properties/a"),
        ({"type": ["string", "null"], "pattern": "^(?=a)"}, "pattern", "#"),
        ({"type": "object", "properties": {"a": {"type": "string", "not": {"pattern": "^x"}}}}, "not", "#/properties/a/not"),
        ({"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2}, "uniqueItems", "#"),
        ({"type": "array", "contains": {"const": 1}}, "contains", "#"),
        ({"type": "object", "properties": {"k": {"oneOf": [{"const": i} for i in range(65)]}}}, "oneOf", "#/properties/k"),
        ({"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
          "$defs": {"n": {"type": "object", "properties": {"kid": {"$ref": "#/$defs/n"}}, "required": ["kid"]}}},
         "$ref", "#/$defs/n"),
        ({"allOf": [{"$ref": "#/$defs/a"}], "$defs": {"a": {"type": "string", "pattern": "^a", "allOf": [{"pattern": "b$"}]}}},
         "pattern", "#/$defs/a"),
        ({"type": "object", "properties": {"a~b/c": {"type": "string", "format": "date", "maxLength": 5}}},
         "maxLength", "#/properties/a~0b~1c"),
    ],
)  # fmt: skip
def test_a_refusal_names_the_keyword_at_a_path_that_exists(
    schema: dict[str, Any], keyword: str, path: str
) -> None:
    """4 December: ``if``/``then``/``else`` was reported as ``allOf`` or ``$``, and a type list's refusal at
    ``#/type/0/...``, which is no place in the schema. A schema whose values would have to hold themselves is
    refused too: its grammar has no finite sentence, so a reply that went down it could never end."""
    refusal = _refused(schema)
    assert (refusal.keyword, refusal.path) == (keyword, path)


def test_a_repetition_llama_cpp_cannot_hold_is_a_named_refusal_on_both_engines() -> None:
    """``minLength: 2001`` was a 400 naming no keyword on the llama-server route. Now it is enforced; what is
    over a limit is refused by name on both engines alike."""
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "maxLength": 2000} for i in range(60)},
    }
    assert _refused(wide).keyword == "maxLength"


# --- what a grammar can hold ----------------------------------------------------------------------------------


def test_pattern_properties_and_property_names_decide_the_keys() -> None:
    _enforced(
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
         "patternProperties": {"^x-[a-z]+$": {"type": "integer"}}, "additionalProperties": False},
        good=[{"name": "a", "x-ab": 3}, {"name": "b"}],
        bad=[{"name": "a", "x-ab": "3"}, {"name": "a", "other": 1}],
    )  # fmt: skip
    _enforced(
        {"type": "object", "propertyNames": {"pattern": "^[a-z]{1,8}$"}, "additionalProperties": {"type": "boolean"}},
        good=[{"ab": True}, {}],
        bad=[{"AB": True}, {"ab": 1}],
    )  # fmt: skip
    _enforced(
        {"type": "object", "propertyNames": {"enum": ["red", "blue"]}, "additionalProperties": {"type": "integer"}},
        good=[{"red": 1}],
        bad=[{"green": 1}],
    )  # fmt: skip


def test_keys_required_by_other_keys() -> None:
    props = {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}
    _enforced(
        {"type": "object", "properties": props, "dependentRequired": {"a": ["b"]}},
        good=[{"a": 1, "b": 2}, {"b": 2}, {}],
        bad=[{"a": 1}, {"a": 1, "c": 3}],
    )
    _enforced(
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "properties": props,
         "dependencies": {"a": ["c"], "b": {"required": ["a"]}}},
        good=[{"a": 1, "c": 3}, {"a": 1, "b": 2, "c": 3}, {}],
        bad=[{"a": 1}, {"b": 2}],
    )  # fmt: skip


def test_if_then_else_on_a_key_s_value_or_presence() -> None:
    schema = {
        "type": "object",
        "properties": {
            "kind": {"enum": ["file", "url"]},
            "path": {"type": "string"},
            "href": {"type": "string"},
        },
        "required": ["kind"],
        "if": {"properties": {"kind": {"const": "file"}}},
        "then": {"required": ["path"]},
        "else": {"required": ["href"]},
    }
    _enforced(schema, good=[{"kind": "file", "path": "a"}, {"kind": "url", "href": "b"}],
              bad=[{"kind": "file", "href": "b"}, {"kind": "url"}])  # fmt: skip
    presence = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "maximum": 0}},
                "if": {"required": ["a"]}, "then": {"properties": {"b": {"minimum": -5}}}}  # fmt: skip
    _enforced(presence, good=[{"a": 1, "b": -5}, {"b": -9}], bad=[{"a": 1, "b": -9}])


def test_if_on_the_keys_of_a_nested_object_or_not_of_a_condition() -> None:
    """GitHub's action.yml schema asks ``if: {properties: {runs: {properties: {using: {const: ...}}}}}``;
    size-limit's asks ``if: {not: {...}}``."""
    runs = {
        "type": "object",
        "properties": {"using": {"enum": ["composite", "node"]}, "steps": {"type": "integer"}},
    }
    nested = {"type": "object", "properties": {"runs": runs, "name": {"type": "string"}}, "required": ["runs"],
              "if": {"properties": {"runs": {"properties": {"using": {"const": "composite"}}}}},
              "then": {"properties": {"runs": {"required": ["steps"]}}}, "else": {"required": ["name"]}}  # fmt: skip
    _enforced(nested, good=[{"runs": {"steps": 1, "using": "composite"}}, {"runs": {"using": "node"}, "name": "n"}],
              bad=[{"runs": {"using": "composite"}}, {"runs": {"using": "node"}}])  # fmt: skip
    negated = {"type": "object", "properties": {"webpack": {"type": "boolean"}, "config": {"type": "string"}},
               "if": {"not": {"properties": {"webpack": {"enum": [False]}}}}, "then": {"required": ["config"]}}  # fmt: skip
    _enforced(negated, good=[{"webpack": True, "config": "c"}, {"webpack": False}], bad=[{"webpack": True}])


def test_all_of_merges_any_parts_and_keeps_each_part_s_additional_properties() -> None:
    _enforced(
        {"allOf": [{"type": "string", "minLength": 2}, {"maxLength": 4}, {"pattern": "^[a-z]+$"}]},
        good=["ab", "abcd"],
        bad=["a", "abcde", "AB"],
    )
    _enforced(
        {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False},
                   {"properties": {"b": {"type": "integer"}}}]},
        good=[{"a": 1}, {}],
        bad=[{"a": 1, "b": 2}],
    )  # fmt: skip


def test_one_of_writes_values_that_match_exactly_one_alternative() -> None:
    """Both converters used to write ``oneOf`` as ``anyOf``: a value matching two alternatives is invalid."""
    props = {"a": {"type": "integer"}, "b": {"type": "integer"}}
    _enforced(
        {"type": "object", "properties": props, "oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
        good=[{"a": 1}, {"b": 2}],
        bad=[{"a": 1, "b": 2}, {}],
    )
    _enforced(
        {"oneOf": [{"enum": ["pages", "posts"]}, {"type": "string", "minLength": 1}]},
        good=["draft"],
        bad=["pages", ""],
    )


def test_not_unique_items_and_counts_of_properties() -> None:
    _enforced({"type": "integer", "not": {"enum": [0]}}, good=[-3, 4], bad=[0])
    _enforced({"type": ["string", "null"], "not": {"type": "null"}}, good=["x"], bad=[None])
    _enforced(
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
         "not": {"required": ["a", "b"]}},
        good=[{"a": 1}, {"b": 1}, {}],
        bad=[{"a": 1, "b": 2}],
    )  # fmt: skip
    _enforced({"type": "array", "items": {"enum": ["r", "g", "b"]}, "uniqueItems": True},
              good=[["r", "b"], []], bad=[["r", "r"]], left_out=[["b", "r"]])  # fmt: skip
    _enforced({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
              good=[[5], []], bad=[[1, 1]], left_out=[[1, 2]])  # fmt: skip
    _enforced({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
               "minProperties": 1, "maxProperties": 1},
              good=[{"a": 1}], bad=[{}, {"a": 1, "b": 2}], left_out=[{"b": 1}])  # fmt: skip


def test_lengths_beside_a_pattern_or_a_format() -> None:
    _enforced({"type": "string", "pattern": "^[a-z0-9-]+$", "maxLength": 6, "minLength": 2},
              good=["ab-1", "abcdef"], bad=["a", "abcdefg", "AB"])  # fmt: skip
    _enforced({"type": "string", "format": "date", "maxLength": 10}, good=["2024-02-29"], bad=["2024-02-30"])
    assert _refused({"type": "string", "format": "email", "maxLength": 20}).keyword == "maxLength"


def test_every_format_jsonschema_checks_is_written_as_a_value_it_accepts() -> None:
    for fmt in ("regex", "uri", "uri-reference", "json-pointer", "relative-json-pointer", "idn-hostname",
                "idn-email", "color", "email", "hostname", "ipv4", "ipv6", "date-time", "time", "duration"):  # fmt: skip
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "string", "format": fmt}
        assert list(violations(schema_grammar(schema), schema, 80, seed=7)) == [], fmt


def test_an_optional_property_no_value_matches_is_left_out() -> None:
    """An ``enum`` of the wrong type under an optional key (seen in BFCL's live function definitions) is no
    reason to refuse the schema: the key is not written."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "m": {"type": "array", "enum": ["x"]}},
    }
    _enforced(schema, good=[{"n": 1}], bad=[{"m": "x"}])
    with pytest.raises(SchemaRefused):
        schema_grammar({**schema, "required": ["m"]})
    assert jsonschema.Draft202012Validator(schema).is_valid({"n": 1})


# --- schemas that plainly allow no value (issue 49, part 6) -------------------------------------------------

_NEVER = [
    {"not": {}},
    {"not": True},
    {"description": "gone", "not": {"title": "anything", "$comment": "annotations only"}},
    {"type": "string", "not": {}},
    {"allOf": [{"type": "string"}, {"not": {}}]},
    {"anyOf": [{"not": {}}, {"not": {"description": "x"}}]},
    {"not": {"anyOf": [{"type": "string"}, {}]}},
    {"$ref": "#/$defs/never"},
]


@pytest.mark.parametrize("never", _NEVER)
def test_a_property_no_value_can_have_is_left_out_and_refused_where_required(never: dict[str, Any]) -> None:
    """JSONSchemaBench's draft-4 schemas forbid a key as ``{"not": {}}`` (draft 4 has no ``false``): 5 of its
    sample's 14 refusals on 5 December. An optional key under such a schema can never be written, so it is left
    out; a required one means no object matches, a 400 that says so."""
    schema = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": never},
        "$defs": {"never": {"not": {}}},
    }
    _enforced(schema, good=[{"a": 1}, {}], bad=[{"b": 1}, {"a": 1, "b": "x"}, {"b": None}])
    refusal = _refused({**schema, "required": ["b"]})
    assert "no reply could ever be valid" in str(refusal)


def test_extra_keys_items_and_alternatives_no_value_can_have_are_never_written() -> None:
    draft4 = "http://json-schema.org/draft-04/schema#"
    _enforced({"$schema": draft4, "type": "object", "properties": {"a": {"type": "integer"}},
               "additionalProperties": {"not": {}}}, good=[{"a": 1}], bad=[{"a": 1, "z": 2}])  # fmt: skip
    _enforced({"type": "object", "properties": {"a": {"type": "integer"}}, "patternProperties": {"^x-": {"not": {}}}},
              good=[{"a": 1}], bad=[{"x-y": 1}], left_out=[{"z": 1}])  # fmt: skip
    _enforced({"type": "array", "items": {"not": {}}}, good=[[]], bad=[[1], [None]])
    assert "no reply could ever be valid" in str(
        _refused({"type": "array", "items": {"not": {}}, "minItems": 1})
    )
    _enforced({"oneOf": [{"type": "string"}, {"not": {}}]}, good=["x"], bad=[1])
    _enforced({"anyOf": [{"type": "integer"}, {"type": "string", "not": {}}]}, good=[3], bad=["x"])
    _enforced({"type": "string", "not": {"not": {}}}, good=["x"], bad=[1])  # not of nothing: everything
    assert "no reply could ever be valid" in str(_refused({"not": {}}))


def test_merged_nots_are_one_condition() -> None:
    """appveyor's ``allOf`` of four ``not: {required: [k]}`` (and chrome-manifest's dependencies, three): merged
    as ``not`` of one ``anyOf``, not an ``anyOf`` nested in another."""
    props = {k: {"type": "integer"} for k in "abc"}
    _enforced({"type": "object", "properties": props,
               "allOf": [{"not": {"required": [k]}} for k in "abc"]},
              good=[{}], bad=[{"a": 1}, {"c": 1}], left_out=[])  # fmt: skip
    _enforced({"type": "object", "properties": props, "dependentSchemas": {k: {"not": {"required": [k]}} for k in "ab"}},
              good=[{"c": 1}, {}], bad=[{"a": 1}, {"b": 1, "c": 2}])  # fmt: skip


@pytest.mark.parametrize(
    "negated",
    [
        {"x-vendor": True},  # an unknown keyword: maybe a constraint to someone, not shown trivial
        {"pattern": "^x"},
        {"$ref": "#/$defs/t"},  # references are not followed to decide it
        {"type": "string", "not": {"type": "integer"}},
        {"anyOf": [{"type": "string"}, {"type": "integer"}]},
    ],
)  # fmt: skip
def test_a_not_that_is_not_plainly_trivial_is_still_refused(negated: dict[str, Any]) -> None:
    schema = {"type": "object", "properties": {"b": {"not": negated}}, "$defs": {"t": {"pattern": "^a"}}}
    assert _refused(schema).keyword == "not"


def test_what_allows_everything_or_nothing_is_told_from_its_keywords_only() -> None:
    from clover_local.engine.schema_gbnf.merge import allows_everything, allows_nothing

    assert all(allows_everything(s) for s in (True, {}, {"title": "t"}, {"anyOf": [{"type": "string"}, {}]},
                                              {"allOf": [{}, {"$comment": "c"}]}, {"not": {"not": {}}}))  # fmt: skip
    assert not any(allows_everything(s) for s in (False, {"type": "string"}, {"$ref": "#"}, {"oneOf": [{}]},
                                                  {"x-vendor": 1}))  # fmt: skip
    assert all(allows_nothing(s) for s in (False, {"not": {}}, {"type": "string", "not": True},
                                           {"allOf": [{}, {"not": {}}]}, {"oneOf": [{"not": {}}]}))  # fmt: skip
    assert not any(allows_nothing(s) for s in (True, {}, {"not": {"type": "string"}}, {"anyOf": []}))
    deep: Any = {}
    for _ in range(40):  # past the depth looked at: not shown, never a guess (and never a deep recursion)
        deep = {"not": {"not": deep}}
    assert not allows_everything(deep) and not allows_nothing({"not": deep})
