"""Agents against ``serve`` on both engines, with the official clients: tool calls (forced, named, parallel,
streamed), structured output that validates, the Responses API, Anthropic's Messages API, and an agent loop
that runs to its end.

Models: a tiny random model whose GGUF holds Qwen3's tool-calling template and whose weights are wired to open
a ``<tool_call>`` where a turn starts, as a tool-calling model does (``TinySpec.tool_caller``; its words mean
nothing: the grammar makes calls well-formed, so the checks are on form), and the real Gemma 3 270M, a *base*
model, for JSON schemas (the grammar makes the JSON valid; the content is only as good as a 270M model).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import jsonschema
import openai
import pytest

from clover_local.engine.loader import load_engine
from clover_local.engine.types import ChatEngine
from clover_local.llamacpp.binary import ServerBinary
from clover_local.llamacpp.server import plan_server_argv, start_llama_server
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.plan.types import SpeculativePlan
from clover_local.presets import load_preset
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer
from clover_local.testing.models import TinySpec, gemma_path, tiny_model_from_spec
from clover_local.testing.settings import engine_settings
from clover_local.testing.vocab import QWEN3_TOOLS_TEMPLATE
from tests.helpers_serve import llama_server_path, raw_post

pytestmark = pytest.mark.slow

KEY = "agent-key"
ENGINES = ("embedded", "llama-server")
SPEC = SpeculativePlan(enabled=True, n_min=1, n_max=8)
WEATHER_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
TIME_PARAMS: dict[str, Any] = {
    "type": "object",
    "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}},
    "required": ["zone"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {"name": "get_weather", "description": "Forecast", "parameters": WEATHER_PARAMS},
    },
    {"type": "function", "function": {"name": "get_time", "description": "Clock", "parameters": TIME_PARAMS}},
]
SCHEMAS = {"get_weather": WEATHER_PARAMS, "get_time": TIME_PARAMS}
TOOL_MODEL = TinySpec(kind="llama", chat_template=QWEN3_TOOLS_TEMPLATE, tool_caller=True)
ASK = [{"role": "user", "content": "What is the weather in Oslo for 3 days?"}]


def _open_engine(kind: str, model: str, *, template: str, argv: list[str]) -> ChatEngine:
    if kind == "embedded":
        return load_engine(
            model,
            engine_settings(model, ctx=2048, n_batch=512, speculative=SPEC),
            chat_template=template,
            speculative=SPEC,
        ).engine
    process = start_llama_server(argv, binary=ServerBinary(llama_server_path(), "test"))
    return LlamaServerEngine(process, model_name="m")


@pytest.fixture(scope="module", params=ENGINES)
def tiny(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(engine kind, base URL) of serve over the tiny tool-template model."""
    path = str(tiny_model_from_spec(TOOL_MODEL))
    argv = ["-m", path, "-c", "2048", "-t", "2", "-np", "1", "--jinja"]
    engine = _open_engine(request.param, path, template="gguf", argv=argv)
    with BackgroundServer(engine, ApiConfig("tiny", api_key=KEY)) as server:
        yield request.param, server.url
    engine.close()


@pytest.fixture(scope="module", params=ENGINES)
def gemma(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    from clover_local.detect import parse_simulate
    from clover_local.plan.planner import make_plan
    from clover_local.plan.types import Wishes

    preset = load_preset("gemma3-270m")
    plan = make_plan(parse_simulate("ram=16G,cpu=2"), preset, None, Wishes(ctx=2048), str(gemma_path()))
    engine = _open_engine(
        request.param, str(gemma_path()), template=preset.chat_template, argv=plan_server_argv(plan)
    )
    with BackgroundServer(engine, ApiConfig("gemma", api_key=KEY)) as server:
        yield request.param, server.url
    engine.close()


def _oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def _check_call(name: str, arguments: str | dict[str, Any]) -> dict[str, Any]:
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])
    return args


# --- structured output ------------------------------------------------------------------------------------------

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def test_json_schema_reply_on_gemma_validates(gemma: tuple[str, str]) -> None:
    _kind, url = gemma
    reply = _oa(url).chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": "Ana is 31 and lives in Lima. Give her as JSON."}],
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "person", "schema": PERSON, "strict": True},
        },
        max_tokens=200,
        temperature=0,
    )
    content = reply.choices[0].message.content or ""
    jsonschema.validate(json.loads(content), PERSON)
    assert reply.choices[0].finish_reason == "stop"


