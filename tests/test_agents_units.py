"""Agent plumbing without a model: tool-call formats parsed and streamed, agent fields checked with named 400s,
Responses and Anthropic bodies turned into the same generation requests, grammars built from schemas."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from clover_local.engine import grammar, toolcalls
from clover_local.engine.schema_gbnf import schema_grammar
from clover_local.engine.templates import render_jinja
from clover_local.engine.types import (
    ChatMessage,
    Finished,
    GenerationStats,
    TextDelta,
    ToolCall,
    ToolCallMade,
    ToolSpec,
)
from clover_local.serve import anthropic_api, responses_api
from clover_local.serve import openai_schema as oa
from clover_local.serve.openai_schema import ApiError
from clover_local.testing.vocab import QWEN3_TOOLS_TEMPLATE

MODELS = ("m",)
WEATHER = ToolSpec(
    "get_weather",
    "Weather in a city",
    {
        "type": "object",
        "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["city"],
    },
)
TOOL_JSON = {"type": "function", "function": {"name": WEATHER.name, "parameters": WEATHER.parameters}}


def test_hermes_reply_is_split_into_text_and_calls() -> None:
    text = (
        'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
    )
    text += '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n</tool_call>'
    content, calls = toolcalls.CallSplitter("hermes", [WEATHER]).push(text)
    assert content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"}),
        ("get_weather", {"city": "Rome", "days": 2}),
    ]
    assert len({c.id for c in calls}) == 2


def test_qwen3_coder_xml_values_follow_the_schema_types() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
    text += "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
    (call,) = toolcalls.parse_calls(text, "qwen3_coder", [WEATHER])
    assert json.loads(call.arguments) == {"city": "New York", "days": 3}


def test_text_that_only_looks_like_a_call_stays_text() -> None:
    assert toolcalls.parse_calls("<tool_call> not json", "hermes", [WEATHER]) == ()


@pytest.mark.parametrize("cut", [1, 3, 7, 12])
def test_streamed_calls_are_held_back_and_handed_out_whole(cut: int) -> None:
    text = 'Sure<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    pieces = [text[i : i + cut] for i in range(0, len(text), cut)]
    stats = GenerationStats(1, 1, 0, 0.0, 0.0, 0.0, None)
    events = list(
        toolcalls.split_events(iter([*(TextDelta(p) for p in pieces), Finished(stats)]), "hermes", [WEATHER])
    )
    shown = "".join(e.text for e in events if isinstance(e, TextDelta))
    calls = [e for e in events if isinstance(e, ToolCallMade)]
    assert shown == "Sure"
    assert [json.loads(c.call.arguments) for c in calls] == [{"city": "Oslo"}]
    assert isinstance(events[-1], Finished) and events[-1].stats.finish_reason == "tool_calls"


def test_format_comes_from_the_template() -> None:
    assert toolcalls.detect_format(QWEN3_TOOLS_TEMPLATE) == "hermes"
    xml = "{{ '<tool_call>\\n<function=' }}{{ '<parameter=' }}{% for t in tools %}{% endfor %}"
    assert toolcalls.detect_format(xml) == "qwen3_coder"


def test_the_template_sees_tools_calls_and_results() -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    messages = [
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "sunny", tool_call_id="call_1"),
    ]
    out = render_jinja(QWEN3_TOOLS_TEMPLATE, messages, bos_token="", eos_token="", tools=[WEATHER])
    assert '"name": "get_weather"' in out and "<tools>" in out
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in out
    assert "<tool_response>\nsunny\n</tool_response>" in out
    assert out.endswith("<|im_start|>assistant\n")


def test_a_template_without_tools_gets_them_written_in() -> None:
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    msgs = toolcalls.fallback_messages(
        [
            ChatMessage("user", "hi"),
            ChatMessage("assistant", "", tool_calls=(call,)),
            ChatMessage("tool", "ok", tool_call_id="call_1"),
        ],
        [WEATHER],
        "auto",
    )
    assert msgs[0].role == "system" and "get_weather" in msgs[0].content
    assert "<tool_call>" in msgs[2].content
    assert msgs[3].role == "user" and msgs[3].content.startswith(
        "<tool_response>\nok\n</tool_response>\nAnswer"
    )


def test_results_of_one_turns_calls_are_given_back_in_one_user_turn() -> None:
    calls = (
        ToolCall("c1", "get_weather", '{"city": "Paris"}'),
        ToolCall("c2", "get_weather", '{"city": "Oslo"}'),
    )
    msgs = toolcalls.fallback_messages(
        [
            ChatMessage("user", "hi"),
            ChatMessage("assistant", "", tool_calls=calls),
            ChatMessage("tool", "sun", tool_call_id="c1"),
            ChatMessage("tool", "snow", tool_call_id="c2"),
        ],
        [WEATHER],
        "none",
    )
    assert [m.role for m in msgs] == ["user", "assistant", "user"], "no tools note with tool_choice none"
    assert msgs[2].content == (
        "<tool_response>\nsun\n</tool_response>\n<tool_response>\nsnow\n</tool_response>\n"
        "Answer the user's question with these results."
    )


def test_grammars_are_built_for_schemas_and_calls() -> None:
    assert "root ::=" in grammar.json_grammar({"type": "object", "properties": {"a": {"type": "integer"}}})
    hermes = grammar.hermes_calls_grammar([WEATHER], parallel=True)
    assert hermes.startswith('root ::= call ("\\n" call)*') and "call-json ::=" in hermes
    xml = grammar.qwen3_coder_calls_grammar([WEATHER], parallel=False)
    assert '"<function=get_weather>\\n"' in xml and '"<parameter=city>\\n"' in xml


def _chat(**extra: object) -> dict[str, object]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}


def test_chat_agent_fields_reach_the_request() -> None:
    body = _chat(
        tools=[TOOL_JSON],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=True,
    )
    req = oa.parse_chat(body, MODELS).request
    assert req.tools == (WEATHER.__class__("get_weather", "", WEATHER.parameters),)
    assert req.tool_choice == "get_weather" and req.parallel_tool_calls
    schema = {"type": "object", "properties": {"x": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert oa.parse_chat(_chat(response_format=fmt), MODELS).request.json_schema == schema
    assert oa.parse_chat(_chat(response_format={"type": "json_object"}), MODELS).request.json_schema == {}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strnig"}}}]},
            "tools[0].function.parameters.type",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [TOOL_JSON], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"response_format": {"type": "xml"}}, "response_format.type"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": 5}}}},
            "response_format.json_schema.schema.type",
        ),
    ],
)
def test_bad_agent_fields_get_named_400s(extra: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as info:
        oa.parse_chat(_chat(**extra), MODELS)
    assert info.value.status == 400 and info.value.param == param


@pytest.mark.parametrize(
    ("messages", "param"),
    [
        ([{"role": "tool", "content": "x"}], "messages[0].tool_call_id"),
        (
            [{"role": "user", "content": "q"}, {"role": "tool", "content": "x", "tool_call_id": "call_9"}],
            "messages[1].tool_call_id",
        ),
        (
            [
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{oops"}}],
                }
            ],
            "messages[0].tool_calls[0].function.arguments",
        ),
        ([{"role": "assistant", "tool_calls": [{"id": "c"}]}], "messages[0].tool_calls[0]"),
    ],
)
def test_malformed_tool_messages_get_named_400s(messages: list[object], param: str) -> None:
    with pytest.raises(ApiError) as info:
        oa.parse_chat({"model": "m", "messages": messages}, MODELS)
    assert info.value.status == 400 and info.value.param == param


def test_responses_input_becomes_chat_messages() -> None:
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city":"Oslo"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "rain"},
        ],
        "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER.parameters}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 20,
    }
    req = responses_api.parse(body, MODELS).request
    assert [m.role for m in req.messages or ()] == ["system", "user", "assistant", "tool"]
    assert req.tool_choice == "get_weather" and req.max_tokens == 20


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
    ],
)
def test_responses_fields_it_cannot_honour_get_named_400s(extra: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as info:
        responses_api.parse({"model": "m", "input": "hi", **extra}, MODELS)
    assert info.value.param == param


def test_anthropic_blocks_become_chat_messages() -> None:
    body = {
        "model": "m",
        "max_tokens": 50,
        "system": "Be brief.",
        "messages": [
            {"role": "user", "content": "Weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Oslo"}}
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "rain"}],
            },
        ],
        "tools": [{"name": "get_weather", "input_schema": WEATHER.parameters}],
        "tool_choice": {"type": "any"},
    }
    req = anthropic_api.parse(body, MODELS).request
    assert [m.role for m in req.messages or ()] == ["system", "user", "assistant", "tool"]
    assert req.tool_choice == "required" and req.max_tokens == 50


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        (
            {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
            "messages[0].content[0]",
        ),
        (
            {
                "max_tokens": 5,
                "thinking": {"type": "enabled"},
                "messages": [{"role": "user", "content": "x"}],
            },
            "thinking",
        ),
        (
            {
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": "y"}]}
                ],
            },
            "messages[0].content[0].tool_use_id",
        ),
    ],
)
def test_anthropic_requests_it_cannot_honour_get_named_400s(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as info:
        anthropic_api.parse({"model": "m", **body}, MODELS)
    assert info.value.status == 400 and info.value.param == param


def test_llama_server_chat_route_gets_free_choices_and_schemas() -> None:
    from clover_local.engine.types import GenerationRequest
    from clover_local.llamacpp.server_tools import agent_payload

    other = ToolSpec("get_time")
    payload = agent_payload(GenerationRequest(prompt="x", tools=(WEATHER, other)))
    assert payload["tool_choice"] == "auto" and len(payload["tools"]) == 2
    grammar = agent_payload(GenerationRequest(prompt="x", json_schema={}))["grammar"]
    assert grammar == schema_grammar({"type": "object"}), "the embedded engine's grammar, on both engines"
    with pytest.raises(ValueError, match="clover-local's route"):
        agent_payload(GenerationRequest(prompt="x", tools=(WEATHER, other), tool_choice="get_time"))


def test_llama_server_tool_call_deltas_are_put_back_together() -> None:
    from clover_local.llamacpp.server_tools import ToolCallCollector

    collector = ToolCallCollector()
    pieces = [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city": '}},
        {"index": 1, "id": "c2", "function": {"name": "get_time", "arguments": "{}"}},
        {"index": 0, "function": {"arguments": '"Oslo"}'}},
    ]
    for piece in pieces:
        collector.add({"choices": [{"delta": {"tool_calls": [piece]}}]})
    assert collector.calls() == [
        ToolCall("c1", "get_weather", '{"city": "Oslo"}'),
        ToolCall("c2", "get_time", "{}"),
    ]


# --- forced calls, turn ends and what llama-server cannot enforce -----------------------------------------------


def test_a_call_cut_by_max_tokens_is_withheld_not_shown() -> None:
    stats = GenerationStats(1, 1, 0, 0.0, 0.0, 0.0, None, finish_reason="length")
    pieces = ["Sure", '<tool_call>\n{"name": "get_weather", "arguments": {"ci']
    events = list(
        toolcalls.split_events(iter([*(TextDelta(p) for p in pieces), Finished(stats)]), "hermes", [WEATHER])
    )
    assert [e.text for e in events if isinstance(e, TextDelta)] == ["Sure"]
    assert not [e for e in events if isinstance(e, ToolCallMade)]
    assert isinstance(events[-1], Finished) and events[-1].stats.finish_reason == "length"


def test_a_call_ended_without_its_closing_tag_still_counts() -> None:
    """With parallel calls off the reply stops at the first ``</tool_call>`` (a stop string, never shown)."""
    from clover_local.engine.types import GenerationRequest

    assert toolcalls.reply_stops(GenerationRequest(prompt="x", tools=(WEATHER,))) == ("</tool_call>",)
    assert (
        toolcalls.reply_stops(GenerationRequest(prompt="x", tools=(WEATHER,), parallel_tool_calls=True)) == ()
    )
    assert toolcalls.reply_stops(GenerationRequest(prompt="x", tools=(WEATHER,), tool_choice="none")) == ()
    stats = GenerationStats(1, 1, 0, 0.0, 0.0, 0.0, None)
    text = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
    events = list(toolcalls.split_events(iter([TextDelta(text), Finished(stats)]), "hermes", [WEATHER]))
    calls = [e.call for e in events if isinstance(e, ToolCallMade)]
    assert [json.loads(c.arguments) for c in calls] == [{"city": "Oslo"}]
    assert isinstance(events[-1], Finished) and events[-1].stats.finish_reason == "tool_calls"


NESTED = ToolSpec(
    "book",
    "",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "enum": ["Paris", "Oslo"]},
            "days": {"type": "integer"},
            "when": {"type": "object", "properties": {"day": {"type": "string"}}, "required": ["day"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "note": {"type": "string"},
        },
        "required": ["city", "days", "when", "tags"],
    },
)


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder"])
def test_the_shortest_forced_call_has_the_required_arguments_only(fmt: toolcalls.ToolFormat) -> None:
    text = toolcalls.shortest_call([NESTED, WEATHER], fmt)
    (call,) = toolcalls.parse_calls(text, fmt, [NESTED, WEATHER])
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}, "the shorter tool"
    (call,) = toolcalls.parse_calls(toolcalls.shortest_call([NESTED], fmt), fmt, [NESTED])
    assert json.loads(call.arguments) == {"city": "Oslo", "days": 0, "when": {"day": ""}, "tags": []}


def test_a_forced_call_that_cannot_fit_in_max_tokens_is_a_named_400() -> None:
    from clover_local.engine.types import GenerationRequest
    from clover_local.serve.tools import check_forced_call_fits

    def count(text: str) -> int:
        return len(text)

    need = len(toolcalls.shortest_call([WEATHER], "hermes"))
    named = GenerationRequest(prompt="x", tools=(WEATHER,), tool_choice="get_weather", max_tokens=need - 1)
    with pytest.raises(ApiError) as info:
        check_forced_call_fits(named, "hermes", count, "max_completion_tokens")
    assert info.value.param == "max_completion_tokens" and info.value.code == "max_tokens_too_small"
    assert str(need) in info.value.message
    check_forced_call_fits(replace(named, max_tokens=need), "hermes", count, "max_tokens")
    check_forced_call_fits(replace(named, tool_choice="auto", max_tokens=1), "hermes", count, "max_tokens")


def test_turn_markers_are_the_ones_the_template_writes() -> None:
    from clover_local.engine.templates import PROBE_MESSAGES, render_builtin, render_completion, turn_markers
    from clover_local.testing.vocab import CHATML_TEMPLATE

    chatml = render_jinja(CHATML_TEMPLATE, PROBE_MESSAGES, bos_token="", eos_token="")
    assert turn_markers(chatml) == ("<|im_start|>", "<|im_end|>")
    assert turn_markers(render_builtin("gemma", PROBE_MESSAGES)) == ("<start_of_turn>", "<end_of_turn>")
    assert turn_markers(render_completion(PROBE_MESSAGES)) == ()


def test_llama_server_runs_through_clover_where_it_would_not_enforce() -> None:
    """llama-server's chat route ignores tools on a template without tool syntax (no grammar at all), and lets
    free text come before a forced call: those requests take clover-local's route, as a GGUF without a
    template does; the rest stay on llama-server's own route."""
    from clover_local.engine.templates import TemplateChoice
    from clover_local.engine.types import GenerationRequest
    from clover_local.llamacpp.server_tools import clover_enforces

    ask = (ChatMessage("user", "hi"),)
    tools_template = TemplateChoice("jinja", "gguf", QWEN3_TOOLS_TEMPLATE)
    gemma = TemplateChoice("builtin", "gemma")
    plain = TemplateChoice("completion", "completion")

    def enforced(template: TemplateChoice, **fields: object) -> bool:
        return clover_enforces(template, GenerationRequest(messages=ask, **fields))  # type: ignore[arg-type]

    assert not enforced(tools_template) and not enforced(gemma)
    assert not enforced(tools_template, tools=(WEATHER,)), "auto on a tool template: llama-server parses"
    assert enforced(tools_template, tools=(WEATHER,), tool_choice="required")
    assert enforced(tools_template, tools=(WEATHER,), tool_choice="get_weather")
    assert enforced(gemma, tools=(WEATHER,)) and enforced(gemma, tools=(WEATHER,), tool_choice="required")
    assert enforced(gemma, tools=(WEATHER,), tool_choice="none"), "--no-jinja refuses tools, even unused ones"
    called = ChatMessage("assistant", "", tool_calls=(ToolCall("c", "get_weather", "{}"),))
    result = ChatMessage("tool", "sunny", tool_call_id="c")
    assert clover_enforces(gemma, GenerationRequest(messages=(*ask, called, result))), "results folded in"
    assert enforced(plain) and not clover_enforces(plain, GenerationRequest(prompt="x"))


