"""Continuous batching for the embedded engine: one thread owns llama.cpp's context and, step after step, decodes
every active sequence's next token in one ``llama_decode`` (one batch row per sequence, each in its own slot),
each sequence then picking from its own row with its own sampler. A request handed over takes a free slot (the
one holding its longest prefix) and joins between steps; it does not wait for the others to end. A sequence
alone in the batch steps alone, with speculation, as a one-slot engine would.

The scheduler keeps no queue: it runs what it is handed, and a request handed over while every slot is taken is
refused (:class:`~clover_local.errors.EngineError`). Admission, arrival order and waiting belong to the caller:
``serve``'s one queue (``serve.slots``) hands over at most as many requests as there are slots.

The batch thread prepares each :class:`Job`'s sequence, runs it and gives each event to the job's sink itself,
then :data:`~clover_local.engine.types.END` once its slot is free again: nothing relays it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from clover_local.engine.sequence import ActiveSequence, Slot, choose_slot
from clover_local.engine.types import END, Finished, GenerationRequest, Prepare, Sink
from clover_local.errors import EngineError


class SlotEngine(Protocol):
    """What the scheduler asks of its engine (``engine.embedded.EmbeddedEngine``, which imports this module: a
    Protocol, not an import, keeps the two out of an import cycle)."""

    @property
    def slots_state(self) -> list[Slot]: ...

    @property
    def n_ctx(self) -> int: ...

    def open_sequence(
        self, request: GenerationRequest, cancel: threading.Event | None, t0: float
    ) -> ActiveSequence: ...

    def start_sequence(self, seq: ActiveSequence) -> bool: ...

    def step_alone(self, seq: ActiveSequence) -> None: ...

    def step_batch(self, seqs: Sequence[ActiveSequence]) -> None: ...

    def finished(self, seq: ActiveSequence) -> Finished: ...


@dataclass(eq=False)
class Job:
    """One request handed to the batch: what to generate and where its items go."""

    request: GenerationRequest
    cancel: threading.Event | None
    sink: Sink
    abort: threading.Event = field(default_factory=threading.Event)
    """Set by a caller that stopped reading: the sequence stops at the next step."""
    t0: float = field(default_factory=time.perf_counter)
    """When it was handed over (its time to first token counts from here)."""
    seq: ActiveSequence | None = None
    released: bool = False
    prepare: Prepare | None = None
    """Run on the batch thread before its sequence opens (``engine.types.Prepare``)."""


class SlotScheduler:
    """Runs the sequences of an embedded engine on its one batch thread."""

    def __init__(self, engine: SlotEngine) -> None:
        self._engine = engine
        self._cond = threading.Condition()
        self._joining: deque[Job] = deque()
        """Jobs handed over that the batch thread has not started yet."""
        self._admitted = 0
        """Jobs handed over and not yet released (under the lock)."""
        self._active: dict[Job, ActiveSequence] = {}
        self._closed = False
        self._thread: threading.Thread | None = None
        self._uses = 0

    def submit(self, job: Job) -> None:
        """Hand ``job`` to the batch thread, which starts it between two steps (:class:`EngineError` at once when
        the engine was closed or every slot is taken)."""
        with self._cond:
            if self._closed:
                raise EngineError("This engine was closed; load the model again.")
            slots = len(self._engine.slots_state)
            if self._admitted >= slots:
                raise EngineError(
                    f"All {slots} slots of this engine are generating: it runs at most that many requests at "
                    "once and keeps no queue.",
                    "Wait for a reply to end before sending another (serve queues requests for its slots).",
                )
            self._admitted += 1
            self._joining.append(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="clover-batch", daemon=True)
                self._thread.start()
            self._cond.notify()

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
                    self._end(job, exc)

    def _start(self, job: Job) -> None:
        try:
            if job.prepare is not None:  # its time to first token counts from the request it returns
                job.request, job.t0 = job.prepare(job.request), time.perf_counter()
            seq = job.seq = self._engine.open_sequence(job.request, job.cancel, job.t0)
            seq.abort = job.abort
            self._take_slot(seq)
            if seq.cancelled or not self._engine.start_sequence(seq):
                seq.stop("cancelled")
        except BaseException as exc:
            self._end(job, exc)
            return
        self._active[job] = seq
        self._emit(job, seq)

    def _take_slot(self, seq: ActiveSequence) -> None:
        """The free slot holding the longest prefix of ``seq``'s prompt (one is: no more jobs are admitted than
        there are slots)."""
        taken = {s.slot.seq for s in self._active.values() if s.slot is not None}
        free = [s for s in self._engine.slots_state if s.seq not in taken]
        slot = choose_slot(free, seq.prompt)
        self._uses += 1
        slot.last_used = self._uses
        seq.slot = slot

    def _step(self) -> None:
        live: dict[Job, ActiveSequence] = {}
        for job, seq in list(self._active.items()):
            if not seq.done and seq.cancelled:
                seq.stop("cancelled")
            elif not seq.done and seq.slot is not None and len(seq.slot.kv) + 1 > self._engine.n_ctx:
                seq.stop("length")
            if seq.done:
                self._end(job)
            else:
                live[job] = seq
        self._active = live
        if not live:
            return
        try:
            if len(live) == 1:
                self._engine.step_alone(*live.values())
            else:
                self._engine.step_batch(list(live.values()))
        except BaseException as exc:
            for job in list(live):
                self._end(job, exc)
            return
        for job, seq in list(live.items()):
            self._emit(job, seq)

    def _emit(self, job: Job, seq: ActiveSequence) -> None:
        if not seq.done:
            for event in seq.emit(seq.new):
                job.sink(event)
        if seq.done:
            self._end(job)

    def _end(self, job: Job, error: BaseException | None = None) -> None:
        """Give the job its last items (its tail and result, or ``error``), free its slot and sampler, then
        :data:`END`. Once: a failed step ends a job that was both joining and active twice, and by then its slot
        may be another's."""
        if job.released:
            return
        self._active.pop(job, None)
        seq = job.seq
        if error is None and seq is not None:
            try:
                for event in seq.tail():
                    job.sink(event)
                job.sink(self._engine.finished(seq))
            except BaseException as exc:
                error = exc
        job.released = True
        with self._cond:
            self._admitted -= 1
        if seq is not None:
            seq.picker.close()
        if error is not None:
            job.sink(error)
        job.sink(END)
