"""The real client libraries get their typed objects from both engines, on a pydantic model with bounded,
optional, nested and literal fields (``qty: int = Field(ge=1)``): instructor (tools and JSON-schema modes),
pydantic-ai (tool output, over chat completions and over the Responses API) and the OpenAI Agents SDK (typed
output). The model is a tiny random one: it writes
whatever the grammar lets through, so each object comes out valid only because the schema is enforced.

The libraries are in the ``test`` extra; each test is skipped where its library is missing (an environment
set up without them)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

from clover_local.testing.models import TinySpec, tiny_model_from_spec
from tests.test_agents_generic import ENGINES, KEY, _served

pytestmark = pytest.mark.slow


class Line(BaseModel):
    sku: Literal["apple", "pear"]
    qty: int = Field(ge=1, le=99)


class Cart(BaseModel):
    lines: list[Line] = Field(min_length=1, max_length=3)
    note: str | None = Field(default=None, max_length=20)
    priority: int = Field(ge=1)


ASK = [{"role": "user", "content": "Two apples, please."}]


@pytest.fixture(scope="module", params=ENGINES)
def url(request: pytest.FixtureRequest) -> Iterator[str]:
    with _served(request.param, tiny_model_from_spec(TinySpec(kind="llama"))) as (_engine, base):
        yield base + "/v1"


def _check(cart: Any) -> None:
    assert isinstance(cart, Cart)
    assert 1 <= len(cart.lines) <= 3 and all(line.qty >= 1 for line in cart.lines) and cart.priority >= 1


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_gets_a_typed_object(url: str, mode: str) -> None:
    instructor = pytest.importorskip("instructor")
    import openai

    client = instructor.from_openai(
        openai.OpenAI(base_url=url, api_key=KEY, max_retries=0), mode=getattr(instructor.Mode, mode)
    )
    cart = client.chat.completions.create(
        model="m", messages=ASK, response_model=Cart, max_retries=0, max_tokens=600, seed=1
    )
    _check(cart)


def test_pydantic_ai_gets_a_typed_object(url: str) -> None:
    agent_mod = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=url, api_key=KEY))
    agent = agent_mod.Agent(model, output_type=Cart, retries=0)
    result = agent.run_sync("Two apples, please.", model_settings={"max_tokens": 600, "seed": 1})
    _check(result.output)


@pytest.mark.parametrize("output", ["tool", "native"])
def test_pydantic_ai_gets_a_typed_object_over_the_responses_api(url: str, output: str) -> None:
    """pydantic-ai's ``OpenAIResponsesModel``: ``/v1/responses`` with the output as a forced function tool, or
    as ``text.format`` (``NativeOutput``)."""
    agent_mod = pytest.importorskip("pydantic_ai")
    from pydantic_ai.models.openai import OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    model = OpenAIResponsesModel("m", provider=OpenAIProvider(base_url=url, api_key=KEY))
    output_type = agent_mod.NativeOutput(Cart) if output == "native" else Cart
    agent = agent_mod.Agent(model, output_type=output_type, retries=0)
    result = agent.run_sync("Two apples, please.", model_settings={"max_tokens": 600, "seed": 1})
    _check(result.output)


def test_openai_agents_sdk_gets_a_typed_object(url: str) -> None:
    agents = pytest.importorskip("agents")
    import openai

    agents.set_tracing_disabled(True)
    model = agents.OpenAIChatCompletionsModel(
        model="m", openai_client=openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
    )
    agent = agents.Agent(
        name="shop", instructions="Fill the cart.", model=model, output_type=Cart,
        model_settings=agents.ModelSettings(max_tokens=600),
    )  # fmt: skip
    result = asyncio.run(agents.Runner.run(agent, "Two apples, please."))
    _check(result.final_output)
