"""Greedy replies do not change with machine load (issue 9): drafting decides from token statistics and a fixed
cost model, never from timings, so the same request drafts, verifies and answers the same way while another
process keeps a core busy. Checked on the embedded engine and on the real llama-server, speculation on."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_local.engine.loader import load_engine
from clover_local.engine.types import Finished, GenerationRequest, TextDelta
from clover_local.plan.types import SpeculativePlan
from clover_local.testing.settings import engine_settings
from tests.helpers_serve import llama_server_path

pytestmark = pytest.mark.slow

CODE_PROMPT = (
    "Original file:\n```python\ndef total(items):\n    result = 0\n    for item in items:\n"
    "        result += item.price * item.count\n    return result\n```\n"
    "The same file after renaming total to grand_total:\n```python\n"
)


@contextlib.contextmanager
def cpu_hog() -> Iterator[None]:
    """One process spinning on a core for as long as the block runs."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()


def _reply(engine, seed: int | None, temperature: float) -> tuple[str, int, int]:
    engine.reset_cache()
    request = GenerationRequest(
        prompt=CODE_PROMPT, max_tokens=80, temperature=temperature, seed=seed, speculative=True
    )
    text, stats = [], None
    for event in engine.generate(request):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            stats = event.stats
    assert stats is not None
    return "".join(text), stats.drafted_tokens, stats.accepted_tokens


@pytest.mark.parametrize(("temperature", "seed"), [(0.0, None), (0.8, 1)], ids=["greedy", "seeded"])
def test_embedded_reply_is_the_same_idle_and_busy(
    gemma_path: Path, temperature: float, seed: int | None
) -> None:
    loaded = load_engine(
        gemma_path,
        engine_settings(gemma_path, ctx=1024, n_batch=512),
        chat_template="completion",
        speculative=SpeculativePlan(enabled=True),
    )
    engine = loaded.engine
    try:
        idle = _reply(engine, seed, temperature)
        with cpu_hog():
            busy = _reply(engine, seed, temperature)
        again = _reply(engine, seed, temperature)
    finally:
        engine.close()
    assert idle[1] > 0, "the prompt is a copy task: speculation should have drafted"
    assert busy == idle == again


def test_llama_server_reply_is_the_same_idle_and_busy(gemma_path: Path) -> None:
    from clover_local.llamacpp import http_client
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.llamacpp.server import start_llama_server

    binary = ServerBinary(llama_server_path(), "built")
    argv = ["-m", str(gemma_path), "-c", "1024", "-t", "2", "--spec-type", "ngram-mod"]
    body = {"prompt": CODE_PROMPT, "n_predict": 80, "temperature": 0, "cache_prompt": False}

    def reply() -> tuple[str, int]:
        """One request to a fresh server: llama-server's ngram-mod keeps its n-gram table across requests, so
        a second request to the same server drafts differently whatever the load."""
        with start_llama_server(argv, binary=binary, ready_timeout_s=600) as server:
            data = http_client.request(
                server.url, "POST", "/completion", body, api_key=server.api_key, timeout_s=600
            ).json()
        return data["content"], int(data["timings"].get("draft_n", 0))

    idle = reply()
    with cpu_hog():
        busy = reply()
    assert idle[1] > 0
    assert busy == idle
