"""clover-local's JSON-Schema-to-GBNF converter: each grammar parses with llama.cpp's own parser, and (read as a
regex, ``tests/gbnf_regex.py``) accepts what the schema accepts and refuses what it refuses; what it cannot
enforce, or what is over a limit, is refused with the keyword and its path, before anything big is built."""

from __future__ import annotations

import datetime
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from clover_local.engine import grammar, toolcalls
from clover_local.engine.schema_gbnf import SchemaRefused, schema_grammar
from clover_local.engine.schema_gbnf.intrange import min_max_int
from clover_local.engine.schema_gbnf.keywords import UNENFORCEABLE
from clover_local.engine.schema_gbnf.rules import FORMATS
from clover_local.engine.schema_gbnf.shortest import shortest_json
from clover_local.engine.types import GenerationRequest, ToolSpec
from clover_local.errors import RequestRefused
from clover_local.llamacpp.server_tools import agent_payload, schema_fields
from tests.gbnf_regex import to_regex
from tests.schema_corpus import CORPUS, FORMAT_CHECKER, validate


def _parses_in_llama_cpp(gbnf: str) -> None:
    from llama_cpp.llama_grammar import LlamaGrammar

    LlamaGrammar.from_string(gbnf, verbose=False)


def _accepts(schema: dict[str, Any], text: str) -> bool:
    return to_regex(schema_grammar(schema)).fullmatch(text) is not None


@pytest.mark.parametrize(
    ("lo", "hi"),
    [
        (0, 130),
        (1, None),
        (None, -5),
        (None, -1),
        (-37, 412),
        (7, 7),
        (None, 0),
        (0, None),
        (-1000, None),
        (95, 1005),
    ],
)
def test_integer_ranges_are_digit_wise_and_exact(lo: int | None, hi: int | None) -> None:
    pattern = to_regex(f"root ::= {min_max_int(lo, hi)}")
    for n in range(-1300, 1300):
        assert bool(pattern.fullmatch(str(n))) == ((lo is None or n >= lo) and (hi is None or n <= hi)), n
    assert not pattern.fullmatch("007"), 'no leading zeros ("-0" is JSON for 0, as in llama.cpp)'
    assert not pattern.fullmatch("-01") and not pattern.fullmatch("-007"), "not after a sign either"


def test_a_wide_range_is_a_short_rule_not_an_enumeration() -> None:
    rule = min_max_int(1024, 65535)
    assert len(rule) < 400
    pattern = to_regex(f"root ::= {rule}")
    for n in (1023, 1024, 5000, 9999, 10000, 65535, 65536, 99999, 100000):
        assert bool(pattern.fullmatch(str(n))) == (1024 <= n <= 65535), n


