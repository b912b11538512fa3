"""``serve.slots.SlotGate``: past N slots, waiting requests are admitted in arrival order (FIFO), a waiter that
leaves gives up its place without taking anyone's turn, and a new arrival never overtakes those already waiting.

Arrival order is made by events, never by time: each waiter is started only once the one before it is seen
waiting in the gate (``gate.waiting``), and admission order is what each waiter records when it gets its slot.
Through ``serve`` the same is checked on a stub engine whose first reply is held (any machine speed).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from helpers_engine import GatedEngine, ScriptedEngine
from helpers_serve import HeldStream, RecordingEngine, health, raw_post
from waiting import wait_until

from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer
from clover_local.serve.slots import SlotGate


def completion(word: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "prompt": word + " go", "max_tokens": max_tokens, "stream": stream}


async def _yield_until(predicate: Any, what: str) -> None:
    """Let the loop run until ``predicate()`` holds (each turn is one loop step, no clock)."""
    for _ in range(10_000):
        if predicate():
            return
        await asyncio.sleep(0)
    pytest.fail(f"gave up waiting for: {what}")


async def _admission_order(slots: int, arrivals: int, leaves: frozenset[int] = frozenset()) -> list[int]:
    """``slots`` holders take every slot; ``arrivals`` waiters queue one after another (waiter ``i`` only once
    ``i`` are waiting); those in ``leaves`` then give up their place; the holders hand their slots back one at a
    time and each admitted waiter hands its own back. Returns the waiters in the order they got a slot."""
    gate = SlotGate(slots, max_queue=arrivals)
    for _ in range(slots):
        await gate.acquire()
    admitted: list[int] = []

    async def wait_in_turn(i: int) -> None:
        await gate.acquire()
        admitted.append(i)
        gate.release()

    tasks: dict[int, asyncio.Task[None]] = {}
    for i in range(arrivals):
        tasks[i] = asyncio.create_task(wait_in_turn(i))
        await _yield_until(lambda n=i + 1: gate.waiting == n, f"waiter {i} to queue")
    for i in leaves:
        tasks[i].cancel()
    await _yield_until(lambda: gate.waiting == arrivals - len(leaves), "the leavers to give up their place")
    assert gate.busy == slots
    for _ in range(slots):
        gate.release()
    await asyncio.gather(*(t for i, t in tasks.items() if i not in leaves))
    assert gate.busy == 0 and gate.waiting == 0
    return admitted


@pytest.mark.parametrize("slots", [1, 2])
def test_waiting_requests_get_their_slot_in_arrival_order(slots: int) -> None:
    assert asyncio.run(_admission_order(slots, arrivals=6)) == [0, 1, 2, 3, 4, 5]


def test_a_waiter_that_leaves_gives_up_its_place_and_the_rest_keep_their_order() -> None:
    assert asyncio.run(_admission_order(1, arrivals=5, leaves=frozenset({0, 2}))) == [1, 3, 4]


def test_a_new_arrival_does_not_overtake_a_waiter_handed_a_slot() -> None:
    """A slot handed back passes straight to the first waiter: a request that arrives in that instant (before the
    waiter has run) waits behind it, and the slots are never over-counted."""

    async def scenario() -> list[str]:
        gate = SlotGate(1, max_queue=4)
        await gate.acquire()
        admitted: list[str] = []

        async def take(name: str) -> None:
            await gate.acquire()
            admitted.append(name)
            assert gate.busy == 1
            gate.release()

        first = asyncio.create_task(take("first"))
        await _yield_until(lambda: gate.waiting == 1, "the first waiter to queue")
        gate.release()  # handed to "first", which has not run yet
        assert gate.busy == 1  # the slot changed hands: it was never free
        await take("late")  # arrives in the same loop step, before "first" has run
        await first
        return admitted

    assert asyncio.run(scenario()) == ["first", "late"]


@pytest.fixture
def one_slot() -> Iterator[tuple[BackgroundServer, GatedEngine, ScriptedEngine]]:
    """One slot, room for three to wait, the first reply held after its first piece (any machine speed)."""
    scripted = ScriptedEngine()
    gate = GatedEngine(scripted, holds=1)
    with BackgroundServer(RecordingEngine(gate), ApiConfig("m", max_queue=3)) as server:
        yield server, gate, scripted


def test_through_serve_waiting_requests_are_served_in_arrival_order(
    one_slot: tuple[BackgroundServer, GatedEngine, ScriptedEngine],
) -> None:
    server, gate, scripted = one_slot
    held = HeldStream(server.url, completion("first", 20, stream=True))
    assert gate.held.wait(60)
    results: dict[str, int] = {}
    threads = []
    for n, word in enumerate(("second", "third", "fourth"), start=1):

        def ask(word: str = word) -> None:
            results[word] = raw_post(server.url, "/v1/completions", json.dumps(completion(word, 3)).encode())[
                0
            ]

        threads.append(threading.Thread(target=ask))
        threads[-1].start()

        def queued(n: int = n) -> bool:
            return bool(health(server.url)["queue"]["waiting"] == n)

        wait_until(queued, what=f"request {n + 1} to wait")
    gate.release()
    for t in threads:
        t.join(timeout=120)
    held.hang_up()
    assert results == {"second": 200, "third": 200, "fourth": 200}
    order = [(r.prompt or "").split()[0] for r in scripted.requests]
    assert order == ["first", "second", "third", "fourth"]
    wait_until(lambda: health(server.url)["slots"]["busy"] == 0, what="every slot to be free again")
