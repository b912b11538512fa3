"""``serve`` with slots: as many requests generate at once as the engine has slots (the embedded engine's batch,
llama-server's ``-np``), ``/health`` shows slots busy/total and the queue, a short request finishes while a long
one is still streaming (the long one's stream held open, unread), a client that hangs up frees its slot, and
past the queue limit a request gets 503 with ``Retry-After`` while the server goes on answering.

Ordering is proved by events: the long reply still holds its slot (``/health``) after the short one's last
chunk arrived, and gives it back only once its client hangs up. No timing is asserted."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_engine import GatedEngine, ScriptedEngine
from helpers_serve import HeldStream, RecordingEngine, health, llama_server_path, raw_post
from waiting import wait_until

from clover_local.launch import LaunchRequest, decide_launch, open_launch
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer
from clover_local.serve.slots import RETRY_AFTER_S

MODEL = "gemma3-270m"
CTX = 1024
WORDS = ("zebra", "apple", "cobalt", "orange")
"""Words Gemma 3 270M goes on repeating when a prompt repeats them (greedy)."""


def completion(word: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    return {
        "model": MODEL,
        "prompt": (word + " ") * 16,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def text_of(status_body: tuple[int, Any]) -> str:
    status, body = status_body
    assert status == 200, body
    return str(body["choices"][0]["text"])


def only_its_own_word(text: str, word: str) -> bool:
    lowered = text.lower()
    return word in lowered and not any(other in lowered for other in WORDS if other != word)


def _launched(request: LaunchRequest) -> Iterator[BackgroundServer]:
    opened = open_launch(decide_launch(request))
    engine = opened.engine
    try:
        with BackgroundServer(engine, ApiConfig(MODEL)) as server:
            yield server
    finally:
        engine.close()


@pytest.fixture(scope="module", params=["embedded", "llama-server"])
def server(request: pytest.FixtureRequest, gemma_path: Path) -> Iterator[BackgroundServer]:
    """Gemma 3 270M served with 3 slots on each engine, launched as ``serve`` launches it."""
    binary = str(llama_server_path()) if request.param == "llama-server" else None
    launch = LaunchRequest(
        preset=MODEL,
        model=str(gemma_path),
        ctx=CTX,
        parallel=3,
        engine=request.param,
        llama_server=binary,
        describe=False,
        spec="off",
    )
    yield from _launched(launch)


def test_health_shows_the_slots_and_the_queue(server: BackgroundServer) -> None:
    data = health(server.url)
    assert data["status"] == "ok"
    assert data["slots"] == {"total": 3, "busy": 0, "idle": 3}
    assert data["queue"]["waiting"] == 0 and data["queue"]["limit"] == 12


def test_requests_at_once_each_get_their_own_reply(server: BackgroundServer) -> None:
    replies: dict[str, str] = {}

    def ask(word: str) -> None:
        replies[word] = text_of(
            raw_post(server.url, "/v1/completions", json.dumps(completion(word, 16)).encode())
        )

    threads = [threading.Thread(target=ask, args=(w,)) for w in WORDS]  # four requests, three slots
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert sorted(replies) == sorted(WORDS)
    for word, text in replies.items():
        assert only_its_own_word(text, word), (word, text)


def test_a_short_request_ends_while_a_long_one_is_still_streaming(server: BackgroundServer) -> None:
    long = HeldStream(server.url, completion("zebra", CTX - 100, stream=True))
    short = text_of(raw_post(server.url, "/v1/completions", json.dumps(completion("cobalt", 6)).encode()))
    assert only_its_own_word(short, "cobalt")
    # ... while the long reply still holds its slot (the short one's slot is given back just after its reply is
    # sent: wait for that, never race it).
    wait_until(
        lambda: health(server.url)["slots"]["busy"] == 1, what="the short reply's slot to be given back"
    )
    long.hang_up()
    wait_until(
        lambda: health(server.url)["slots"]["busy"] == 0, what="the hung-up reply to give its slot back"
    )


@pytest.fixture
def queued() -> Iterator[tuple[BackgroundServer, GatedEngine]]:
    """One slot, one place in the queue, a reply held after its first piece (any machine speed)."""
    gate = GatedEngine(ScriptedEngine(), holds=1)
    with BackgroundServer(RecordingEngine(gate), ApiConfig(MODEL, max_queue=1)) as server:
        yield server, gate


def test_past_the_queue_limit_a_request_gets_503_with_retry_after(
    queued: tuple[BackgroundServer, GatedEngine],
) -> None:
    server, gate = queued
    held = HeldStream(server.url, completion("zebra", 20, stream=True))
    assert gate.held.wait(60)
    waiting: list[tuple[int, Any]] = []
    second = threading.Thread(
        target=lambda: waiting.append(
            raw_post(server.url, "/v1/completions", json.dumps(completion("x", 3)).encode())
        )
    )
    second.start()
    wait_until(lambda: health(server.url)["queue"]["waiting"] == 1, what="the second request to wait")
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request(
        "POST", "/v1/chat/completions", body=json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    resp = conn.getresponse()
    body = json.loads(resp.read())
    conn.close()
    assert resp.status == 503
    assert resp.getheader("Retry-After") == str(RETRY_AFTER_S)
    assert body["error"]["code"] == "queue_full"
    assert health(server.url)["status"] == "ok"  # the server goes on answering
    gate.release()
    second.join(timeout=120)
    assert waiting and waiting[0][0] == 200  # the waiting one was served in its turn
    held.hang_up()
    wait_until(lambda: health(server.url)["slots"]["busy"] == 0, what="every slot to be free again")
