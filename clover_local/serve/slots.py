"""Slots in front of the engine: at most ``slots`` generations run at once, the rest wait in arrival order, and
at most ``max_queue`` may wait; past that a request is refused at once (:class:`QueueFull`, a 503 with
``Retry-After``) rather than held open while memory and sockets pile up."""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque

from clover_local.serve.api_errors import ApiError

RETRY_AFTER_S = 2
"""What a refused client is told to wait before trying again (``Retry-After``)."""
QUEUE_PER_SLOT = 4
"""Requests that may wait for each slot when ``--max-queue`` is not given."""


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


class SlotGate:
    """N slots handed out in arrival order (FIFO), with a bounded queue. Lives on the event loop."""

    def __init__(self, slots: int, max_queue: int) -> None:
        self.slots = max(1, slots)
        self.max_queue = max(0, max_queue)
        self.busy = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    def check(self) -> None:
        """Refuse now (before a reply starts) when a new request could not even wait."""
        if self.busy >= self.slots and self.waiting >= self.max_queue:
            logging.getLogger("clover_local.serve").warning(
                "queue full (%d slots busy, %d waiting): a request got 503", self.slots, self.waiting
            )
            raise QueueFull(self.slots, self.waiting)

    async def acquire(self) -> None:
        """A slot: at once when one is free and nobody waits before us, else in turn."""
        if self.busy < self.slots and not self.waiting:
            self.busy += 1
            return
        self.check()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as the client left: pass it on
            raise
        finally:
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def release(self) -> None:
        """Hand the slot to the first live waiter, or free it."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands: busy stays the same
                return
        self.busy -= 1
