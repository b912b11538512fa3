"""The chat's reply takes the path a ``serve`` request takes (``test_slots_crossings``): the chat screen posts it to
its queue from the UI thread, and where the embedded engine's batch thread takes it, it waits for the runner,
fits the prompt to the context and generates, posting each event to the reply itself. Followed through the real
app and the real SmolLM2 engine, one reply crosses threads twice: from the UI thread to the batch thread, and
back. (Through a worker that waited and fitted before posting it crossed three times.)"""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from helpers_hops import Hops
from helpers_tui import ScreenHost
from waiting import wait_until

from clover_local import user_prefs
from clover_local.engine.embedded import EmbeddedEngine
from clover_local.engine.sequence import ActiveSequence
from clover_local.launch import LaunchRequest, decide_launch, open_launch
from clover_local.tui import context_fit
from clover_local.tui.reply_stream import ReplySink
from clover_local.tui.screens.chat import ChatScreen
from clover_local.tui.widgets.message_box import MessageBox


async def test_a_chat_reply_on_the_embedded_engine_crosses_threads_twice(
    smollm2_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = LaunchRequest(model=str(smollm2_path), ctx=512, engine="embedded", describe=False)
    engine = open_launch(decide_launch(request)).engine
    assert isinstance(engine, EmbeddedEngine) and engine.submit is not None
    hops = Hops()
    start, fit, post = engine.start_sequence, context_fit.fit, ReplySink.post

    def started(seq: ActiveSequence) -> bool:
        hops.here()
        return start(seq)

    def fitted(*args: Any, **kwargs: Any) -> context_fit.Fit:
        hops.here()
        return fit(*args, **kwargs)

    def posted(sink: ReplySink, item: object) -> None:
        hops.here()
        post(sink, item)

    engine.start_sequence = started  # type: ignore[method-assign]
    monkeypatch.setattr(context_fit, "fit", fitted)
    monkeypatch.setattr(ReplySink, "post", posted)
    settings = replace(user_prefs.ModelSettings(), max_tokens=8, temperature=0.0)
    app = ScreenHost(lambda: ChatScreen(engine, "smollm2", settings))
    try:
        async with app.run_test() as pilot:
            screen = app.screen
            assert isinstance(screen, ChatScreen)
            queue_post = screen.queue.post

            def queued(ticket: Any) -> None:
                hops.here()
                queue_post(ticket)

            screen.queue.post = queued  # type: ignore[method-assign]
            screen.query_one("#prompt", MessageBox).text = "The capital of France is"
            hops.here()  # where the person sends it
            await pilot.press("enter")
            await wait_until(lambda: screen.replies_done == 1, "the reply", pilot=pilot)
            hops.here()  # where the reply is read
            assert screen.history[-1].role == "assistant" and screen.history[-1].content
    finally:
        engine.close()
    names = [t.name for t in hops.threads]
    assert hops.crossings == 2, names
    assert set(names) == {threading.main_thread().name, "clover-batch"}, names
