"""One admission path: ``serve``'s queue hands a request on the embedded engine straight to the engine's batch
thread, which posts each event to the request's reply itself. Followed through the real SmolLM2 engine, one
request crosses threads twice: from the event loop to the batch thread, and back. (Through a slot worker that
read the batch's events and posted them again it crossed four times.)"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers_hops import Hops

from clover_local.engine.embedded import EmbeddedEngine
from clover_local.engine.sequence import ActiveSequence
from clover_local.engine.types import END, Finished, GenerationRequest, TextDelta
from clover_local.launch import LaunchRequest, decide_launch, open_launch
from clover_local.serve.slots import Reply, SlotQueue, Ticket


class SeenReply(Reply):
    def __init__(self, loop: asyncio.AbstractEventLoop, hops: Hops) -> None:
        super().__init__(loop)
        self.hops = hops

    def post(self, item: Any) -> None:
        self.hops.here()
        super().post(item)


async def _one_request(engine: EmbeddedEngine, hops: Hops) -> list[Any]:
    queue = SlotQueue(engine, engine.slots, max_queue=4)
    request = GenerationRequest(prompt="The capital of France is", max_tokens=8, temperature=0.0)
    ticket = Ticket(request, SeenReply(asyncio.get_running_loop(), hops))
    hops.here()
    queue.post(ticket)
    items: list[Any] = []
    while not items or items[-1] is not END:
        items += await ticket.reply.take()
    hops.here()  # where its reply is read (every batch of items, the last included)
    queue.close()
    return items


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_request_on_the_embedded_engine_crosses_threads_twice(smollm2_path: Path, parallel: int) -> None:
    request = LaunchRequest(
        model=str(smollm2_path), ctx=512, parallel=parallel, engine="embedded", describe=False
    )
    engine = open_launch(decide_launch(request)).engine
    assert isinstance(engine, EmbeddedEngine) and engine.slots == parallel
    hops = Hops()
    start = engine.start_sequence

    def started(seq: ActiveSequence) -> bool:
        hops.here()
        return start(seq)

    engine.start_sequence = started  # type: ignore[method-assign]
    try:
        items = asyncio.run(_one_request(engine, hops))
    finally:
        engine.close()
    assert any(isinstance(item, TextDelta) for item in items) and isinstance(items[-2], Finished)
    assert hops.crossings == 2, [t.name for t in hops.threads]
    assert {t.name for t in hops.threads} == {threading.main_thread().name, "clover-batch"}
