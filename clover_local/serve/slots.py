"""The one queue that owns the engine's slots (as llama.cpp's ``server_queue`` owns its server's), for ``serve`` and
the chat: every request is posted to it as a :class:`Ticket`; at most ``slots`` run at once, the rest wait in
arrival order, and at most ``max_queue`` may wait; past that a request is refused at once (:class:`QueueFull`, a
503 with ``Retry-After``) rather than held open while memory and sockets pile up.

Whoever finds a slot free (the poster, or the thread whose generation just ended) hands the oldest ticket to the
engine's ``submit``: the embedded engine's batch thread runs it and posts its events to the ticket's reply
itself, so a request crosses to that thread and back, no more. An engine without a thread of its own
(llama-server's: one HTTP stream per request) gets one worker per slot instead, started with the first request
and kept; no thread is started per request. A ticket that leaves while it waits gives up its place
(:meth:`SlotQueue.leave`); one that leaves while it runs is cancelled, and its slot goes to the next only at its
:data:`END`, so a cancelled generation never overlaps the next in its slot. The engine keeps no queue of its own.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

from clover_local.engine.types import END, ChatEngine, GenerationRequest, Prepare, Sink, Submit
from clover_local.serve.api_errors import ApiError

RETRY_AFTER_S = 2
"""What a refused client is told to wait before trying again (``Retry-After``)."""
QUEUE_PER_SLOT = 4
"""Requests that may wait for each slot when ``--max-queue`` is not given."""

STARTED = object()
"""Posted to a :class:`Reply` when the ticket's generation is handed to the engine (its time limit starts then)."""

log = logging.getLogger("clover_local.serve")


class QueueFull(ApiError):
    """Every slot is busy and the queue is full."""

    def __init__(self, slots: int, waiting: int) -> None:
        super().__init__(
            503,
            f"The server is busy: all {slots} slots are generating and {waiting} requests are already waiting "
            f"(the limit). Retry in {RETRY_AFTER_S} s, or serve with more --parallel or --max-queue.",
            code="queue_full",
            type="server_error",
        )


def retry_headers(error: ApiError) -> dict[str, str]:
    """``Retry-After`` for a refusal that waiting cures (a full queue, a runner starting again); none for the
    others."""
    if isinstance(error, QueueFull):
        return {"Retry-After": str(RETRY_AFTER_S)}
    if error.retry_after_s is not None:
        return {"Retry-After": str(max(1, math.ceil(error.retry_after_s)))}
    return {}


class Reply:
    """``serve``'s side of one request: items posted from the engine's thread, handed to the event loop in
    batches. The loop is woken once per batch rather than once per token: each wake-up is a syscall and a
    hand-over of the GIL that the decoding thread then waits for (a verified draft yields up to 17 tokens)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: list[Any] = []
        self._guard = threading.Lock()
        self._ready = asyncio.Event()

    def post(self, item: Any) -> None:
        """From any thread."""
        with self._guard:
            self._items.append(item)
            wake = len(self._items) == 1
        if wake:
            self.loop.call_soon_threadsafe(self._ready.set)

    async def take(self) -> list[Any]:
        """On the loop: every item posted since the last take, waiting for at least one."""
        while True:
            with self._guard:
                items, self._items = self._items, []
                if not items:
                    self._ready.clear()  # a post after this sees an empty list and sets it again
            if items:
                return items
            await self._ready.wait()


class Postbox(Protocol):
    """Where a ticket's items go: ``serve``'s :class:`Reply`, the chat's ``tui.reply_stream.ReplySink``."""

    def post(self, item: object) -> None: ...


@dataclass(eq=False)
class Ticket:
    """One request in the queue: what to generate, its cancel event (a client that left, the time limit, Esc in
    the chat) and where its items go (:data:`STARTED`, each event, an exception, then :data:`END`)."""

    request: GenerationRequest
    reply: Postbox
    cancel: threading.Event = field(default_factory=threading.Event)
    prepare: Prepare | None = None
    """Run where the engine takes the ticket, before it generates (the chat's runner wait and context fit)."""


