"""``serve.slots.SlotQueue``, the one queue that owns the slots: past N slots, waiting requests are started in
arrival order (FIFO), a waiter that leaves gives up its place without taking anyone's turn, a request that hangs
up while it runs hands its slot to the next in line, past ``max_queue`` waiting a request is refused
(:class:`QueueFull`), and every generation runs on one of N slot workers, never on a thread of its own.

Order is made by events, never by time: each request is posted only once the one before it is in the queue, and
start order is what the engine records when each generation starts (each waits for the test to release it).
Through ``serve`` the same is checked on a stub engine whose first reply is held (any machine speed).
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from helpers_engine import HOLD_LIMIT_S, GatedEngine, ScriptedEngine
from helpers_serve import HeldStream, RecordingEngine, health, raw_post
from waiting import wait_until

from clover_local.engine.types import (
    ChatMessage,
    Finished,
    GenerationEvent,
    GenerationRequest,
    GenerationStats,
    RunnerHealth,
    TextDelta,
    ToolFormat,
)
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer
from clover_local.serve.slots import END, QueueFull, Reply, SlotQueue, Ticket


def completion(word: str, max_tokens: int, *, stream: bool = False) -> dict[str, Any]:
    return {"model": "m", "prompt": word + " go", "max_tokens": max_tokens, "stream": stream}


class HeldTurns:
    """A ``ChatEngine`` whose every generation records its prompt (and its thread) when it starts, then waits
    until the test releases that prompt or the request is cancelled."""

    n_ctx = 1024
    tool_format: ToolFormat = "hermes"
    model_name = "held turns"
    submit = None

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.started: list[str] = []
        self.threads: set[int] = set()
        self._release: dict[str, threading.Event] = {}
        self._lock = threading.Lock()

    def release(self, name: str) -> None:
        self._gate(name).set()

    def _gate(self, name: str) -> threading.Event:
        with self._lock:
            return self._release.setdefault(name, threading.Event())

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def check_request(self, request: GenerationRequest) -> None:
        """Nothing is refused up front."""

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str | None:
        return None

    def health(self) -> RunnerHealth:
        return RunnerHealth()  # in this process: always ready

    def close(self) -> None:
        pass

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        name = request.prompt or ""
        with self._lock:
            self.started.append(name)
            self.threads.add(threading.get_ident())
        gate = self._gate(name)
        for _ in range(int(HOLD_LIMIT_S / 0.01)):  # only so that a broken test ends
            if gate.is_set() or (cancel is not None and cancel.is_set()):
                break
            gate.wait(0.01)
        yield TextDelta(name)
        yield Finished(GenerationStats(1, 1, 0, 0.0, 0.0, 0.0, None))


async def _until(predicate: Any, what: str) -> None:
    """Let the loop run until ``predicate()`` holds (the workers are threads: the loop sleeps between looks)."""
    for _ in range(int(240 / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    pytest.fail(f"gave up waiting for: {what}")


async def _drain(ticket: Ticket) -> list[Any]:
    """Every item of the ticket's reply up to its end."""
    items: list[Any] = []
    while not items or items[-1] is not END:
        items += await ticket.reply.take()
    return items


def _ticket(name: str) -> Ticket:
    return Ticket(GenerationRequest(prompt=name), Reply(asyncio.get_running_loop()))


async def _start_order(slots: int, arrivals: int, leaves: frozenset[int] = frozenset()) -> list[str]:
    """``slots`` holders take every slot; ``arrivals`` waiters are posted one after another; those in ``leaves``
    then leave; one slot is freed at a time. Returns the waiters in the order they started."""
    engine = HeldTurns(slots)
    queue = SlotQueue(engine, slots, max_queue=arrivals)
    holders = [_ticket(f"holder{i}") for i in range(slots)]
    for ticket in holders:
        queue.post(ticket)
    await _until(lambda: len(engine.started) == slots, "the holders to start")
    waiters = [_ticket(str(i)) for i in range(arrivals)]
    for i, ticket in enumerate(waiters):
        queue.post(ticket)
        assert queue.waiting == i + 1
    for i in leaves:
        queue.leave(waiters[i])
        assert await _drain(waiters[i]) == [END]  # it ends at once, never started
    assert queue.waiting == arrivals - len(leaves) and queue.busy == slots
    # One slot freed at a time (the holders, then each waiter once it has started): each goes to the oldest waiter.
    running = [f"holder{i}" for i in range(slots)]
    for n in range(arrivals - len(leaves)):
        engine.release(running.pop(0))
        await _until(lambda n=n: len(engine.started) == slots + n + 1, "a waiter to get the freed slot")
        running.append(engine.started[-1])
    for name in running:
        engine.release(name)
    for ticket in [*holders, *(w for i, w in enumerate(waiters) if i not in leaves)]:
        await _drain(ticket)
    await _until(lambda: queue.busy == 0, "every slot to be free again")
    assert queue.waiting == 0
    assert len(engine.threads) <= slots  # every generation ran on one of the slot workers
    queue.close()
    return [name for name in engine.started if not name.startswith("holder")]


@pytest.mark.parametrize("slots", [1, 2])
def test_waiting_requests_get_their_slot_in_arrival_order(slots: int) -> None:
    assert asyncio.run(_start_order(slots, arrivals=6)) == ["0", "1", "2", "3", "4", "5"]


