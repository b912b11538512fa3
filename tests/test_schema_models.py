"""The corpus of real schema shapes (``tests/schema_corpus.py``: pydantic v2 models, coding agents' tools)
forced on both engines with SmolLM2 135M Instruct through the openai client: as ``response_format`` and as a
forced tool call, the reply parses and validates against its schema with jsonschema, formats checked. And the
issue's cases: a one-sided integer bound, a ``$ref`` in a forced call, and a number with ``exclusiveMinimum: 0, maximum: 2``
on llama-server (which its own converter left unchecked). One request per case, short replies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from clover_local.testing.models import TinySpec, tiny_model_from_spec
from tests.real_schemas import validator
from tests.schema_corpus import CORPUS, validate
from tests.test_agents_generic import ENGINES, KEY, _served

pytestmark = pytest.mark.slow

ASK = "Fill in an example. Keep every string short."


@pytest.fixture(scope="module", params=ENGINES)
def url(request: pytest.FixtureRequest, smollm2_path: Path) -> Iterator[str]:
    with _served(request.param, smollm2_path) as (_engine, base):
        yield base


def _oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=600)


def _reply_json(url: str, schema: dict[str, Any]) -> Any:
    reply = _oa(url).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": ASK}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": schema, "strict": True},
        },
        max_tokens=600,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop", reply.choices[0].message.content
    return json.loads(reply.choices[0].message.content or "")


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_each_corpus_schema_is_enforced_as_response_format(url: str, name: str) -> None:
    schema = CORPUS[name][0]
    validate(_reply_json(url, schema), schema)


@pytest.mark.parametrize("name", ["edit", "read_file", "order"])
def test_each_tool_shape_is_enforced_as_a_forced_call(url: str, name: str) -> None:
    schema = CORPUS[name][0]
    tool = {"type": "function", "function": {"name": name, "description": "Do it", "parameters": schema}}
    reply = _oa(url).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": ASK}],
        tools=[tool],
        tool_choice="required",
        max_tokens=600,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert calls and calls[0].function.name == name  # type: ignore[union-attr]
    validate(json.loads(calls[0].function.arguments), schema)  # type: ignore[union-attr]


def test_the_issues_number_bound_is_enforced(url: str) -> None:
    schema = {
        "type": "object",
        "properties": {"t": {"type": "number", "exclusiveMinimum": 0, "maximum": 2}},
        "required": ["t"],
        "additionalProperties": False,
    }
    validate(_reply_json(url, schema), schema)


@pytest.fixture(scope="module", params=ENGINES)
def tiny_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """A tiny random model (it writes whatever the grammar lets through: a hard test of the grammar)."""
    with _served(request.param, tiny_model_from_spec(TinySpec(kind="llama"))) as (_engine, base):
        yield base


@pytest.mark.parametrize("name", ["person", "port", "read_file", "glob", "tree"])
def test_a_random_model_under_each_grammar_writes_valid_json(tiny_url: str, name: str) -> None:
    schema = CORPUS[name][0]
    reply = _oa(tiny_url).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": ASK}],
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        max_tokens=1500,
        temperature=1.0,
        seed=7,
    )
    if reply.choices[0].finish_reason == "stop":
        validate(json.loads(reply.choices[0].message.content or ""), schema)
    else:  # cut off by max_tokens: what was written is still a prefix the grammar allowed
        assert (reply.choices[0].message.content or "").lstrip().startswith("{")


def test_a_schema_over_the_limits_is_a_400_before_a_stream_starts(tiny_url: str) -> None:
    """The grammar is built (and refused) before the stream starts, on both engines alike (llama-server is sent
    clover-local's grammar): sixty strings of up to 2,000 characters add up to more grammar than allowed."""
    schema = {
        "type": "object",
        "properties": {f"s{i}": {"type": "string", "maxLength": 2000} for i in range(60)},
    }
    with pytest.raises(openai.BadRequestError, match="maxLength") as info:
        stream = _oa(tiny_url).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "x"}],
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            max_tokens=8,
            stream=True,
        )
        list(stream)
    assert "#/properties/s" in str(info.value)


def test_a_bound_past_2000_holds_on_both_engines(tiny_url: str) -> None:
    """Issue 41: on the llama-server route ``maxLength: 2001`` let 2,617 characters through (llama.cpp's parser
    reads a maximum past 2,000 as none). A random model writes string characters until the grammar ends the
    string: at 2,001 characters at most, on both engines."""
    schema = {"type": "string", "maxLength": 2001}
    reply = _oa(tiny_url).chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": ASK}],
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
        max_tokens=3000,
        temperature=1.0,
        seed=41,
    )
    text = reply.choices[0].message.content or ""
    if reply.choices[0].finish_reason == "stop":
        validate(json.loads(text), schema)
    else:  # the token budget ran out first: the string written so far is still within the bound
        assert len(json.loads(text + '"')) <= 2001


def test_a_plain_name_reference_is_followed_on_both_engines(url: str) -> None:
    """Issue 41: ``{"$ref": "#num"}`` resolved to the root on the embedded engine (a reply ``{"x": {"x": ...}}``
    came back as HTTP 200)."""
    schema = {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"x": {"$ref": "#num"}},
        "required": ["x"],
        "additionalProperties": False,
        "definitions": {"n": {"$id": "#num", "type": "integer", "minimum": 1, "maximum": 9}},
    }
    value = _reply_json(url, schema)
    validator(schema).validate(value)  # draft-07: "$id": "#num" names the subschema
    assert isinstance(value["x"], int)


@pytest.mark.parametrize("stream", [False, True])
def test_a_keyword_no_grammar_enforces_is_a_400_naming_it_on_both_engines(url: str, stream: bool) -> None:
    """llama-server's converter passes over ``not`` (and the rest of ``schema_gbnf.keywords``): the reply would
    ignore it. Both engines refuse what no grammar here enforces (``not`` of a pattern), by keyword and path,
    before a stream starts."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "not": {"pattern": "^root"}}},
        "required": ["name"],
    }
    with pytest.raises(openai.BadRequestError, match="'not' at #/properties/name/not"):
        reply = _oa(url).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": ASK}],
            response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            max_tokens=8,
            stream=stream,
        )
        if stream:
            list(reply)  # type: ignore[arg-type]


def test_a_forced_call_with_such_a_keyword_is_refused_on_both_engines(url: str) -> None:
    params = {"type": "object", "properties": {"tags": {"type": "array", "contains": {"const": "x"}}}}
    tool = {"type": "function", "function": {"name": "tag", "parameters": params}}
    with pytest.raises(openai.BadRequestError, match="'contains' at #/properties/tags"):
        _oa(url).chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": ASK}],
            tools=[tool],  # type: ignore[list-item]
            tool_choice="required",
            max_tokens=64,
        )
