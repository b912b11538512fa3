"""A message typed while a reply streams is never lost when that reply is stopped (real Gemma 3 270M, and the
scripted engine at an instant and a slow speed)."""

from __future__ import annotations

import pytest
from helpers_engine import GatedEngine
from helpers_tui import ScreenHost
from waiting import wait_until

from clover_local import user_prefs
from clover_local.engine.types import ChatEngine
from clover_local.presets import load_preset
from clover_local.tui.screens.chat import ChatScreen
from clover_local.tui.widgets.message_box import MessageBox
from clover_local.tui.widgets.messages import ReplyView

pytestmark = pytest.mark.slow

COUNTING = "Count from one to five hundred, one number per line."
QUEUED = "And the moons of Mars?"


def _host(engine: ChatEngine) -> ScreenHost:
    base = user_prefs.ModelSettings.from_preset(load_preset("gemma3-270m"))
    settings = user_prefs.ModelSettings(**{**base.__dict__, "max_tokens": 900, "ctx": 1024})
    return ScreenHost(lambda: ChatScreen(engine, "gemma3-270m", settings))


async def test_stopping_a_reply_puts_the_queued_message_back_in_the_input(
    any_speed_engine: ChatEngine,
) -> None:
    # The first reply waits after its first piece for the stop: still streaming when Esc arrives however fast
    # the machine is (Gemma may also end a reply on its own). The second streams as it comes.
    gate = GatedEngine(any_speed_engine)
    app = _host(gate)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        prompt = screen.query_one("#prompt", MessageBox)
        await pilot.click("#prompt")
        prompt.text = COUNTING
        await pilot.press("enter")
        await wait_until(
            lambda: gate.held.is_set() and screen._reply is not None and screen._reply.deltas_shown > 0,
            "the first reply to stream",
            pilot=pilot,
        )
        prompt.text = QUEUED
        await pilot.press("enter")  # queued behind the streaming reply
        assert prompt.text == "" and screen.generating
        await pilot.press(*"also Venus")  # a third message, being typed
        await pilot.press("escape")
        await wait_until(lambda: not screen.generating, "the stop", pilot=pilot)

        assert screen.query(ReplyView).last().border_subtitle == "stopped"
        assert prompt.text == f"{QUEUED}\n\nalso Venus", (
            "the queued text and the typing are both kept, a paragraph each"
        )
        await pilot.pause()
        assert [m.role for m in screen.history] == ["user", "assistant"], "nothing was sent by itself"

        await pilot.press("enter")  # the person sends it when they want
        await wait_until(
            lambda: not screen.generating and len(screen.history) == 4, "the second reply", pilot=pilot
        )
        assert screen.history[2].content == f"{QUEUED}\n\nalso Venus"
