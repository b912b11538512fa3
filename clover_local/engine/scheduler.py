"""Continuous batching for the embedded engine: one thread owns llama.cpp's context and, step after step, decodes
every active sequence's next token in one ``llama_decode`` (one batch row per sequence, each in its own slot),
each sequence then picking from its own row with its own sampler. A request that arrives takes a free slot (the
one holding its longest prefix) and joins between steps; it does not wait for the others to end. A sequence
alone in the batch steps alone, with speculation, as a one-slot engine would.

Callers (``serve``'s threads) get an ordinary event iterator: events go through a queue per sequence, and
closing the iterator (a client that left) aborts the sequence at the next step, which frees its slot.
"""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Iterator, Sequence
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
        self._waiting: deque[_Job] = deque()
        self._active: list[_Job] = []
        self._closed = False
        self._thread: threading.Thread | None = None
        self._uses = 0

    @property
    def active(self) -> int:
        """Sequences generating now."""
        return len(self._active)

    def run(self, seq: ActiveSequence) -> Iterator[GenerationEvent]:
        """Queue ``seq`` and yield its events as the batch produces them."""
        job = _Job(seq)
        with self._cond:
            if self._closed:
                raise EngineError("This engine was closed; load the model again.")
            self._waiting.append(job)
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
                while not self._waiting and not self._active and not self._closed:
                    self._cond.wait()
                if self._closed and not self._active and not self._waiting:
                    return
                joining = self._admit()
            try:
                for job in joining:
                    self._start(job)
                self._step()
            except BaseException as exc:  # never leave a caller waiting on a thread that died
                for job in [*joining, *self._active]:
                    self._fail(job, exc)
                self._active = []

    def _admit(self) -> list[_Job]:
        """Waiting sequences that get a free slot now, in arrival order (under the lock)."""
        busy = {j.seq.slot.seq for j in self._active if j.seq.slot is not None}
        free = [s for s in self._engine.slots_state if s.seq not in busy]
        joining: list[_Job] = []
        while self._waiting and free:
            job = self._waiting.popleft()
            slot = choose_slot(free, job.seq.prompt)
            free.remove(slot)
            self._uses += 1
            slot.last_used = self._uses
            job.seq.slot = slot
            joining.append(job)
        return joining

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
        job.released.set()
        job.out.put(_END)

    def _fail(self, job: _Job, exc: BaseException) -> None:
        if job in self._active:
            self._active.remove(job)
        job.released.set()
        job.out.put(exc)
