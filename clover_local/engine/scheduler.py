"""Continuous batching for the embedded engine: one thread owns llama.cpp's context and, step after step, decodes
every active sequence's next token in one ``llama_decode`` (one batch row per sequence, each in its own slot),
each sequence then picking from its own row with its own sampler. A request handed over takes a free slot (the
one holding its longest prefix) and joins between steps; it does not wait for the others to end. A sequence
alone in the batch steps alone, with speculation, as a one-slot engine would.

The scheduler keeps no queue: it runs what it is handed, and a request handed over while every slot is taken is
refused (:class:`~clover_local.errors.EngineError`). Admission, arrival order and waiting belong to the caller:
``serve``'s one queue (``serve.slots``) hands over at most as many requests as there are slots.

Callers (``serve``'s slot workers) get an ordinary event iterator: events go through a queue per sequence, and
closing the iterator (a client that left) aborts the sequence at the next step, which frees its slot.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from clover_local.engine.sequence import ActiveSequence, Slot, choose_slot
from clover_local.engine.types import Finished, GenerationEvent
from clover_local.errors import EngineError

_END = object()


class SlotEngine(Protocol):
    """What the scheduler asks of its engine (``engine.embedded.EmbeddedEngine``, which imports this module)."""

    @property
    def slots_state(self) -> list[Slot]: ...

    @property
    def n_ctx(self) -> int: ...

    def start_sequence(self, seq: ActiveSequence) -> bool: ...

    def step_alone(self, seq: ActiveSequence) -> None: ...

    def step_batch(self, seqs: Sequence[ActiveSequence]) -> None: ...

    def finished(self, seq: ActiveSequence) -> Finished: ...


@dataclass
class _Job:
    seq: ActiveSequence
    out: queue.SimpleQueue[Any] = field(default_factory=queue.SimpleQueue)
    released: threading.Event = field(default_factory=threading.Event)
    """Set once the scheduler no longer touches the sequence (its sampler may then be freed)."""


class SlotScheduler:
    """Runs the sequences of an engine with several slots (``llama_n_seq_max > 1``)."""

    def __init__(self, engine: SlotEngine) -> None:
        self._engine = engine
        self._cond = threading.Condition()
        self._joining: deque[_Job] = deque()
        """Sequences handed over, each with its slot, that the batch thread has not started yet."""
        self._taken: set[int] = set()
        """The slots (sequence ids) of the sequences handed over and not yet released (under the lock)."""
        self._active: list[_Job] = []
        self._closed = False
        self._thread: threading.Thread | None = None
        self._uses = 0

    @property
    def active(self) -> int:
        """Sequences generating now."""
        return len(self._active)

    def run(self, seq: ActiveSequence) -> Generator[GenerationEvent, None, None]:
        """Give ``seq`` a free slot, join it to the batch and yield its events as the batch produces them."""
        job = _Job(seq)
        with self._cond:
            if self._closed:
                raise EngineError("This engine was closed; load the model again.")
            self._take_slot(seq)
            self._joining.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="clover-batch", daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            while True:
                item = job.out.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            seq.abort.set()  # a no-op when it ended; else it ends at the next step
            with self._cond:
                self._cond.notify()
            job.released.wait()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30.0)

    # --- the batch thread ---------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._joining and not self._active and not self._closed:
                    self._cond.wait()
                if self._closed and not self._active and not self._joining:
                    return
                joining = list(self._joining)
                self._joining.clear()
            try:
                for job in joining:
                    self._start(job)
                self._step()
            except BaseException as exc:  # never leave a caller waiting on a thread that died
                for job in [*joining, *self._active]:
                    self._fail(job, exc)
                self._active = []

    def _take_slot(self, seq: ActiveSequence) -> None:
        """The free slot holding the longest prefix of ``seq``'s prompt (under the lock)."""
        slots = self._engine.slots_state
        free = [s for s in slots if s.seq not in self._taken]
        if not free:
            raise EngineError(
                f"All {len(slots)} slots of this engine are generating: it runs at most that many requests at "
                "once and keeps no queue.",
                "Wait for a reply to end before sending another (serve queues requests for its slots).",
            )
        slot = choose_slot(free, seq.prompt)
        self._taken.add(slot.seq)
        self._uses += 1
        slot.last_used = self._uses
        seq.slot = slot

    def _release(self, job: _Job) -> None:
        """The scheduler no longer touches ``job``'s sequence: its slot is free for the next one handed over (once:
        a failed step fails a job that was both joining and active twice, and by then its slot may be another's)."""
        with self._cond:
            if job.released.is_set():
                return
            if job.seq.slot is not None:
                self._taken.discard(job.seq.slot.seq)
            job.released.set()

    def _start(self, job: _Job) -> None:
        seq = job.seq
        try:
            if seq.cancelled or not self._engine.start_sequence(seq):
                seq.stop("cancelled")
        except BaseException as exc:
            self._fail(job, exc)
            return
        self._active.append(job)
        self._emit(job)

    def _step(self) -> None:
        live: list[_Job] = []
        for job in list(self._active):
            seq = job.seq
            if not seq.done and seq.cancelled:
                seq.stop("cancelled")
            elif not seq.done and seq.slot is not None and len(seq.slot.kv) + 1 > self._engine.n_ctx:
                seq.stop("length")
            if seq.done:
                self._finish(job)
            else:
                live.append(job)
        self._active = live
        if not live:
            return
        try:
            if len(live) == 1:
                self._engine.step_alone(live[0].seq)
            else:
                self._engine.step_batch([j.seq for j in live])
        except BaseException as exc:
            for job in live:
                self._fail(job, exc)
            self._active = []
            return
        for job in list(live):
            self._emit(job)

    def _emit(self, job: _Job) -> None:
        seq = job.seq
        if not seq.done:
            for event in seq.emit(seq.new):
                job.out.put(event)
        if seq.done:
            self._finish(job)

    def _finish(self, job: _Job) -> None:
        if job.released.is_set():
            return
        seq = job.seq
        for event in seq.tail():
            job.out.put(event)
        job.out.put(self._engine.finished(seq))
        if job in self._active:
            self._active.remove(job)
        self._release(job)
        job.out.put(_END)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        if job in self._active:
            self._active.remove(job)
        self._release(job)
        job.out.put(exc)
