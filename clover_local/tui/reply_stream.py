"""One chat reply, from the engine to its :class:`~clover_local.tui.widgets.messages.ReplyView`: the prompt
checked against the context first (a full context is said, never an empty reply), then the engine's text
batched into a few updates a second. Runs on the chat's generation thread; it only posts messages."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace

from clover_local.engine.types import (
    ChatEngine,
    ChatMessage,
    Finished,
    GenerationRequest,
    GenerationStats,
    Refining,
    TextDelta,
)
from clover_local.errors import CloverError, ContextFull, RunnerUnavailable
from clover_local.tui import context_fit
from clover_local.tui.widgets.messages import ReplyView

POST_INTERVAL_S = 1 / 10
"""At most this often the generation thread hands new text to the screen (the first token goes at once). Ten
updates a second still reads as a stream; at twenty the rendering (which holds the GIL) slowed the engine's
loop to 0.95 of its headless rate on 2 cores, at ten it keeps up (0.99-1.00, ``benchmarks/bench_tui.py``)."""


def stream_reply(
    engine: ChatEngine,
    reply: ReplyView,
    request: GenerationRequest,
    system: Sequence[ChatMessage],
    turns: Sequence[ChatMessage],
    *,
    drop_oldest: bool,
    cancel: threading.Event,
    is_cancelled: Callable[[], bool],
    prefill_rate: float = 0.0,
) -> None:
    """Generate ``request``'s reply to ``system + turns`` into ``reply``; always ends with one ``Done``. With
    ``drop_oldest`` the oldest turns are left out until the prompt fits (``Dropped`` says how many)."""
    stats: GenerationStats | None = None
    error: str | None = None
    full = False
    pending: list[str] = []
    last_post = 0.0
    last_refine = 0.0
    try:
        wait_for_runner(engine, cancel, is_cancelled)
        fitted = context_fit.fit(engine, system, turns, request.max_tokens, drop=drop_oldest)
        if not fitted.fits:
            raise ContextFull(*full_context_words(fitted, len(turns), drop_oldest))
        if fitted.dropped:
            reply.post_message(ReplyView.Dropped(fitted.dropped))
        eta = fitted.prompt_tokens / prefill_rate if prefill_rate > 0 else None
        reply.post_message(ReplyView.Prompting(fitted.prompt_tokens, eta))
        request = replace(request, messages=(*system, *turns[fitted.dropped :]))
        for event in engine.generate(request, cancel):
            if is_cancelled():
                cancel.set()
            if isinstance(event, TextDelta):
                # Batch tokens into a few updates a second: every UI update holds the GIL the engine's
                # Python loop needs between tokens, so one message per token would slow generation.
                pending.append(event.text)
                now = time.perf_counter()
                if now - last_post >= POST_INTERVAL_S:
                    reply.post_message(ReplyView.Delta("".join(pending)))
                    pending.clear()
                    last_post = now
            elif isinstance(event, Refining):
                now = time.perf_counter()
                if now - last_refine >= POST_INTERVAL_S or event.masked == 0:
                    if pending:
                        reply.post_message(ReplyView.Delta("".join(pending)))
                        pending.clear()
                    reply.post_message(ReplyView.Refine(event.text, event.step, event.total_steps))
                    last_refine = now
            elif isinstance(event, Finished):
                stats = event.stats
        if stats is not None and stats.prompt_tokens == 0:
            # A stopped llama-server stream ends before its usage: the conversation still holds the prompt.
            stats = replace(stats, prompt_tokens=fitted.prompt_tokens)
    except CloverError as exc:
        error = str(exc)
        full = isinstance(exc, ContextFull)
    except Exception as exc:  # an engine bug must not take the whole app down mid-chat
        error = f"Generation failed: {type(exc).__name__}: {exc}"
    finally:
        if pending:
            reply.post_message(ReplyView.Delta("".join(pending)))
        reply.post_message(ReplyView.Done(stats, error, context_full=full))


LOAD_AGAIN = "Ctrl+L loads the model again; this conversation and your unsent text are kept"
"""The chat's one way out once its runner was given up (its notification, status line and failed replies)."""

RUNNER_WAIT_S = 900.0
"""Longest a message waits for a runner that is starting again (a large model on a slow disk loads for minutes)."""


def wait_for_runner(engine: ChatEngine, cancel: threading.Event, is_cancelled: Callable[[], bool]) -> None:
    """Hold a message sent while the engine's runner is starting again until it is ready (or the reply is
    stopped): the message is answered then, rather than refused. A runner that was given up raises at once,
    saying the chat's way out (the engine's own words are for ``serve``'s clients)."""
    deadline = time.monotonic() + RUNNER_WAIT_S
    while engine.health().state == "restarting" and time.monotonic() < deadline:
        if is_cancelled() or cancel.wait(0.2):
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