def test_number_bounds_are_enforced() -> None:
    schema = {"type": "object", "properties": {"t": {"type": "number", "exclusiveMinimum": 0, "maximum": 2}}}
    schema["required"] = ["t"]
    for t, ok in (
        ("12321232123", False),
        ("1.5", True),
        ("2", True),
        ("0.25", True),
        ("0", False),
        ("2.5", False),
    ):
        assert _accepts(schema, f'{{"t": {t}}}') == ok, t
    assert _accepts({"type": "number", "minimum": -3.5}, "-3") and not _accepts(
        {"type": "number", "minimum": -3.5}, "-4"
    )
    assert _accepts({"type": "number", "multipleOf": 0.01, "minimum": 0}, "3.25")
    assert not _accepts({"type": "number", "multipleOf": 0.01, "minimum": 0}, "3.251")


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        ({"type": "string", "format": "date-time"}, '"2024-02-29T13:05:00Z"', '"2024-13-01T00:00:00Z"'),
        ({"type": "string", "format": "date"}, '"2024-02-29"', '"24-02-29"'),
        ({"type": "string", "format": "time"}, '"23:59:07.125+05:30"', '"24:00:00Z"'),
        ({"type": "string", "format": "ipv6"}, '"2001:db8:0:0:0:ff00:42:8329"', '"2001:db8::g"'),
        ({"type": "string", "format": "email"}, '"ana.b@example.org"', '"ana@"'),
        ({"type": "string", "format": "ipv4"}, '"192.168.0.255"', '"256.1.1.1"'),
        ({"type": "string", "format": "uuid"}, '"123e4567-e89b-12d3-a456-426614174000"', '"123e4567"'),
        ({"type": "string", "format": "duration"}, '"P3DT4H"', '"P"'),
        ({"type": "string", "format": "hostname"}, '"api.example.com"', '"-bad.com"'),
        ({"type": "string", "pattern": "^[a-z]+\\d{2}$"}, '"ab12"', '"ab1"'),
        ({"type": "string", "pattern": "abc"}, '"xxabcx"', '"xxabx"'),
        ({"type": "string", "minLength": 2, "maxLength": 3}, '"abc"', '"abcd"'),
        ({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 2}, "[1, 2]", "[]"),
        ({"type": "array", "prefixItems": [{"type": "integer"}, {"const": "x"}], "items": False}, '[1, "x"]', "[1]"),
        ({"enum": [1, "a", None, {"b": [2]}]}, '{"b":[2]}', '"b"'),
        ({"const": {"k": True}}, '{"k":true}', '{"k":false}'),
        ({"type": "object", "additionalProperties": {"type": "integer"}}, '{"x": 1, "y": 2}', '{"x": "1"}'),
        ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}, '{"a": 1}', '{"b": 1}'),
        (
            {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                       {"type": "object", "properties": {"b": {"type": "string"}}, "required": ["b"]}]},
            '{"a": 1, "b": "x"}',
            '{"a": 1}',
        ),
        ({"oneOf": [{"type": "integer"}, {"type": "null"}]}, "null", '"1"'),
        ({"type": ["string", "null"]}, '"x"', "1"),
    ],
)  # fmt: skip
def test_keywords_are_enforced(schema: dict[str, Any], good: str, bad: str) -> None:
    gbnf = schema_grammar(schema)
    _parses_in_llama_cpp(gbnf)
    assert _accepts(schema, good) and not _accepts(schema, bad)
    validate(json.loads(good), schema)


def test_the_formats_the_grammar_enforces_are_checked_by_the_tests_validator() -> None:
    """The replies of the model tests are validated with formats checked (``validate``): each format the
    grammar promises has a checker here (some come from the test extra's rfc3339-validator, fqdn, isoduration),
    and it refuses a wrong value."""
    wrong = {
        "date-time": "2024-02-30T00:00:00Z", "date": "2023-02-29", "time": "25:00:00Z", "duration": "P1X",
        "email": "nobody", "hostname": "-bad-.com", "ipv4": "256.0.0.1", "ipv6": "1::2::3", "uuid": "123e4567",
        "idn-email": "nobody", "idn-hostname": "-bad-", "regex": "(",
    }  # fmt: skip
    # The rest (uri, json-pointer, color, ...) are checked only where their libraries are installed; the grammar
    # writes a subset each accepts all the same (tests/test_schema_keywords.py samples them).
    assert set(wrong) <= {*FORMATS, "uuid"}
    for fmt, value in wrong.items():
        assert fmt in FORMAT_CHECKER.checkers, f"no checker for {fmt}: is the test extra installed?"
        with pytest.raises(jsonschema.ValidationError):
            validate(value, {"type": "string", "format": fmt})


