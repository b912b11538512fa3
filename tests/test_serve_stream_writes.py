"""A streamed reply goes out in one write per wake-up of the event loop: every event the engine made since the loop
last looked (a verified draft's tokens, or what piled up while the loop was busy with other streams) is one
chunk on the socket, in order, with nothing lost and the stream's end after it. Driven at the ASGI level, so the
test sees each write the server makes, and with the loop held busy while the engine makes its events, so what
piles up does not depend on the machine's speed."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

from helpers_engine import COUNT_PIECES, EngineWrapper, ScriptedEngine

from clover_local.engine.types import GenerationEvent, GenerationRequest
from clover_local.serve.api import ApiConfig, create_app

HOLD_S = 30.0
"""Only so that a broken test fails instead of hanging; never an assumption about speed."""


class LoopHeldWhileMaking(EngineWrapper):
    """Makes every event of a reply while the server's event loop is held in a callback, as a loop busy with
    other streams would be: all of them are waiting when it looks again."""

    def __init__(self, inner: Any, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(inner)
        self.loop = loop
        self.posted = threading.Event()

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        held = threading.Event()

        def hold() -> None:
            held.set()
            self.posted.wait(HOLD_S)

        self.loop.call_soon_threadsafe(hold)
        assert held.wait(HOLD_S)
        try:
            yield from self.inner.generate(request, cancel)
        finally:  # resumed after the last event was handed on
            self.posted.set()


async def _post_stream(app: Any, body: dict[str, Any]) -> list[bytes]:
    """The body chunks the app sends for one streamed POST."""
    raw = json.dumps(body).encode()
    chunks: list[bytes] = []
    done = asyncio.Event()
    sent_request = False

    async def receive() -> dict[str, Any]:
        nonlocal sent_request
        if not sent_request:
            sent_request = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
        elif message["type"] == "http.response.body":
            if message.get("body"):
                chunks.append(message["body"])
            if not message.get("more_body", False):
                done.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "headers": [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8080),
    }
    await app(scope, receive, send)
    return chunks


def test_what_piled_up_goes_out_in_one_write_in_order() -> None:
    async def main() -> list[bytes]:
        engine = LoopHeldWhileMaking(ScriptedEngine(), asyncio.get_running_loop())
        app = create_app(engine, ApiConfig("m"))  # type: ignore[arg-type]
        body = {"model": "m", "messages": [{"role": "user", "content": "count"}], "stream": True}
        return await _post_stream(app, body)

    chunks = asyncio.run(main())
    events = [line[6:] for c in chunks for line in c.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert "".join(d for d in deltas if d) == "".join(COUNT_PIECES)  # every token, in order
    # One write for the stream's start, one for all forty tokens and the end that waited together.
    many = [c for c in chunks if c.count(b"data: ") > 1]
    assert len(many) == 1 and many[0].count(b"data: ") >= len(COUNT_PIECES) + 1
    assert len(chunks) <= 3