def test_clover_route_keeps_turn_markers_and_call_tags_as_text_and_stops_at_them() -> None:
    """Under the forced call's grammar only the request's stops and the turn-closing markers stop the reply
    (the grammar ends after the call; a string may hold ``</tool_call>`` or an opening marker as text); every
    marker and the call tags are kept as text."""
    from clover_local.engine.types import GenerationRequest
    from clover_local.llamacpp.server_tools import completion_payload

    request = GenerationRequest(prompt="x", tools=(WEATHER,), tool_choice="required", stop=("END",))
    out = completion_payload(request, "P", "root ::= x", ("<start_of_turn>", "<end_of_turn>"))
    assert out["prompt"] == "P" and out["grammar"] == "root ::= x" and "json_schema" not in out
    assert out["stop"] == ["END", "<end_of_turn>"]
    assert out["preserved_tokens"] == ["<tool_call>", "</tool_call>", "<start_of_turn>", "<end_of_turn>"]
    schema = completion_payload(GenerationRequest(prompt="x", json_schema={}), "P", None, ())
    assert schema["grammar"] == schema_grammar({"type": "object"}) and "json_schema" not in schema


def test_the_model_name_is_matched_in_any_case() -> None:
    parsed = oa.parse_chat(
        {"model": "gemma-3-270m-q4_k_m", "messages": [{"role": "user", "content": "x"}]},
        ("gemma3-270m", "gemma-3-270m-Q4_K_M"),
    )
    assert parsed.model == "gemma-3-270m-Q4_K_M"