@pytest.mark.parametrize("fmt", ["date", "date-time"])
def test_dates_are_exact_calendar_dates(fmt: str) -> None:
    """llama.cpp's rule let 2023-02-30 through; each month has its own days, February 29th leap years only."""
    schema = {"type": "string", "format": fmt}
    pattern = to_regex(schema_grammar(schema))
    suffix = "T12:00:00Z" if fmt == "date-time" else ""
    for year in (1, 4, 100, 400, 1900, 1999, 2000, 2023, 2024, 2100, 9999):
        for month in range(0, 14):
            for day in range(0, 33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                try:
                    real = datetime.date.fromisoformat(text) is not None
                except ValueError:
                    real = False
                assert bool(pattern.fullmatch(json.dumps(text + suffix))) == real, text
    assert not pattern.fullmatch(json.dumps("0000-01-01" + suffix)), "year 0 is no date"


def test_refs_resolve_in_their_own_document_wherever_the_schema_is_placed() -> None:
    params = {
        "$defs": {
            "p": {"type": "object", "properties": {"x": {"type": "integer", "minimum": 1}}, "required": ["x"]}
        },
        "type": "object",
        "properties": {"p": {"$ref": "#/$defs/p"}},
        "required": ["p"],
    }
    tools = [ToolSpec("a", "", params), ToolSpec("b", "", {"type": "object", "properties": {}})]
    gbnf = grammar.hermes_calls_grammar(tools, parallel=True)
    _parses_in_llama_cpp(gbnf)
    call = '<tool_call>\n{"name": "a", "arguments": {"p": {"x": 3}}}\n</tool_call>'
    pattern = to_regex(gbnf, "call")
    assert pattern.fullmatch(call) and not pattern.fullmatch(call.replace("3", "0"))
    _parses_in_llama_cpp(grammar.qwen3_coder_calls_grammar(tools, parallel=False))
    _parses_in_llama_cpp(grammar.json_grammar(params))


def test_recursive_schemas_become_recursive_rules() -> None:
    tree = {
        "$defs": {
            "node": {
                "type": "object",
                "properties": {
                    "v": {"type": "integer"},
                    "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}},
                },
                "required": ["v"],
            }
        },
        "$ref": "#/$defs/node",
    }
    gbnf = schema_grammar(tree)
    _parses_in_llama_cpp(gbnf)
    assert "ref-defs-node ::=" in gbnf and "ref-defs-node" in gbnf.split("ref-defs-node ::=")[1]


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        ({"$ref": "https://example.com/schema.json"}, "$ref", "#"),
        ({"type": "string", "pattern": "^(?=a)b$"}, "pattern", "#"),
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2}, "uniqueItems", "#"),
        ({"type": "string", "not": {"pattern": "^a"}}, "not", "#/not"),
        ({"type": "integer", "multipleOf": 3, "minimum": 0}, "multipleOf", "#"),
        ({"type": "object", "properties": {}, "required": ["x"], "additionalProperties": False}, "required", "#"),
        ({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a{1,1999}$"}}, "patternProperties": {
            f"^p{i}$": {"type": "string", "maxLength": 2000} for i in range(60)}, "additionalProperties": False},
         "maxLength", "#/patternProperties/^p48$"),
    ],
)  # fmt: skip
def test_what_cannot_be_enforced_is_refused_by_keyword_and_path(
    schema: dict[str, Any], keyword: str, path: str
) -> None:
    with pytest.raises(SchemaRefused) as info:
        schema_grammar(schema)
    assert (info.value.keyword, info.value.path) == (keyword, path)
    assert keyword in str(info.value) and path in str(info.value)


def test_hostile_sizes_are_refused_before_anything_big_is_built() -> None:
    """Issue 27 item 1: 300k bounded-integer properties, 200 levels of nesting, many small repetitions."""
    many = {
        "type": "object",
        "properties": {f"p{i}": {"type": "integer", "minimum": 0, "maximum": 9} for i in range(6000)},
    }
    with pytest.raises(SchemaRefused, match="rules"):
        schema_grammar(many)
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    with pytest.raises(SchemaRefused, match="nest"):
        schema_grammar(deep)
    wide = {
        "type": "object",
        "properties": {f"p{i}": {"type": "string", "maxLength": 2000} for i in range(60)},
    }
    with pytest.raises(SchemaRefused, match="grammar elements"):
        schema_grammar(wide)