def test_json_object_reply_parses(gemma: tuple[str, str]) -> None:
    _kind, url = gemma
    reply = _oa(url).chat.completions.create(
        model="gemma",
        messages=[{"role": "user", "content": 'Reply with a JSON object like {"colour": "red"}.'}],
        response_format={"type": "json_object"},
        max_tokens=60,
        temperature=0,
    )
    if reply.choices[0].finish_reason == "stop":  # a base model may fill a string until max_tokens
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    else:
        assert (reply.choices[0].message.content or "").lstrip().startswith("{")


# --- tool calls -------------------------------------------------------------------------------------------------


def test_required_tool_call_is_well_formed(tiny: tuple[str, str]) -> None:
    _kind, url = tiny
    reply = _oa(url).chat.completions.create(
        model="tiny", messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=300, temperature=0
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    assert calls[0].type == "function" and calls[0].id
    _check_call(calls[0].function.name, calls[0].function.arguments)


def test_named_function_is_the_one_called_on_both_engines(tiny: tuple[str, str]) -> None:
    _kind, url = tiny
    reply = _oa(url).chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=200,
        temperature=0,
    )
    (call,) = reply.choices[0].message.tool_calls or []
    assert call.function.name == "get_time"
    _check_call("get_time", call.function.arguments)


def test_parallel_calls_each_well_formed_with_their_own_ids(tiny: tuple[str, str]) -> None:
    _kind, url = tiny
    reply = _oa(url).chat.completions.create(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=True,
        max_tokens=300,
        temperature=0,
    )
    calls = reply.choices[0].message.tool_calls or []
    assert calls
    for call in calls:
        _check_call(call.function.name, call.function.arguments)
    assert len({c.id for c in calls}) == len(calls)


def test_streamed_tool_call_matches_the_unstreamed_one(tiny: tuple[str, str]) -> None:
    _kind, url = tiny
    client = _oa(url)
    # Both from a fresh prompt (cache_prompt false): the same computation, so the same call on any CPU (a cached
    # prefix would evaluate the rest of the prompt in other batches, and a near-tie can flip).
    kwargs: dict[str, Any] = dict(
        model="tiny",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=300,
        temperature=0,
        extra_body={"cache_prompt": False},
    )
    whole = client.chat.completions.create(**kwargs).choices[0].message.tool_calls or []
    names: dict[int, str] = {}
    args: dict[int, str] = {}
    finish = None
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        if not chunk.choices:
            continue
        for piece in chunk.choices[0].delta.tool_calls or []:
            if piece.function and piece.function.name:
                names[piece.index] = piece.function.name
            if piece.function and piece.function.arguments:
                args[piece.index] = args.get(piece.index, "") + piece.function.arguments
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert [names[i] for i in sorted(names)] == [c.function.name for c in whole]
    assert [json.loads(args[i]) for i in sorted(args)] == [json.loads(c.function.arguments) for c in whole]


def test_both_engines_agree_on_a_forced_call() -> None:
    """The same request on the same model through both engines: the same function, arguments that validate."""
    path = str(tiny_model_from_spec(TOOL_MODEL))
    results = []
    for kind in ENGINES:
        engine = _open_engine(
            kind, path, template="gguf", argv=["-m", path, "-c", "2048", "-t", "2", "-np", "1", "--jinja"]
        )
        try:
            with BackgroundServer(engine, ApiConfig("tiny", api_key=KEY)) as server:
                reply = _oa(server.url).chat.completions.create(
                    model="tiny",
                    messages=ASK,
                    tools=TOOLS[:1],
                    tool_choice="required",
                    max_tokens=300,
                    temperature=0,
                )
        finally:
            engine.close()
        (call,) = reply.choices[0].message.tool_calls or []
        results.append((call.function.name, _check_call(call.function.name, call.function.arguments).keys()))
    assert results[0] == results[1] == ("get_weather", {"city", "days"})


