"""One chat reply, from the engine to its :class:`~clover_local.tui.widgets.messages.ReplyView`: posted to the
chat's queue (``serve.slots.SlotQueue``, the one ``serve`` uses) as a ticket whose prompt is checked against the
context (a full context is said, never an empty reply) where the engine takes it, on the thread that then
generates it and hands each event to a :class:`ReplySink`, which batches the text into a few updates a second. A
reply crosses from the UI thread to the engine's and back, no more, and the UI thread never waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from clover_local.engine.types import (
    END,
    ChatEngine,
    ChatMessage,
    Finished,
    GenerationRequest,
    GenerationStats,
    Refining,
    TextDelta,
)
from clover_local.errors import CloverError, ContextFull, RunnerUnavailable
from clover_local.serve.slots import SlotQueue, Ticket
from clover_local.tui import context_fit
from clover_local.tui.widgets.messages import ReplyView

POST_INTERVAL_S = 1 / 10
"""At most this often the generation thread hands new text to the screen (the first token goes at once). Ten
updates a second still reads as a stream; at twenty the rendering (which holds the GIL) slowed the engine's
loop to 0.95 of its headless rate on 2 cores, at ten it keeps up (0.99-1.00, ``benchmarks/bench_tui.py``)."""


def post_reply(
    queue: SlotQueue,
    reply: ReplyView,
    request: GenerationRequest,
    system: Sequence[ChatMessage],
    turns: Sequence[ChatMessage],
    *,
    drop_oldest: bool,
    cancel: threading.Event,
    prefill_rate: float = 0.0,
) -> None:
    """Post ``request``'s reply to ``system + turns`` to ``queue``, streaming into ``reply``, which always gets
    one ``Done``. With ``drop_oldest`` the oldest turns are left out until the prompt fits (``Dropped`` says
    how many)."""
    sink = ReplySink(reply)

    def prepare(request: GenerationRequest) -> GenerationRequest:
        """Where the engine takes the ticket (the fit may ask a llama-server, whose runner may be starting)."""
        wait_for_runner(queue.engine, cancel)
        fitted = context_fit.fit(queue.engine, system, turns, request.max_tokens, drop=drop_oldest)
        if not fitted.fits:
            raise ContextFull(*full_context_words(fitted, len(turns), drop_oldest))
        if fitted.dropped:
            reply.post_message(ReplyView.Dropped(fitted.dropped))
        eta = fitted.prompt_tokens / prefill_rate if prefill_rate > 0 else None
        reply.post_message(ReplyView.Prompting(fitted.prompt_tokens, eta))
        sink.prompt_tokens = fitted.prompt_tokens
        return replace(request, messages=(*system, *turns[fitted.dropped :]))

    post_ticket(queue, Ticket(request, sink, cancel, prepare))


def post_ticket(queue: SlotQueue, ticket: Ticket) -> None:
    """``ticket`` to ``queue``; one it refuses ends at once with the refusal."""
    try:
        queue.post(ticket)
    except Exception as exc:
        ticket.reply.post(exc)
        ticket.reply.post(END)


@dataclass
class ReplySink:
    """A reply's items, posted as :class:`ReplyView` messages from the engine's thread: text batched into a few
    updates a second (every UI update holds the GIL the engine's Python loop needs between tokens, so one
    message per token would slow generation), then one ``Done`` at :data:`END`."""

    reply: ReplyView
    prompt_tokens: int = 0
    stats: GenerationStats | None = None
    error: BaseException | None = None
    pending: list[str] = field(default_factory=list)
    last_post: float = 0.0
    last_refine: float = 0.0

    def post(self, item: object) -> None:
        now = time.perf_counter()
        if isinstance(item, TextDelta):
            self.pending.append(item.text)
            if now - self.last_post >= POST_INTERVAL_S:
                self._flush()
                self.last_post = now
        elif isinstance(item, Refining) and (now - self.last_refine >= POST_INTERVAL_S or item.masked == 0):
            self._flush()
            self.reply.post_message(ReplyView.Refine(item.text, item.step, item.total_steps))
            self.last_refine = now
        elif isinstance(item, Finished):
            self.stats = item.stats
        elif isinstance(item, BaseException):
            self.error = item
        elif item is END:
            self._flush()
            stats, error = self.stats, self.error
            if stats is not None and stats.prompt_tokens == 0:
                # A stopped llama-server stream ends before its usage: the conversation still holds the prompt.
                stats = replace(stats, prompt_tokens=self.prompt_tokens)
            words = str(error) if isinstance(error, CloverError) else None
            if error is not None and words is None:  # an engine bug must not take the whole app down mid-chat
                words = f"Generation failed: {type(error).__name__}: {error}"
            self.reply.post_message(ReplyView.Done(stats, words, context_full=isinstance(error, ContextFull)))

    def _flush(self) -> None:
        if self.pending:
            self.reply.post_message(ReplyView.Delta("".join(self.pending)))
            self.pending.clear()


LOAD_AGAIN = "Ctrl+L loads the model again; this conversation and your unsent text are kept"
"""The chat's one way out once its runner was given up (its notification, status line and failed replies)."""

RUNNER_WAIT_S = 900.0
"""Longest a message waits for a runner that is starting again (a large model on a slow disk loads for minutes)."""


def wait_for_runner(engine: ChatEngine, cancel: threading.Event) -> None:
    """Hold a message sent while the engine's runner is starting again until it is ready (or the reply is
    stopped): the message is answered then, rather than refused. A runner that was given up raises at once,
    saying the chat's way out (the engine's own words are for ``serve``'s clients)."""
    deadline = time.monotonic() + RUNNER_WAIT_S
    while engine.health().state == "restarting" and time.monotonic() < deadline:
        if cancel.wait(0.2):
            return
    health = engine.health()
    if health.state in ("failed", "stopped"):
        raise RunnerUnavailable(f"The model's runner is not running: {health.why}.", f"{LOAD_AGAIN}.")


def full_context_words(fitted: context_fit.Fit, n_turns: int, dropped_oldest: bool) -> tuple[str, str]:
    """What a full context is, and what to do, in words."""
    need = fitted.prompt_tokens + fitted.reply_room
    what = (
        f"The context is full: this conversation is {fitted.prompt_tokens} tokens and a reply needs "
        f"{fitted.reply_room} more; the model's context holds {fitted.n_ctx} ({need - fitted.n_ctx} too many)."
    )
    if dropped_oldest or n_turns <= 1:
        return (
            what.replace("this conversation is", "this message alone is"),
            "Shorten the message, or load the model with a larger context (F2, then restart it).",
        )
    return what, "Leave out the oldest turns, or start a new chat carrying a summary (asked now)."