def _nested_min_items(levels: int, count: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": count}
    for _ in range(levels):
        schema = {"type": "array", "minItems": count, "items": schema}
    return {"type": "object", "properties": {"a": schema}, "required": ["a"]}


@pytest.mark.parametrize(("levels", "count"), [(5, 30), (4, 1000)])
def test_a_forced_call_too_long_to_fit_is_measured_not_written(levels: int, count: int) -> None:
    """Issue 27 item 1: the 402-byte tools schema (5 levels of minItems 30, tool_choice required) built a 50 MB
    string in 3.2 s; minItems 1000 at 4 levels never finished. Now the shortest call's length is computed and
    the call refused by it; the grammar itself stays small (repetitions are counted, not written out)."""
    params = _nested_min_items(levels, count)
    assert len(json.dumps({"type": "function", "function": {"name": "f", "parameters": params}})) < 500
    request = GenerationRequest(prompt="x", tools=(ToolSpec("f", "", params),), tool_choice="required")
    with pytest.raises(RequestRefused, match="at least"):
        toolcalls.shortest_call(toolcalls.forced_tools(request), "hermes")
    if levels == 5:
        assert len(grammar.hermes_calls_grammar(request.tools, parallel=False)) < 2000


def test_the_shortest_call_follows_refs_and_bounds() -> None:
    params = {
        "$defs": {"r": {"type": "object", "properties": {"n": {"type": "integer", "minimum": 5}}, "required": ["n"]}},
        "type": "object",
        "properties": {"r": {"$ref": "#/$defs/r"}, "tags": {"type": "array", "minItems": 2, "items": {"enum": ["ab", "c"]}}},
        "required": ["r", "tags"],
    }  # fmt: skip
    text = toolcalls.shortest_call([ToolSpec("t", "", params)], "hermes")
    body = json.loads(text.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>"))
    assert body["arguments"] == {"r": {"n": 5}, "tags": ["c", "c"]}
    validate(body["arguments"], params)


def test_llama_server_gets_the_embedded_engines_grammar() -> None:
    """One converter decides for both engines: llama-server's own converter resolved ``#name`` references,
    bounds past 2,000 and percent-encoded pointers otherwise, and passed over keywords it does not read."""
    bounded = {"type": "object", "properties": {"t": {"type": "number", "exclusiveMinimum": 0, "maximum": 2}}}
    assert agent_payload(GenerationRequest(prompt="x", json_schema=bounded))["grammar"] == schema_grammar(
        bounded
    )
    wide = {"type": "object", "properties": {"port": {"type": "integer", "minimum": 1024, "maximum": 65535}}}
    huge = {"type": "string", "maxLength": 10**6}
    for plain in (
        bounded,
        wide,
        huge,
        {"$ref": "#/$defs/x", "$defs": {"x": {"type": "integer", "minimum": 1}}},
    ):
        assert schema_fields(plain) == {"grammar": schema_grammar(plain)}


def test_ignored_annotations_change_nothing() -> None:
    plain = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    annotated = {
        "title": "T", "description": "d", "examples": [{"a": 1}], "default": {"a": 0},
        "type": "object", "properties": {"a": {"type": "integer", "title": "A", "description": "x", "default": 3}},
        "required": ["a"],
    }  # fmt: skip
    assert schema_grammar(plain) == schema_grammar(annotated)
    assert re.search(r"root ::= ", schema_grammar(plain))


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_real_schema_shapes_are_enforced(name: str) -> None:
    """pydantic v2 models and coding agents' tool definitions: the grammar builds, llama.cpp parses it, it
    accepts every valid instance and refuses every invalid one (jsonschema agrees on each)."""
    schema, good, bad = CORPUS[name]
    gbnf = schema_grammar(schema)
    _parses_in_llama_cpp(gbnf)
    _parses_in_llama_cpp(grammar.hermes_calls_grammar([ToolSpec(name, "", schema)], parallel=True))
    for instance in good:
        validate(instance, schema)
    for instance in bad:
        assert not jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER).is_valid(instance)
    if name == "tree":
        return  # recursive: no regex; the model tests check its replies
    pattern = to_regex(gbnf)
    for instance in good:
        for text in (json.dumps(instance), json.dumps(instance, indent=1)):
            assert pattern.fullmatch(text), text
    for instance in bad:
        assert not pattern.fullmatch(json.dumps(instance)), instance


def test_a_reply_schema_on_llama_server_takes_the_route_that_enforces_it() -> None:
    """llama-server's chat route writes the generation prompt into a schema's grammar (every ChatML model got
    "Failed to initialize samplers"); the reply schema goes to /completion with the rendered prompt."""
    from clover_local.engine.templates import TemplateChoice
    from clover_local.engine.types import ChatMessage
    from clover_local.llamacpp.server_tools import clover_enforces, completion_payload

    request = GenerationRequest(messages=(ChatMessage("user", "hi"),), json_schema={"type": "object"})
    assert clover_enforces(TemplateChoice("jinja", "gguf", "{{ messages }}"), request)
    assert completion_payload(request, "p", None, ())["grammar"] == schema_grammar({"type": "object"})


_UNENFORCEABLE_VALUES: dict[str, Any] = {
    "contains": {"type": "integer"}, "unevaluatedProperties": False, "unevaluatedItems": False,
    "$dynamicRef": "#meta", "$recursiveRef": "#",
}  # fmt: skip


@pytest.mark.parametrize("keyword", sorted(UNENFORCEABLE))
def test_a_keyword_no_grammar_enforces_is_refused_alike_for_both_engines(keyword: str) -> None:
    """llama-server's converter (``common/json-schema.cpp``) passes over these keywords in silence, as a grammar
    must: the embedded engine's converter and the check before llama-server refuse each with the same keyword
    and path, wherever it is (here inside a referenced definition, under a property)."""
    schema = {
        "$defs": {
            "x": {"type": "array", "items": {"type": "integer"}, keyword: _UNENFORCEABLE_VALUES[keyword]}
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/x"}},
        "required": ["a"],
    }
    jsonschema.Draft202012Validator.check_schema(schema)
    refusals = []
    for check in (schema_grammar, schema_fields):
        with pytest.raises(SchemaRefused) as info:
            check(schema)
        refusals.append((info.value.keyword, info.value.path))
    assert refusals == [(keyword, "#/$defs/x")] * 2


def test_a_remote_reference_is_refused_alike_for_both_engines() -> None:
    schema = {"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}}
    for check in (schema_grammar, schema_fields):
        with pytest.raises(SchemaRefused, match="never fetched") as info:
            check(schema)
        assert (info.value.keyword, info.value.path) == ("$ref", "#/properties/a")


def test_keyword_names_that_are_not_schema_keywords_are_not_refused() -> None:
    """A property named ``not`` or ``contains`` (a search tool's parameter), a no-op ``uniqueItems: false``, and
    an unused definition are no constraint to refuse."""
    schema = {
        "$defs": {"unused": {"not": {}}},
        "type": "object",
        "properties": {"contains": {"type": "string"}, "not": {"type": "array", "uniqueItems": False}},
    }
    assert schema_fields(schema) == {"grammar": schema_grammar(schema)}
    _parses_in_llama_cpp(schema_grammar(schema))


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "format": "date"},
        {"type": "object", "properties": {"d": {"type": "string", "format": "date-time"}}},
        {"type": "string", "allOf": [{"pattern": "^a+$"}]},
        {"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}},
        {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2},
        {"type": "object", "properties": {"any": True}},
        {"type": "string", "pattern": "abc"},
        {"type": "string", "pattern": "^[^,]+$"},
        {"type": "integer", "minimum": 0, "exclusiveMinimum": 5},
    ],
)  # fmt: skip
def test_what_llama_servers_converter_passes_over_is_enforced_on_both_engines(schema: dict[str, Any]) -> None:
    """Read from the pinned ``common/json-schema.cpp``: its ``date`` allows February 30th; ``allOf`` on a string
    becomes an empty object; ``items`` wins over ``prefixItems``; a tuple's counts are not read; an unanchored
    pattern is any string, and ``[^,]`` writes a raw ``"``. llama-server is sent clover-local's grammar."""
    assert schema_fields(schema) == {"grammar": schema_grammar(schema)}
    _parses_in_llama_cpp(schema_grammar(schema))


def test_a_required_name_missing_from_properties_takes_any_value_unless_forbidden() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"]}
    typed = {**schema, "additionalProperties": {"type": "integer"}}
    assert _accepts(typed, '{"a": 1, "b": 2}') and not _accepts(typed, '{"a": 1}')
    assert not _accepts(typed, '{"a": 1, "b": "2"}')
    for check in (schema_grammar, schema_fields):
        with pytest.raises(SchemaRefused, match="'b'"):
            check({**schema, "additionalProperties": False})


def test_a_tuple_shorter_than_its_max_items_allows_is_refused() -> None:
    with pytest.raises(SchemaRefused) as info:
        schema_grammar({"type": "array", "prefixItems": [{"type": "integer"}] * 3, "maxItems": 2})
    assert info.value.keyword == "maxItems"


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "integer", "exclusiveMinimum": 0}, 1),
        ({"type": "integer", "exclusiveMaximum": 0}, -1),
        ({"type": "integer", "minimum": 0, "exclusiveMinimum": 0}, 1),
        ({"type": "integer", "minimum": 4, "maximum": 20, "multipleOf": 3}, 6),
        ({"type": "number", "exclusiveMinimum": 0, "maximum": 2}, 1),
        ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}, 0.1),
        ({"type": "number", "exclusiveMinimum": -1, "exclusiveMaximum": 0}, -0.1),
        ({"type": "number", "minimum": -2.5, "maximum": 7}, 0),
    ],
)  # fmt: skip
def test_the_shortest_number_is_inside_exclusive_bounds(schema: dict[str, Any], value: float) -> None:
    """``exclusiveMinimum: 0`` excludes 0: the shortest value (and so the length a forced call is measured
    by) is the one the grammar would write, and the grammar accepts it."""
    length, found = shortest_json(schema, 100)
    assert found == value and length == len(json.dumps(value))
    validate(found, schema)
    assert _accepts(schema, json.dumps(found))


