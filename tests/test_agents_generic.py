"""Agents on models whose chat template has no tool syntax, on both engines, with the official clients: a forced
call (``tool_choice`` required or named, Anthropic ``any`` / ``tool``) is always made, in the generic format
(the tools listed in a system note, the call forced by a grammar); a call that cannot fit in ``max_tokens`` is
a named 400 up front, or withheld when the reply runs out inside it; ``auto`` describes the tools in the
prompt; JSON replies follow their schema; and no reply shows the template's control text.

Models are opened as ``clover-local serve --model FILE`` opens them (``plan_for`` without a preset, then
``open_launch``): the real Gemma 3 270M *base* model (its GGUF has no template; its preset names llama.cpp's
built-in ``gemma``), the real SmolLM2 135M Instruct (a ChatML Jinja template that never mentions tools), and the
tiny random models (the tool caller, the qwen35moe standing in for Clover, a plain ChatML llama). What a small
model writes inside a forced call is its own guess: the checks are on form, and on the call being there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from clover_local.detect import parse_simulate
from clover_local.engine.templates import TURN_MARKERS
from clover_local.engine.toolcalls import shortest_call
from clover_local.engine.types import ChatEngine
from clover_local.launch import LaunchRequest, decide_launch, open_launch
from clover_local.presets import Preset, load_preset
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer
from clover_local.serve.tools import parse_tools
from clover_local.testing.models import TinySpec, tiny_model, tiny_model_from_spec
from clover_local.testing.vocab import QWEN3_TOOLS_TEMPLATE
from tests.helpers_serve import llama_server_path

pytestmark = pytest.mark.slow

KEY = "generic-key"
ENGINES = ("embedded", "llama-server")
MACHINE = "ram=16G,cpu=2"
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


def _open(kind: str, path: Path, preset: Preset | None = None, ctx: int = 2048) -> ChatEngine:
    """The engine ``serve --model PATH --engine KIND`` runs (``preset``: ``--preset`` given as well)."""
    binary = str(llama_server_path()) if kind == "llama-server" else None
    request = LaunchRequest(preset, str(path), ctx=ctx, engine=kind, llama_server=binary)  # type: ignore[arg-type]
    return open_launch(decide_launch(request, machine=parse_simulate(MACHINE))).engine


@contextmanager
def _served(kind: str, path: Path, preset: Preset | None = None) -> Iterator[tuple[ChatEngine, str]]:
    """(engine, base URL) of serve over it, with the API key."""
    engine = _open(kind, path, preset)
    try:
        with BackgroundServer(engine, ApiConfig.for_model("m", str(path), KEY)) as server:
            yield engine, server.url
    finally:
        engine.close()


@pytest.fixture(scope="module", params=[(m, e) for m in ("gemma", "smollm2") for e in ENGINES], ids=str)
def served(
    request: pytest.FixtureRequest, gemma_path: Path, smollm2_path: Path
) -> Iterator[tuple[str, ChatEngine, str]]:
    """(model, engine, base URL) of serve over Gemma 3 270M (base) or SmolLM2 135M (instruct), opened from the
    bare file on each engine."""
    model, kind = request.param
    path = gemma_path if model == "gemma" else smollm2_path
    with _served(kind, path) as (engine, url):
        yield model, engine, url


def _oa(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=600)


def _no_control_text(text: str | None) -> None:
    shown = [m for m in TURN_MARKERS if m in (text or "")]
    assert not shown, f"control text {shown} in the reply: {text!r}"


def _min_call_tokens(engine: ChatEngine) -> int:
    return engine.count_tokens(shortest_call(parse_tools([WEATHER_TOOL]), engine.tool_format))


# --- the request, and every other way to force a call ---------------------------------------------------


def test_a_named_tool_choice_always_gets_that_call(served: tuple[str, ChatEngine, str]) -> None:
    """The request of issue #21, word for word (the model named as the file in lower case)."""
    _model, _engine, url = served
    reply = _oa(url).chat.completions.create(
        model="gemma-3-270m-q4_k_m" if _model == "gemma" else "m",
        max_tokens=64,
        temperature=0,
        messages=ASK,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "get_weather" and call.id
    assert isinstance(json.loads(call.function.arguments)["city"], str)
    assert not choice.message.content


def test_required_and_anthropic_any_and_tool_make_the_call(served: tuple[str, ChatEngine, str]) -> None:
    _model, _engine, url = served
    required = _oa(url).chat.completions.create(
        model="m",
        max_tokens=64,
        temperature=0,
        messages=ASK,
        tools=[WEATHER_TOOL],
        tool_choice="required",
    )
    (call,) = required.choices[0].message.tool_calls or []
    assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments)
    client = anthropic.Anthropic(base_url=url, api_key=KEY, max_retries=0, timeout=600)
    tool: Any = {
        "name": "get_weather",
        "description": "Weather for a city",
        "input_schema": WEATHER_TOOL["function"]["parameters"],
    }
    one: Any = {"disable_parallel_tool_use": True}
    for tool_choice in (
        {"type": "any", **one},
        {"type": "tool", "name": "get_weather", **one},
        {"type": "any"},
    ):
        message = client.messages.create(
            model="m",
            max_tokens=64,
            messages=ASK,
            tools=[tool],
            tool_choice=tool_choice,
            extra_body={"temperature": 0},
        )
        uses = [b for b in message.content if b.type == "tool_use"]
        assert uses and all(u.name == "get_weather" and isinstance(u.input["city"], str) for u in uses)
        assert not [b for b in message.content if b.type == "text" and b.text.strip()]
        if tool_choice.get("disable_parallel_tool_use"):
            assert message.stop_reason == "tool_use" and len(uses) == 1
        else:  # calls in a row until the model stops or max_tokens cuts one, which is withheld
            assert message.stop_reason in ("tool_use", "max_tokens")