def test_a_waiter_that_leaves_gives_up_its_place_and_the_rest_keep_their_order() -> None:
    assert asyncio.run(_start_order(1, arrivals=5, leaves=frozenset({0, 2}))) == ["1", "3", "4"]


def test_a_request_that_hangs_up_while_it_runs_hands_its_slot_to_the_next() -> None:
    """The holder is never released: only its leaving (a client that hung up) frees the slot."""

    async def scenario() -> list[str]:
        engine = HeldTurns(1)
        queue = SlotQueue(engine, 1, max_queue=2)
        holder, first, second = _ticket("holder"), _ticket("first"), _ticket("second")
        queue.post(holder)
        await _until(lambda: engine.started == ["holder"], "the holder to start")
        queue.post(first)
        queue.post(second)
        queue.leave(holder)
        await _drain(holder)
        await _until(lambda: engine.started[-1:] == ["first"], "the first waiter to get the slot")
        assert queue.waiting == 1
        engine.release("first")
        engine.release("second")
        await _drain(first)
        await _drain(second)
        queue.close()
        return engine.started

    assert asyncio.run(scenario()) == ["holder", "first", "second"]


def test_past_the_queue_limit_a_request_is_refused_and_a_place_given_up_is_taken_again() -> None:
    async def scenario() -> None:
        engine = HeldTurns(1)
        queue = SlotQueue(engine, 1, max_queue=2)
        tickets = [_ticket(name) for name in ("holder", "a", "b")]
        for ticket in tickets:
            queue.post(ticket)
        with pytest.raises(QueueFull):
            queue.check()
        with pytest.raises(QueueFull):
            queue.post(_ticket("c"))
        queue.leave(tickets[1])
        late = _ticket("late")
        queue.post(late)  # the place "a" gave up
        for name in ("holder", "b", "late"):
            engine.release(name)
        for ticket in (tickets[0], tickets[2], late):
            await _drain(ticket)
        queue.close()
        assert engine.started == ["holder", "b", "late"]

    asyncio.run(scenario())


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


class ThreadsSeen(RecordingEngine):
    """A scripted engine with two slots, remembering the thread each generation ran on."""

    def __init__(self) -> None:
        super().__init__(ScriptedEngine())
        self.names: list[str] = []

    @property
    def slots(self) -> int:
        return 2

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        self.names.append(threading.current_thread().name)
        return super().generate(request, cancel)


def test_serve_starts_no_thread_per_request() -> None:
    """Eight requests one after another, then eight at once: every generation runs on one of the two slot workers,
    and the process has no more threads of serve's own after the sixteenth request than after the first."""
    engine = ThreadsSeen()

    def ask(word: str) -> None:
        status, _ = raw_post(server.url, "/v1/completions", json.dumps(completion(word, 3)).encode())
        assert status == 200

    before = set(threading.enumerate())  # the threads themselves: a new thread may reuse an ended one's ident

    def serve_threads() -> list[str]:
        """The threads started since this test began, by name."""
        return sorted(
            t.name for t in threading.enumerate() if t not in before and t.name.startswith("clover")
        )

    with BackgroundServer(engine, ApiConfig("m", max_queue=8)) as server:
        ask("warm")
        after_one = serve_threads()
        for n in range(8):
            ask(f"one{n}")
        at_once = [threading.Thread(target=ask, args=(f"many{n}",)) for n in range(8)]
        for t in at_once:
            t.start()
        for t in at_once:
            t.join(timeout=120)
        assert len(engine.finished) == 17
        assert serve_threads() == after_one == ["clover-api", "clover-slot-0", "clover-slot-1"]
    assert set(engine.names) <= {"clover-slot-0", "clover-slot-1"}


def test_through_serve_a_request_that_hangs_up_while_waiting_gives_its_place_to_the_next(
    one_slot: tuple[BackgroundServer, GatedEngine, ScriptedEngine],
) -> None:
    server, gate, scripted = one_slot
    held = HeldStream(server.url, completion("first", 20, stream=True))
    assert gate.held.wait(60)
    host, port = server.url.removeprefix("http://").split(":")
    leaver = http.client.HTTPConnection(host, int(port), timeout=60)
    body = json.dumps(completion("leaver", 3))
    leaver.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    wait_until(lambda: health(server.url)["queue"]["waiting"] == 1, what="the leaver to wait")
    statuses: list[int] = []
    third = threading.Thread(
        target=lambda: statuses.append(
            raw_post(server.url, "/v1/completions", json.dumps(completion("third", 3)).encode())[0]
        )
    )
    third.start()
    wait_until(
        lambda: health(server.url)["queue"]["waiting"] == 2, what="the third request to wait behind it"
    )
    leaver.close()  # hangs up while it waits
    wait_until(lambda: health(server.url)["queue"]["waiting"] == 1, what="the leaver to give up its place")
    gate.release()
    third.join(timeout=120)
    held.hang_up()
    assert statuses == [200]
    assert [(r.prompt or "").split()[0] for r in scripted.requests] == [
        "first",
        "third",
    ]  # the leaver never ran
    wait_until(lambda: health(server.url)["slots"]["busy"] == 0, what="every slot to be free again")