def test_a_pattern_makes_the_shortest_string_as_long_as_its_shortest_match() -> None:
    """``^a{1000000000}$`` is enforced in the grammar (nested repetitions), so the shortest call that obeys it
    is a billion characters: a forced call of it is refused up front, not written until max_tokens cuts it (the
    hostile-input probe's six 200s). A pattern shorter than minLength leaves minLength in charge."""
    assert shortest_json({"type": "string", "pattern": "^a{1000000000}$"}, 4096)[0] == 2 + 10**9
    assert shortest_json({"type": "string", "pattern": "^[0-9]{3}-[0-9]{4}$"}, 100) == (10.0, "x" * 8)
    assert shortest_json({"type": "string", "pattern": "^a+$", "minLength": 5}, 100)[0] == 7
    from clover_local.engine.toolcalls import SHORTEST_CALL_LIMIT, shortest_call

    long = {"type": "string", "pattern": f"^a{{{SHORTEST_CALL_LIMIT}}}$"}
    tool = ToolSpec("f", "", {"type": "object", "properties": {"t": long}, "required": ["t"]})
    with pytest.raises(RequestRefused, match="at least"):
        shortest_call((tool,), "hermes")
    fits = ToolSpec(
        "f", "", {"type": "object", "properties": {"t": {**long, "pattern": "^a{10}$"}}, "required": ["t"]}
    )
    assert len(shortest_call((fits,), "hermes")) > 10