def test_a_call_whose_string_holds_the_closing_tag_is_read_to_the_tag_after_its_json() -> None:
    """Under the call's grammar a model may write ``</tool_call>`` inside a JSON string (the grammar reads it as
    text; the llama-server soak's two "200 without a call"): the call is the JSON object, read past that tag, whole
    or streamed in pieces; two plain calls and an unclosed last one read as before, and many unclosed strings stay
    cheap (a bounded number of reads past a tag)."""
    from clover_local.engine.toolcalls import CallSplitter, parse_calls

    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "London, England}}</tool_call>You can use", '
        '"unit": "F"}\n\n}\n</tool_call>'
    )
    (call,) = parse_calls(text, "hermes", ())
    assert call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "London, England}}</tool_call>You can use", "unit": "F"}
    splitter = CallSplitter("hermes", ())
    streamed = [c for i in range(0, len(text), 7) for c in splitter.push(text[i : i + 7])[1]]
    assert [c.arguments for c in streamed] == [call.arguments] and splitter.finish() == ("", [])
    two = '<tool_call>\n{"name":"a","arguments":{}}\n</tool_call>\n<tool_call>\n{"name":"b","arguments":{}}\n</tool_call>'
    assert [c.name for c in parse_calls(two, "hermes", ())] == ["a", "b"]
    assert [c.name for c in parse_calls('<tool_call>{"name":"a","arguments":{}}', "hermes", ())] == ["a"]
    hostile = '<tool_call>{"name": "a", "arguments": {"x": "</tool_call>' * 20_000
    assert parse_calls(hostile, "hermes", ()) == ()