class SlotQueue:
    """``slots`` generations at once, taken in arrival order (FIFO) from one bounded queue."""

    def __init__(self, engine: ChatEngine, slots: int, max_queue: int) -> None:
        self.engine = engine
        self.slots = max(1, slots)
        self.max_queue = max(0, max_queue)
        self.busy = 0
        """Tickets handed to the engine and not yet ended."""
        self._waiting: deque[Ticket] = deque()
        self._cond = threading.Condition()
        self._submit: Submit = engine.submit or self._to_worker
        self._handed: deque[tuple[GenerationRequest, threading.Event, Sink, Prepare | None]] = deque()
        """For the slot workers (at most one for each free worker)."""
        self._workers: list[threading.Thread] = []
        self._closed = False

    @property
    def waiting(self) -> int:
        """Requests waiting for a slot."""
        with self._cond:
            return len(self._waiting)

    def check(self) -> None:
        """Refuse now (before a reply starts) when a new request could not even wait."""
        with self._cond:
            self._refuse_when_full()

    def post(self, ticket: Ticket) -> None:
        """Queue ``ticket`` behind those already waiting (:class:`QueueFull` when it could not wait), and hand it
        over at once when a slot is free."""
        with self._cond:
            self._refuse_when_full()
            self._waiting.append(ticket)
            if self.busy >= self.slots:
                log.info(
                    "all %d slots busy: a request waits (%d before it)", self.slots, len(self._waiting) - 1
                )
            self._hand_over()

    def leave(self, ticket: Ticket) -> None:
        """The request is gone (its client hung up, or it ended): stop its generation, or give up its place in
        the queue, which then goes to the next in line."""
        ticket.cancel.set()
        with self._cond:
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return  # the engine has it (or had it): its generation ends at the cancel
        ticket.reply.post(END)

    def close(self) -> None:
        """Let the slot workers end (the server is stopping)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _refuse_when_full(self) -> None:
        if len(self._waiting) >= self.max_queue and self.busy >= self.slots:
            log.warning(
                "queue full (%d slots busy, %d waiting): a request got 503", self.slots, self.max_queue
            )
            raise QueueFull(self.slots, len(self._waiting))

    def _hand_over(self) -> None:
        """Hand the oldest waiting tickets to the engine while slots are free (under the lock, so in order)."""
        while self.busy < self.slots and self._waiting:
            ticket = self._waiting.popleft()
            if ticket.cancel.is_set():  # it left just as it was taken
                ticket.reply.post(END)
                continue
            self.busy += 1
            log.info("slots: %d of %d busy, %d waiting", self.busy, self.slots, len(self._waiting))
            ticket.reply.post(STARTED)
            try:
                self._submit(ticket.request, ticket.cancel, self._sink(ticket), ticket.prepare)
            except BaseException as exc:  # handed to the request, whose API answers it
                self.busy -= 1
                ticket.reply.post(exc)
                ticket.reply.post(END)

    def _sink(self, ticket: Ticket) -> Sink:
        """Where the engine's thread puts the ticket's items; its last frees the slot for the next ticket."""
        post = ticket.reply.post

        def sink(item: object) -> None:
            post(item)
            if item is END:
                with self._cond:
                    self.busy -= 1
                    self._hand_over()

        return sink

    def _to_worker(
        self, request: GenerationRequest, cancel: threading.Event, sink: Sink, prepare: Prepare | None
    ) -> None:
        """``submit`` for an engine that generates on its caller's thread: a free slot worker runs it."""
        if not self._workers:
            for i in range(self.slots):
                worker = threading.Thread(target=self._work, name=f"clover-slot-{i}", daemon=True)
                worker.start()
                self._workers.append(worker)
        self._handed.append((request, cancel, sink, prepare))
        self._cond.notify()

    def _work(self) -> None:
        """One slot worker: run what is handed over to its end, then the next."""
        while True:
            with self._cond:
                while not self._handed and not self._closed:
                    self._cond.wait()
                if not self._handed:
                    return
                request, cancel, sink, prepare = self._handed.popleft()
            try:
                if prepare is not None:
                    request = prepare(request)
                for event in self.engine.generate(request, cancel):
                    sink(event)
            except BaseException as exc:  # handed to the request, whose API answers it
                sink(exc)
            finally:
                sink(END)