def test_the_shortest_value_of_a_type_list_is_measured_per_type() -> None:
    """Each type of a list is measured on a dict made for it; a memo keyed by the id of a freed one gave the next
    type its length (12 for ``null`` below, not 4)."""
    assert shortest_json({"type": ["string", "null"], "minLength": 10}, 100)[0] == 4
    assert shortest_json({"type": ["null", "string"], "minLength": 10}, 100)[0] == 4
    params = {
        "type": "object",
        "properties": {"a": {"type": ["string", "null"], "minLength": 10}, "b": {"type": ["array", "integer"], "minItems": 9}},
        "required": ["a", "b"],
    }  # fmt: skip
    length, value = shortest_json(params, 100)
    assert value == {"a": None, "b": 0} and length == len(json.dumps(value, separators=(",", ":")))


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        (CORPUS["person"][0]["properties"]["email"], '"a@b.co"', '"ab"'),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
             "anyOf": [{"required": ["a"]}, {"required": ["b"]}]},
            '{"b": 1}',
            "{}",
        ),
        ({"type": "string", "anyOf": [{"type": "null"}, {"maxLength": 2}]}, '"ab"', "null"),
        ({"oneOf": [{"type": "integer"}, {"type": "string"}], "minimum": 3}, "3", "2"),
    ],
)  # fmt: skip
def test_constraints_beside_alternatives_hold_for_each_alternative(
    schema: dict[str, Any], good: str, bad: str
) -> None:
    """pydantic writes ``str | None`` with a format as ``{"anyOf": [...], "format": "email"}``: the format
    beside the alternatives holds for them, as JSON Schema says (both converters read only the alternatives).
    llama-server gets clover-local's grammar for it."""
    assert _accepts(schema, good) and not _accepts(schema, bad)
    validate(json.loads(good), schema)
    assert not jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER).is_valid(
        json.loads(bad)
    )
    assert "grammar" in schema_fields(schema)


