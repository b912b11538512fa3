"""One generation inside the embedded engine: the slot (llama.cpp sequence) it decodes in, and everything that
is its own: sampler and grammar (``TokenPicker``), stop strings, drafter, counters, cancel. The engine decodes
one sequence alone (with speculation) or several in one batch; either way each picks from its own row of logits
and emits through :meth:`ActiveSequence.emit`, so a reply holds only its own tokens."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from clover_local.engine.drafter import DraftController, Drafter
from clover_local.engine.sampling import TokenPicker
from clover_local.engine.textstream import StopTextStream
from clover_local.engine.types import FinishReason, GenerationEvent, GenerationRequest, TextDelta


@dataclass
class Slot:
    """One sequence of llama.cpp's memory (``seq_id``) and the tokens its KV cache holds, in order: what the
    next request on this slot can reuse as a prefix."""

    seq: int
    kv: list[int] = field(default_factory=list)
    last_used: int = 0
    """When a request last took this slot (a counter): the least recently used one is given up first."""


def common_prefix(a: Sequence[object], b: Sequence[object]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


SIMILARITY = 0.1
"""A slot's cache counts as this prompt's when it holds at least this share of it as a prefix (llama-server's
``--slot-prompt-similarity``): a shared chat-template opening alone does not claim another agent's slot."""


def choose_slot(free: list[Slot], prompt: list[int]) -> Slot:
    """The free slot whose cache holds the longest prefix of ``prompt`` (an agent's next turn goes back to its
    own slot, as llama-server's slot similarity does); else, and among equals, the least recently used."""

    def key(slot: Slot) -> tuple[int, int]:
        common = common_prefix(slot.kv, prompt)
        return (common if common >= SIMILARITY * len(prompt) else 0, -slot.last_used)

    return max(free, key=key)


class ActiveSequence:
    """A request being generated: :meth:`emit` turns picked tokens into text events and says when it is done."""

    def __init__(
        self,
        request: GenerationRequest,
        prompt: list[int],
        max_new: int,
        picker: TokenPicker,
        cancel: threading.Event | None,
        t0: float,
        *,
        is_eog: Callable[[int], bool],
        piece: Callable[[int], bytes],
        controller: DraftController,
        drafter: Drafter | None,
    ) -> None:
        self.request = request
        self.prompt = prompt
        self.max_new = max_new
        self.picker = picker
        self.cancel = cancel
        self.t0 = t0
        self.t_prefill = t0
        self.n_cached = 0
        self.slot: Slot | None = None
        self.stream = StopTextStream(request.stop)
        self.n_out = 0
        self.t_first: float | None = None
        self.finish: FinishReason = "length"
        self.controller = controller
        self.drafter = drafter
        self.mtp: Any = None
        """The engine's MTP head when this sequence drafts with it (alone on a one-slot engine)."""
        self.abort = threading.Event()
        """Set by the engine when the caller stopped reading (the generator was closed)."""
        self.new: list[int] = []
        """Tokens picked by the last step, not yet emitted (the last of them is decoded by the next step)."""
        self.done = False
        self._is_eog = is_eog
        self._piece = piece

    @property
    def cancelled(self) -> bool:
        return self.abort.is_set() or (self.cancel is not None and self.cancel.is_set())

    def emit(self, tokens: list[int]) -> Iterator[GenerationEvent]:
        """Text for ``tokens`` in order, stopping at an end of generation, a stop string, ``max_new`` or a
        cancel (``done`` is then set and ``finish`` says why)."""
        for tok in tokens:
            if self.t_first is None:
                self.t_first = time.perf_counter()
            if self._is_eog(tok):
                self.stop("stop")
                return
            self.n_out += 1
            text = self.stream.push(self._piece(tok))
            if text:
                yield TextDelta(text)
            if self.stream.stopped:
                self.stop("stop")
            elif self.n_out >= self.max_new:
                self.stop("length")
            elif self.cancel is not None and self.cancel.is_set():
                self.stop("cancelled")
            if self.done:
                return

    def tail(self) -> Iterator[GenerationEvent]:
        """Text held back for stop strings, once the sequence is done."""
        text = self.stream.flush()
        if text:
            yield TextDelta(text)

    def stop(self, finish: FinishReason) -> None:
        """End the sequence between steps (a full context, a cancel seen before a step)."""
        self.finish, self.done = finish, True