def test_a_call_that_cannot_fit_is_a_named_400_or_withheld(served: tuple[str, ChatEngine, str]) -> None:
    """Below the shortest call the grammar allows: a 400 naming the field, on every API. At that minimum the
    model's own call (a real city, not ``""``) runs out: ``length``, and no half call shown as text."""
    _model, engine, url = served
    need = _min_call_tokens(engine)
    client = _oa(url)
    kwargs: dict[str, Any] = {"model": "m", "messages": ASK, "tools": [WEATHER_TOOL], "temperature": 0}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(**kwargs, tool_choice="required", max_tokens=need - 1)
    body: Any = info.value.body
    assert (
        body["param"] == "max_tokens"
        and body["code"] == "max_tokens_too_small"
        and str(need) in body["message"]
    )
    flat: Any = [{"type": "function", **WEATHER_TOOL["function"]}]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(
            model="m", input=ASK, tools=flat, tool_choice="required", max_output_tokens=need - 1
        )
    body = info.value.body
    assert body["param"] == "max_output_tokens"
    cut = client.chat.completions.create(**kwargs, tool_choice="required", max_tokens=need)
    choice = cut.choices[0]
    assert choice.finish_reason == "length"
    assert not choice.message.tool_calls and not choice.message.content


def test_auto_lists_the_tools_in_the_prompt(served: tuple[str, ChatEngine, str]) -> None:
    """Without tool syntax in the template the tools are described in a system note (the prompt grows by
    their description); what the model does with them is its own choice, but a call it makes parses. With
    ``tool_choice`` none they are not shown at all."""
    _model, _engine, url = served
    client = _oa(url)
    plain = client.chat.completions.create(model="m", messages=ASK, max_tokens=8, temperature=0)
    auto = client.chat.completions.create(
        model="m",
        messages=ASK,
        tools=[WEATHER_TOOL],
        max_tokens=64,
        temperature=0,
    )
    assert plain.usage is not None and auto.usage is not None
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    message = auto.choices[0].message
    for call in message.tool_calls or []:
        assert call.function.name == "get_weather" and isinstance(json.loads(call.function.arguments), dict)
    _no_control_text(message.content)
    unused = client.chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER_TOOL], tool_choice="none", max_tokens=8, temperature=0
    )
    assert unused.usage is not None and unused.usage.prompt_tokens == plain.usage.prompt_tokens
    assert not unused.choices[0].message.tool_calls, (
        "tool_choice none: tools not shown (llama-server --no-jinja refused them)"
    )


def test_json_replies_follow_their_schema(served: tuple[str, ChatEngine, str]) -> None:
    _model, _engine, url = served
    client = _oa(url)
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "sunny": {"type": "boolean"}},
        "required": ["city", "sunny"],
        "additionalProperties": False,
    }
    reply = client.chat.completions.create(
        model="m",
        messages=ASK,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "w", "schema": schema, "strict": True},
        },
        max_tokens=60,
        temperature=0,
    )
    assert reply.choices[0].finish_reason == "stop"
    value = json.loads(reply.choices[0].message.content or "")
    assert set(value) == {"city", "sunny"} and value["city"] in ("Paris", "Oslo")
    loose = client.chat.completions.create(
        model="m",
        messages=ASK,
        response_format={"type": "json_object"},
        max_tokens=40,
        temperature=0,
    )
    text = loose.choices[0].message.content or ""
    if loose.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:  # a small model may fill a string until max_tokens: still JSON so far
        assert text.lstrip().startswith("{")


README = Path(__file__).resolve().parent.parent / "docs" / "agents-tools.md"