def test_constraints_beside_a_ref_alternative_hold_for_it() -> None:
    schema = {
        "$defs": {"x": {"type": "string"}},
        "anyOf": [{"$ref": "#/$defs/x"}, {"type": "null"}],
        "maxLength": 3,
    }
    assert _accepts(schema, '"abc"') and _accepts(schema, "null") and not _accepts(schema, '"abcd"')


def test_the_llama_server_engine_refuses_before_a_stream_starts() -> None:
    """``serve`` calls ``check_request`` before it answers: on the llama-server engine it refuses what the
    schema sent would refuse, with no round trip to llama-server (nothing listens at this address)."""
    from clover_local.engine.templates import TemplateChoice
    from clover_local.engine.types import ChatMessage
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.llamacpp.server import LlamaServerProcess
    from clover_local.llamacpp.server_engine import LlamaServerEngine

    process = LlamaServerProcess(
        ServerBinary(Path("llama-server"), "test"),
        [],
        host="127.0.0.1",
        port=9,
        api_key=None,
        warnings=(),
        on_log=None,
    )
    engine = LlamaServerEngine(process, owns_process=False, template=TemplateChoice("builtin", "chatml"))
    schema = {"type": "object", "properties": {"a": {"type": "string", "not": {"pattern": "^x"}}}}
    messages = (ChatMessage("user", "hi"),)
    with pytest.raises(SchemaRefused, match="'not' at #/properties/a/not"):
        engine.check_request(GenerationRequest(messages=messages, json_schema=schema))
    tools = (ToolSpec("t", "", {"type": "object", "properties": {"a": {"type": "array", "contains": {}}}}),)
    with pytest.raises(SchemaRefused, match="'contains' at #/properties/a"):
        engine.check_request(GenerationRequest(messages=messages, tools=tools, tool_choice="required"))
    engine.check_request(GenerationRequest(messages=messages, json_schema={"type": "object"}))


def test_bounds_past_2000_hold_in_llama_cpp_s_own_grammar_engine(smollm2_path: Path) -> None:
    """llama.cpp parses a repetition maximum above 2000 (``MAX_REPETITION_THRESHOLD``) as no maximum: a plain
    ``{0,2001}`` lets a 2002nd character through, which is how ``maxLength: 2001`` let 2,617 characters
    through on the llama-server route. The nested repetitions the converter writes hold the bound in the same
    grammar engine llama-server runs; a minimum past 2000 parses too."""
    import llama_cpp
    from llama_cpp import llama_cpp as C

    from clover_local.engine.sampling import GrammarGate

    llm = llama_cpp.Llama(model_path=str(smollm2_path), vocab_only=True, verbose=False)
    vocab = C.llama_model_get_vocab(llm.model)
    (quote,), (a,) = llm.tokenize(b'"', add_bos=False), llm.tokenize(b"a", add_bos=False)

    def longest(gbnf: str) -> int:
        gate = GrammarGate(vocab, llm.n_vocab(), gbnf)
        gate.accept(quote)
        count = 0
        while count < 2100 and gate.allows(a):
            gate.accept(a)
            count += 1
        assert gate.allows(quote)
        gate.close()
        return count

    assert longest('root ::= "\\"" [a]{0,2001} "\\""') == 2100, "llama.cpp's parser drops a maximum past 2000"
    assert longest(schema_grammar({"type": "string", "maxLength": 2001})) == 2001
    GrammarGate(vocab, llm.n_vocab(), schema_grammar({"type": "string", "minLength": 4000})).close()
    with pytest.raises(RequestRefused, match="could not parse the grammar"):
        GrammarGate(vocab, llm.n_vocab(), 'root ::= "a"{4000}')
