"""Two requests in flight at once through ``serve`` keep apart on both engines: a forced tool call and a plain reply
with a stop string, each with only its own result (the official openai client, the real SmolLM2 135M Instruct).
And on the llama-server engine a client that hangs up frees llama-server's *own* slot, not only serve's count: with
both slots generating, one hang-up lets a third request through while the other long reply still generates.

Both requests are in flight together by construction: the engine passed to ``serve`` holds each generation at a
barrier before it starts, so neither begins before the other has been admitted. Ordering is read from llama-server's
``/slots`` (which of its slots is processing) and ``serve``'s ``/health``, never from time.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest
from helpers_engine import EngineWrapper
from helpers_serve import HeldStream, health, llama_server_path, raw_post
from waiting import wait_until

from clover_local.engine.types import ChatEngine, GenerationEvent, GenerationRequest
from clover_local.launch import LaunchRequest, decide_launch, open_launch
from clover_local.llamacpp import http_client
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer

pytestmark = pytest.mark.slow

ENGINES = ("embedded", "llama-server")
KEY = "slots-key"
CTX = 1024
FORECAST: Any = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
    "required": ["city", "days"],
    "additionalProperties": False,
}
WEATHER_TOOL: Any = {
    "type": "function",
    "function": {"name": "get_weather", "description": "Forecast", "parameters": FORECAST},
}
COUNT: Any = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
"""SmolLM2 (greedy) answers ``1. 1\\n2. 2\\n...``, on both engines: a stop string at ``7.`` ends it there."""


class StartTogether(EngineWrapper):
    """The engine, each generation held before it starts until ``parties`` generations have been admitted: they
    are in flight at once however fast or loaded the machine is."""

    def __init__(self, inner: ChatEngine, parties: int) -> None:
        super().__init__(inner)
        self.barrier = threading.Barrier(parties, timeout=120)

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        self.barrier.wait()
        yield from self.inner.generate(request, cancel)


def _open(kind: str, path: Path, *, slots: int, preset: str | None = None) -> ChatEngine:
    """The engine ``serve --model PATH --engine KIND --parallel SLOTS`` runs."""
    binary = str(llama_server_path()) if kind == "llama-server" else None
    request = LaunchRequest(
        preset,
        str(path),
        ctx=CTX,
        parallel=slots,
        engine=kind,  # type: ignore[arg-type]
        llama_server=binary,
        describe=False,
        spec="off",
    )
    engine = open_launch(decide_launch(request)).engine
    assert engine.slots == slots
    return engine


@pytest.mark.parametrize("kind", ENGINES)
def test_a_forced_call_and_a_stopped_reply_at_once_each_get_only_their_own(
    kind: str, smollm2_path: Path
) -> None:
    engine = _open(kind, smollm2_path, slots=2)
    try:
        with BackgroundServer(
            StartTogether(engine, 2), ApiConfig.for_model("m", str(smollm2_path), KEY)
        ) as server:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=600)
            replies: dict[str, Any] = {}

            def call() -> None:
                replies["call"] = client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "Weather in Oslo for 2 days?"}],
                    tools=[WEATHER_TOOL],
                    tool_choice="required",
                    max_tokens=80,
                    temperature=0,
                )

            def text() -> None:
                replies["text"] = client.chat.completions.create(
                    model="m", messages=COUNT, stop=["7."], max_tokens=80, temperature=0
                )

            threads = [threading.Thread(target=f) for f in (call, text)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=240)
    finally:
        engine.close()
    assert sorted(replies) == ["call", "text"]
    called = replies["call"].choices[0]
    assert called.finish_reason == "tool_calls"
    assert called.message.tool_calls and len(called.message.tool_calls) == 1
    function = called.message.tool_calls[0].function
    assert function.name == "get_weather"
    jsonschema.validate(
        json.loads(function.arguments), FORECAST
    )  # its own tool's schema, held by its own grammar
    said = replies["text"].choices[0]
    content = said.message.content or ""
    assert said.finish_reason == "stop" and not said.message.tool_calls
    assert "6. 6" in content and "7" not in content, content  # it ran to its own stop string, and ended there
    assert replies["text"].usage.completion_tokens < 80
    assert not any(mark in content for mark in ("{", "get_weather", "<tool_call>", "Oslo")), content


def _processing(engine: LlamaServerEngine) -> set[int]:
    """The ids of llama-server's own slots that are generating now (its ``/slots``)."""
    process = engine.process
    resp = http_client.request(
        engine.base_url, "GET", "/slots", None, api_key=process.api_key if process else None
    )
    assert resp.status == 200, "llama-server's /slots endpoint is off"
    return {int(slot["id"]) for slot in resp.json() if slot.get("is_processing")}


def _long(word: str, max_tokens: int) -> dict[str, Any]:
    """Gemma 3 270M (base, greedy) repeats a repeated word until ``max_tokens``."""
    return {
        "model": "m",
        "prompt": (word + " ") * 16,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }


@pytest.fixture
def llama_two_slots(gemma_path: Path) -> Iterator[tuple[LlamaServerEngine, BackgroundServer]]:
    engine = _open("llama-server", gemma_path, slots=2, preset="gemma3-270m")
    assert isinstance(engine, LlamaServerEngine)
    try:
        with BackgroundServer(engine, ApiConfig("m")) as server:
            yield engine, server
    finally:
        engine.close()


def test_a_hang_up_frees_llama_servers_own_slot_for_a_third_request(
    llama_two_slots: tuple[LlamaServerEngine, BackgroundServer],
) -> None:
    """The reply hung up on is the longer one: were llama-server left generating it, the other would end first
    and its slot be the one given back; instead the hung-up slot stops and the third request runs in it while
    the other long reply still generates."""
    engine, server = llama_two_slots
    hung = HeldStream(server.url, _long("zebra", CTX - 100))
    wait_until(lambda: len(_processing(engine)) == 1, what="llama-server to generate the first long reply")
    (hung_slot,) = _processing(engine)
    kept = HeldStream(server.url, _long("apple", CTX // 2))
    wait_until(lambda: len(_processing(engine)) == 2, what="llama-server to generate both long replies")
    (kept_slot,) = _processing(engine) - {hung_slot}
    assert health(server.url)["slots"]["busy"] == 2

    hung.hang_up()
    wait_until(lambda: hung_slot not in _processing(engine), what="llama-server to stop the hung-up reply")
    assert kept_slot in _processing(engine), (
        "the other long reply ended first: the hang-up did not stop its slot"
    )

    status, body = raw_post(
        server.url, "/v1/completions", json.dumps({**_long("cobalt", 6), "stream": False}).encode()
    )
    assert status == 200, body
    assert "cobalt" in body["choices"][0]["text"].lower()
    assert kept_slot in _processing(engine), "the third request waited for the other long reply to end"
    wait_until(
        lambda: health(server.url)["slots"]["busy"] == 1, what="the third request's slot to be given back"
    )
    kept.hang_up()
    wait_until(lambda: not _processing(engine), what="llama-server to stop the other reply")
    wait_until(lambda: health(server.url)["slots"]["busy"] == 0, what="serve's slots to be free again")