def test_agent_loop_runs_to_an_answer(tiny: tuple[str, str]) -> None:
    """ask -> tool call -> run the tool -> result fed back -> a text answer."""
    _kind, url = tiny
    client = _oa(url)
    messages: list[Any] = list(ASK)
    answer = None
    for step in range(4):
        reply = client.chat.completions.create(
            model="tiny",
            messages=messages,
            tools=TOOLS,
            max_tokens=300 if step == 0 else 40,
            temperature=0,
            tool_choice="required" if step == 0 else "none",
        )
        message = reply.choices[0].message
        if not message.tool_calls:
            answer = message.content
            break
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            args = _check_call(call.function.name, call.function.arguments)
            result = {"forecast": "snow", **args}
            messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)})
    assert answer is not None and answer.strip()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool"]


def test_bad_tool_schema_and_malformed_tool_message_get_named_400s(tiny: tuple[str, str]) -> None:
    _kind, url = tiny
    client = _oa(url)
    bad_tool = {
        "type": "function",
        "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": {"type": "strnig"}}}},
    }
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=ASK, tools=[bad_tool])  # type: ignore[list-item]
    assert info.value.body["param"] == "tools[0].function.parameters.properties.x.type"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=[*ASK, {"role": "tool", "tool_call_id": "call_x", "content": "1"}]
        )  # type: ignore[list-item]
    assert info.value.body["code"] == "invalid_tool_message"  # type: ignore[index]
    status, body = raw_post(
        url, "/v1/embeddings", b'{"model": "tiny", "input": "x"}', {"Authorization": f"Bearer {KEY}"}
    )
    assert status == 400 and body["error"]["code"] == "embeddings_not_supported"


# --- Responses API ----------------------------------------------------------------------------------------------


def test_responses_text_tools_and_stream(tiny: tuple[str, str]) -> None:
    _kind, url = tiny
    client = _oa(url)
    text = client.responses.create(model="tiny", input="Say something.", max_output_tokens=16, temperature=0)
    assert text.output_text and text.status in ("completed", "incomplete")
    assert text.usage is not None and text.usage.output_tokens > 0
    flat_tools: Any = [{"type": "function", **t["function"]} for t in TOOLS]
    called = client.responses.create(
        model="tiny",
        input=ASK,
        tools=flat_tools,
        tool_choice="required",
        max_output_tokens=300,
        temperature=0,
    )
    calls = [o for o in called.output if o.type == "function_call"]
    assert calls and all(_check_call(c.name, c.arguments) is not None for c in calls)
    events = list(
        client.responses.create(
            model="tiny",
            input=ASK,
            tools=flat_tools,
            tool_choice="required",
            max_output_tokens=300,
            temperature=0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    final = events[-1].response  # type: ignore[union-attr]
    assert [(o.name, o.arguments) for o in final.output if o.type == "function_call"] == [
        (c.name, c.arguments) for c in calls
    ]
    follow = client.responses.create(
        model="tiny",
        input=[
            *ASK,
            {
                "type": "function_call",
                "call_id": calls[0].call_id,
                "name": calls[0].name,
                "arguments": calls[0].arguments,
            },
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "snow"},
        ],
        tools=flat_tools,
        tool_choice="none",
        max_output_tokens=16,
        temperature=0,
    )
    assert follow.output_text


# --- Anthropic Messages API -------------------------------------------------------------------------------------


def test_anthropic_messages_with_a_tool(tiny: tuple[str, str]) -> None:
    _kind, url = tiny
    client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=300)
    tools: Any = [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]
    reply = client.messages.create(
        model="tiny",
        max_tokens=300,
        messages=ASK,
        tools=tools,
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    )
    uses = [b for b in reply.content if b.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and uses
    for use in uses:
        _check_call(use.name, use.input)  # type: ignore[arg-type]
    with client.messages.stream(
        model="tiny",
        max_tokens=300,
        messages=ASK,
        tools=tools,
        tool_choice={"type": "any"},
        extra_body={"temperature": 0},
    ) as stream:
        final = stream.get_final_message()
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [
        (u.name, u.input) for u in uses
    ]
    answer = client.messages.create(
        model="tiny",
        max_tokens=16,
        tools=tools,
        tool_choice={"type": "none"},
        extra_body={"temperature": 0},
        messages=[
            *ASK,
            {"role": "assistant", "content": reply.content},  # type: ignore[list-item]
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "snow"}],
            },
        ],
    )
    assert answer.content and answer.content[0].type == "text"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(
            model="tiny",
            max_tokens=5,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AA=="},
                        }
                    ],
                }
            ],
        )
