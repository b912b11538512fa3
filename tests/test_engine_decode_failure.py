"""The embedded engine has no child to restart: a ``llama_decode`` that fails (out of memory at a long prompt, a
full KV cache, a backend error) fails its own request with an error and leaves the engine usable (issue 39). What
holds: the failing sequence's cells are dropped (``EmbeddedEngine._forget``), the request gets an ``EngineError``
(``serve``: a 500 in the API's shape), and the next request is answered as if nothing had happened.

The failure is injected at the edge, in llama.cpp's own ``llama_decode`` (its return codes as ``llama.h`` lists
them: 1 no KV slot, -3 compute failed), the Nth time it is called; nothing else of the engine is faked."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from helpers_engine import generate_text
from llama_cpp import llama_cpp as C

from clover_local.engine.types import ChatEngine, GenerationRequest
from clover_local.errors import EngineError
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer

pytestmark = pytest.mark.slow

REQUEST = GenerationRequest(
    prompt="The planets of the solar system are", max_tokens=24, temperature=0, cache_prompt=False
)


def _failing_once(at_call: int, rc: int) -> tuple[Callable[..., Any], list[int]]:
    real = C.llama_decode
    calls = [0]

    def llama_decode(ctx: Any, batch: Any) -> int:
        calls[0] += 1
        if calls[0] == at_call:
            return rc
        return int(real(ctx, batch))

    return llama_decode, calls


@pytest.mark.parametrize(
    ("at_call", "rc", "said"),
    [
        (1, -3, "failed to evaluate the prompt"),  # the prompt's evaluation fails
        (6, -3, "failed to evaluate"),  # mid-reply: the fifth token's step
        (1, 1, "The context is full"),  # no room in the KV cache
    ],
)
def test_a_failed_decode_fails_its_request_and_the_next_is_answered(
    gemma_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch, at_call: int, rc: int, said: str
) -> None:
    before, _ = generate_text(gemma_engine, REQUEST)
    failing, calls = _failing_once(at_call, rc)
    monkeypatch.setattr(C, "llama_decode", failing)
    with pytest.raises(EngineError) as failed:
        generate_text(gemma_engine, REQUEST)
    assert said in str(failed.value)
    assert calls[0] >= at_call
    after, stats = generate_text(gemma_engine, REQUEST)  # the same engine, llama_decode working again
    assert stats.finish_reason in ("stop", "length") and after.strip()
    assert after == before, "the same request, evaluated from scratch, writes the same reply"


def test_serve_answers_a_failed_decode_with_one_error_then_goes_on(
    gemma_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    import openai

    with BackgroundServer(gemma_engine, ApiConfig("gemma")) as server:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
        failing, _calls = _failing_once(3, -3)
        monkeypatch.setattr(C, "llama_decode", failing)
        with pytest.raises(openai.InternalServerError) as failed:
            client.completions.create(
                model="gemma", prompt=REQUEST.prompt or "", max_tokens=24, temperature=0
            )
        assert "failed to evaluate" in failed.value.response.json()["error"]["message"]
        reply = client.completions.create(
            model="gemma", prompt=REQUEST.prompt or "", max_tokens=8, temperature=0
        )
        assert reply.choices[0].text.strip()
        with urllib.request.urlopen(server.url + "/health", timeout=30) as resp:
            assert json.loads(resp.read())["status"] == "ok"
