"""Run one request on any engine (embedded or llama-server) and keep what tests look at; hold a reply still
going (:class:`GatedEngine`); answer at any speed (:class:`ScriptedEngine`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace

from clover_local.engine.toolcalls import ToolFormat
from clover_local.engine.types import (
    ChatEngine,
    ChatMessage,
    Finished,
    FinishReason,
    GenerationEvent,
    GenerationRequest,
    GenerationStats,
    RunnerHealth,
    TextDelta,
)


def generate_text(
    engine: ChatEngine, request: GenerationRequest, cancel: threading.Event | None = None
) -> tuple[str, GenerationStats]:
    """The reply's text and its stats; exactly one ``Finished`` event, and it comes last."""
    parts: list[str] = []
    finished: list[Finished] = []
    for event in engine.generate(request, cancel):
        assert not finished, f"{event!r} after Finished"
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, Finished):
            finished.append(event)
    assert len(finished) == 1
    return "".join(parts), finished[0].stats


HOLD_LIMIT_S = 120.0
"""How long a :class:`GatedEngine` holds a reply that nobody releases or cancels: only so that a broken test
fails (the reply then runs to its end, and the test's assertion about it says what went wrong) well within the
per-test time limit. Never an assumption about speed."""


class EngineWrapper:
    """An engine passed through; subclasses change ``generate``."""

    submit = None
    """A wrapper changes ``generate``: ``serve`` runs it on a slot worker, even around the embedded engine."""

    def __init__(self, inner: ChatEngine) -> None:
        self.inner = inner

    @property
    def model_name(self) -> str:
        return self.inner.model_name

    @property
    def n_ctx(self) -> int:
        return self.inner.n_ctx

    @property
    def tool_format(self) -> ToolFormat:
        return self.inner.tool_format

    @property
    def slots(self) -> int:
        return self.inner.slots

    def check_request(self, request: GenerationRequest) -> None:
        self.inner.check_request(request)

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str | None:
        return self.inner.render_prompt(messages)

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def close(self) -> None:
        self.inner.close()

    def health(self) -> RunnerHealth:
        """The inner engine's runner (a wrapped llama-server engine is still supervised)."""
        return self.inner.health()

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        return self.inner.generate(request, cancel)


class WithoutPromptCache(EngineWrapper):
    """Every prompt evaluated from scratch (``cache_prompt=False``): the same request then runs the same
    computation, so a greedy reply comes out the same again on any CPU. (With a cached prefix, the rest of the
    prompt is evaluated in other batches, whose logits are not bit-identical on every CPU: a near-tie can
    flip.)"""

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        return self.inner.generate(replace(request, cache_prompt=False), cancel)


class GatedEngine(EngineWrapper):
    """Any engine, with its reply held *still going* where a test needs it to be, however fast the machine.

    The first ``holds`` replies stop after their ``after``-th piece of text (the piece is handed on first) and
    wait until the test calls :meth:`release` or the request is cancelled (Esc, a client that hangs up); then
    they go on as the engine makes them. ``held`` is set once a reply waits at the gate. Later replies pass
    straight through. :meth:`arm` sets the gate again for the next replies (a module-scoped server's engine).
    """

    def __init__(self, inner: ChatEngine, *, holds: int = 1, after: int = 1) -> None:
        super().__init__(inner)
        self.held = threading.Event()
        self._release = threading.Event()
        self._holds = holds
        self._after = after

    def arm(self, *, holds: int = 1, after: int = 1) -> None:
        """Hold the next ``holds`` replies after their ``after``-th piece of text."""
        self.held.clear()
        self._release.clear()
        self._holds, self._after = holds, after

    def release(self) -> None:
        """Let the held reply (and any later one that reaches the gate) go on."""
        self._release.set()

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        hold = self._holds > 0
        if hold:
            self._holds -= 1
        pieces = 0
        for event in self.inner.generate(request, cancel):
            yield event
            if hold and isinstance(event, TextDelta):
                pieces += 1
                if pieces == self._after:
                    self._wait(cancel)

    def _wait(self, cancel: threading.Event | None) -> None:
        self.held.set()
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not self._release.is_set() and not (cancel is not None and cancel.is_set()):
            if time.monotonic() > deadline:
                return  # nobody released it: the reply ends on its own, and the test sees that it did
            self._release.wait(0.01)


SLOW_TOKEN_S = 0.05
"""The scripted "slow machine" engine's time per token (20 tokens/s: slower than the chat's screen updates)."""

COUNT_PIECES = tuple(f"{n}\n" for n in range(1, 41))


class ScriptedEngine:
    """A ``ChatEngine`` stub for the tests whose outcome must not depend on the machine's speed: every reply is
    the same pieces of text (one piece per token), either all at once (``delay_s=0``: a machine far faster
    than any real one) or with ``delay_s`` between pieces (a slow or loaded one). It honours ``max_tokens``
    and ``cancel`` (checked before each piece, as the embedded engine checks after each token). The real
    model runs in the same tests too; this only stretches the speeds they are checked at."""

    n_ctx = 1024
    tool_format: ToolFormat = "hermes"
    slots = 1
    submit = None

    def __init__(self, delay_s: float = 0.0, pieces: tuple[str, ...] = COUNT_PIECES) -> None:
        self.delay_s = delay_s
        self.pieces = pieces
        self.model_name = (
            "scripted (instant)" if delay_s == 0 else f"scripted ({delay_s * 1000:.0f} ms a token)"
        )
        self.requests: list[GenerationRequest] = []

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def check_request(self, request: GenerationRequest) -> None:
        """Nothing is refused up front."""

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str | None:
        return None  # counted message by message

    def health(self) -> RunnerHealth:
        return RunnerHealth()  # in this process: always ready

    def close(self) -> None:
        pass

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        self.requests.append(request)
        t0 = time.perf_counter()
        prompt = request.prompt or "\n".join(m.content for m in request.messages or ())
        finish: FinishReason = "stop"
        n_out = 0
        t_first: float | None = None
        for piece in self.pieces:
            if n_out >= request.max_tokens:
                finish = "length"
                break
            if cancel is not None and cancel.is_set():
                finish = "cancelled"
                break
            if self.delay_s and cancel is not None:
                cancel.wait(self.delay_s)
            elif self.delay_s:
                time.sleep(self.delay_s)
            if t_first is None:
                t_first = time.perf_counter()
            n_out += 1
            yield TextDelta(piece)
        t_end = time.perf_counter()
        t_first = t_first if t_first is not None else t_end
        yield Finished(
            GenerationStats(
                prompt_tokens=self.count_tokens(prompt),
                completion_tokens=n_out,
                cached_tokens=0,
                ttft_s=t_first - t0,
                prefill_tokens_per_s=0.0,
                decode_tokens_per_s=(n_out - 1) / (t_end - t_first) if n_out > 1 and t_end > t_first else 0.0,
                draft_acceptance=None,
                finish_reason=finish,
            )
        )
