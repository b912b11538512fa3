"""One policy for request fields on all four routes, over the real HTTP server (a scripted engine: the policy
is the server's, not the model's): a misspelled field gets the same 400 everywhere, a no-op field is accepted
and named back in a header, and a bad value is refused under the route's own name for the field."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from clover_local.serve.api import ApiConfig
from clover_local.serve.request_fields import IGNORED_HEADER
from clover_local.serve.runner import BackgroundServer
from tests.helpers_engine import ScriptedEngine

HI = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"model": "m", "messages": HI, "max_tokens": 4},
    "/v1/completions": {"model": "m", "prompt": "hi", "max_tokens": 4},
    "/v1/responses": {"model": "m", "input": "hi", "max_output_tokens": 4},
    "/v1/messages": {"model": "m", "messages": HI, "max_tokens": 4},
}


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with BackgroundServer(ScriptedEngine(), ApiConfig("m")) as server:
        yield server.url


def _post(url: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, str], Any]:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, json.loads(resp.read() or b"null")
    finally:
        conn.close()


def _message(reply: Any) -> str:
    return str(reply["error"]["message"])


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_a_misspelled_field_gets_the_same_400_on_every_route(url: str, path: str) -> None:
    status, _, reply = _post(url, path, {**ROUTES[path], "temprature": 0})
    assert status == 400 and _message(reply) == "Unrecognized request argument supplied: temprature"


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_llama_cpp_extensions_and_no_op_fields_are_accepted_and_named(url: str, path: str) -> None:
    body = {
        **ROUTES[path],
        "top_k": 40,
        "min_p": 0.05,
        "cache_prompt": True,
        "user": "u1",
        "presence_penalty": 0,
    }
    status, headers, _ = _post(url, path, body)
    assert status == 200
    assert {h.strip() for h in headers[IGNORED_HEADER.lower()].split(",")} == {"user", "presence_penalty"}
    status, headers, _ = _post(url, path, ROUTES[path])
    assert status == 200 and IGNORED_HEADER.lower() not in headers


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_a_no_op_field_with_an_effect_is_refused_by_name(url: str, path: str) -> None:
    status, _, reply = _post(url, path, {**ROUTES[path], "frequency_penalty": 0.5})
    assert status == 400 and "frequency_penalty" in _message(reply)


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("/v1/responses", "max_output_tokens", 0),
        ("/v1/chat/completions", "max_completion_tokens", 0),
        ("/v1/chat/completions", "temperature", "0.5"),
        ("/v1/completions", "top_k", -1),
        ("/v1/messages", "top_p", 1.5),
        ("/v1/responses", "min_p", 2),
        ("/v1/messages", "stop_sequences", 5),
    ],
)
def test_a_bad_value_is_refused_under_the_routes_own_name(
    url: str, path: str, field: str, value: Any
) -> None:
    status, _, reply = _post(url, path, {**ROUTES[path], field: value})
    assert status == 400 and f"'{field}'" in _message(reply), reply
    if path != "/v1/messages":
        assert reply["error"]["param"] == field


@pytest.mark.parametrize(
    "schema",
    [{"type": "object", "properties": {"a": {"enum": "abc"}}}, {"type": "string", "minLength": "3"}],
)
def test_a_schema_that_is_not_json_schema_is_a_named_400(url: str, schema: dict[str, Any]) -> None:
    body = {
        **ROUTES["/v1/chat/completions"],
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
    }
    status, _, reply = _post(url, "/v1/chat/completions", body)
    assert status == 400 and "is not valid JSON Schema" in _message(reply)
    assert reply["error"]["param"].startswith("response_format.json_schema.schema")


def _nested(levels: int, count: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": count}
    for _ in range(levels):
        schema = {"type": "array", "minItems": count, "items": schema}
    return {"type": "object", "properties": {"a": schema}, "required": ["a"]}


def _blow_up_body(path: str, params: dict[str, Any]) -> dict[str, Any]:
    """A forced call to tool ``f`` in each API's own shape."""
    if path == "/v1/responses":
        tool: dict[str, Any] = {"type": "function", "name": "f", "parameters": params}
        return {**ROUTES[path], "tools": [tool], "tool_choice": "required"}
    if path == "/v1/messages":
        return {
            **ROUTES[path],
            "tools": [{"name": "f", "input_schema": params}],
            "tool_choice": {"type": "any"},
        }
    tool = {"type": "function", "function": {"name": "f", "parameters": params}}
    return {**ROUTES[path], "tools": [tool], "tool_choice": "required"}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses", "/v1/messages"])
@pytest.mark.parametrize(("levels", "count"), [(5, 30), (4, 1000)])
def test_issue_27s_schema_blow_up_is_a_named_400_and_the_server_keeps_answering(
    url: str, path: str, levels: int, count: int
) -> None:
    """Issue 27 case 1 on each route that forces a call: chat ``required``, Responses ``required``, Messages
    ``any``."""
    status, _, reply = _post(url, path, _blow_up_body(path, _nested(levels, count)))
    assert status == 400 and "'f'" in _message(reply) and "minItems" in _message(reply), reply
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=5)
    conn.request("GET", "/health")
    assert conn.getresponse().status == 200
    conn.close()


@pytest.mark.parametrize(
    ("path", "field", "body"),
    [
        ("/v1/chat/completions", "parallel_tool_calls", {"parallel_tool_calls": "false"}),
        ("/v1/responses", "parallel_tool_calls", {"parallel_tool_calls": "false"}),
        ("/v1/responses", "parallel_tool_calls", {"parallel_tool_calls": 0}),
        (
            "/v1/messages",
            "tool_choice.disable_parallel_tool_use",
            {"tool_choice": {"type": "auto", "disable_parallel_tool_use": "true"}},
        ),
    ],
)
def test_a_flag_that_is_not_a_boolean_is_refused_on_every_route(
    url: str, path: str, field: str, body: dict[str, Any]
) -> None:
    """One policy: ``"false"`` is not false (``bool("false")`` is true: Responses read it so, and called tools
    in parallel)."""
    status, _, reply = _post(url, path, {**_blow_up_body(path, {"type": "object"}), **body})
    assert status == 400 and f"'{field}' must be true or false" in _message(reply), reply
