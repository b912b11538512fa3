"""OpenAI request bodies -> GenerationRequest: what is accepted, and the field each refusal names."""

from __future__ import annotations

from typing import Any

import pytest

from clover_local.engine.types import ChatMessage
from clover_local.serve.openai_schema import ApiError, parse_chat, parse_completion

MODELS = ("clover-35b-a3b", "alias")


def test_chat_body_becomes_a_request() -> None:
    parsed = parse_chat(
        {
            "model": "alias",
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}],
                },
                {"role": "assistant", "content": None},
            ],
            "max_completion_tokens": 7,
            "temperature": 0,
            "stop": "END",
            "seed": 3,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
        MODELS,
    )
    req = parsed.request
    assert req.messages == (
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hi there"),
        ChatMessage("assistant", ""),
    )
    assert (req.max_tokens, req.temperature, req.stop, req.seed) == (7, 0.0, ("END",), 3)
    assert parsed.stream and parsed.include_usage and parsed.model == "alias"


def test_model_defaults_to_the_served_one_and_completion_takes_one_prompt() -> None:
    parsed = parse_completion({"prompt": ["only one"]}, MODELS)
    assert parsed.model == "clover-35b-a3b" and parsed.request.prompt == "only one"
    assert not parsed.max_tokens_given


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": "x"}], "model": "gpt-4"}, "model"),
        ({"messages": [{"role": "user", "content": "x"}], "n": 2}, "n"),
        ({"messages": [{"role": "user", "content": "x"}], "top_p": 1.5}, "top_p"),
        ({"messages": [{"role": "user", "content": "x"}], "seed": "1"}, "seed"),
        ({"messages": [{"role": "user", "content": "x"}], "stop": [1]}, "stop"),
        ({"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": True}, "max_tokens"),
    ],
)
def test_chat_refusals_name_the_field(body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as err:
        parse_chat(body, MODELS)
    assert err.value.status == 400
    assert err.value.param == param
    assert err.value.body()["error"]["message"]


@pytest.mark.parametrize(
    "body", [{"prompt": "x", "echo": True}, {"prompt": "x", "suffix": "y"}, {"prompt": None}]
)
def test_completion_refusals(body: dict[str, Any]) -> None:
    with pytest.raises(ApiError):
        parse_completion(body, MODELS)


def test_non_object_body_is_invalid_json() -> None:
    with pytest.raises(ApiError) as err:
        parse_chat(["messages"], MODELS)
    assert err.value.code == "invalid_json"