def readme_agent_loop(url: str) -> tuple[list[Any], Any]:
    """Run the agent loop of docs/agents-tools.md as written there, pointed at ``url``: its messages and
    its last reply."""
    text = README.read_text(encoding="utf-8")
    block = text[text.index("**An agent loop**") :]
    code = block[block.index("```python\n") + 10 : block.index("\n```\n")]
    code = code.replace("http://127.0.0.1:8080/v1", url + "/v1").replace('"KEY"', repr(KEY))
    code = code.replace('model="smollm2-135m"', 'model="m"').replace("print(message.content)", "")
    scope: dict[str, Any] = {}
    exec(compile(code, str(README), "exec"), scope)
    return scope["messages"], scope["reply"]


DRAWS = 5
"""Runs of the loop at most, for a first step whose sampled city ran past the loop's ``max_tokens``."""


def test_the_readme_agent_loop_runs_to_an_answer(served: tuple[str, ChatEngine, str]) -> None:
    """The loop samples (it sets no temperature, as people write it), so only its first, forced step is the
    same on every run: the later steps are the model's draw, which may be a call with invented arguments (the
    loop answers it with an error) or an empty turn from the base model. What holds on every draw: the loop
    ends, the first call is ``get_weather`` with a city, and no reply shows the template's control text.

    One draw in a few dozen the forced call's city (a string the schema does not bound) runs past the loop's
    ``max_tokens``: then the unfinished call is withheld, as docs/agents-tools.md says, and the loop is run
    again, a new draw."""
    _model, _engine, url = served
    for _ in range(DRAWS):
        messages, reply = readme_agent_loop(url)
        if len(messages) > 1:
            break
        cut = reply.choices[0]
        assert cut.finish_reason == "length" and not cut.message.tool_calls, cut
        _no_control_text(cut.message.content)
        assert '"city"' not in (cut.message.content or ""), "an unfinished call shown as text"
    roles = [m["role"] for m in messages]
    assert roles[:3] == ["user", "assistant", "tool"] and roles.count("assistant") == roles.count("tool")
    first = messages[1]["tool_calls"][0]["function"]
    assert first["name"] == "get_weather" and isinstance(json.loads(first["arguments"])["city"], str)
    assert json.loads(messages[2]["content"])["forecast"] == "sunny"  # the forced call's own result
    answer = reply.choices[0].message.content
    assert answer is not None
    _no_control_text(answer)
    for m in messages[1:]:
        _no_control_text(m.get("content"))


# --- control text never shown -----------------------------------------------------------------------------------

PROMPTS = (
    "Write a short poem about the sea.",
    "Hello! Who are you?",
    "List three colours, one per line.",
)


def _check_replies(url: str, *, max_tokens: int = 48) -> None:
    client = _oa(url)
    for prompt in PROMPTS:
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens, temperature=0
        )
        _no_control_text(reply.choices[0].message.content)
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": PROMPTS[0]}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
        if chunk.choices
    )
    _no_control_text(streamed)


def _tiny_models() -> dict[str, Path]:
    return {
        "tiny-qwen35moe": tiny_model("qwen35moe"),
        "tiny-qwen3moe": tiny_model("qwen3moe"),
        "tiny-llama": tiny_model("llama"),
        "tiny-tool-caller": tiny_model_from_spec(
            TinySpec(kind="llama", chat_template=QWEN3_TOOLS_TEMPLATE, tool_caller=True)
        ),
        "tiny-dream": tiny_model("dream"),  # diffusion: the embedded engine decodes it on either choice
    }


@pytest.mark.parametrize("kind", ENGINES)
@pytest.mark.parametrize(
    "model",
    [
        "gemma3-270m",
        "smollm2-135m",
        "tiny-qwen35moe",
        "tiny-qwen3moe",
        "tiny-llama",
        "tiny-tool-caller",
        "tiny-dream",
    ],
)
def test_no_reply_shows_its_templates_control_text(
    model: str, kind: str, gemma_path: Path, smollm2_path: Path
) -> None:
    """Every packaged preset (Clover has no local file: the tiny qwen35moe with its ChatML template stands in)
    and the tiny test models, chatting with nothing else: the reply ends at the template's end of turn."""
    path = {"gemma3-270m": gemma_path, "smollm2-135m": smollm2_path, **_tiny_models()}.get(model)
    assert path is not None
    with _served(kind, path) as (_engine, url):
        _check_replies(url)


@pytest.mark.parametrize("kind", ENGINES)
def test_a_template_the_model_cannot_end_still_ends_the_turn(kind: str, gemma_path: Path) -> None:
    """Issue #21's leak itself: Gemma under ChatML, whose ``<|im_end|>`` is no token of Gemma's vocabulary (not
    an end of generation), writes the markers out in pieces; the reply still stops at the first one."""
    chatml = replace(load_preset("gemma3-270m"), chat_template="chatml")
    with _served(kind, gemma_path, chatml) as (_engine, url):
        client = _oa(url)
        reply = client.chat.completions.create(model="m", messages=ASK, max_tokens=64, temperature=0)
        _no_control_text(reply.choices[0].message.content)
        assert reply.choices[0].finish_reason == "stop", "the turn ended at the marker, not at max_tokens"
