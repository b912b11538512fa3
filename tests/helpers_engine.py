"""Run one request on any engine (embedded or llama-server) and keep what tests look at."""

from __future__ import annotations

import threading

from clover_local.engine.types import ChatEngine, Finished, GenerationRequest, GenerationStats, TextDelta


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
