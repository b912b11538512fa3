"""The chat around a runner that stops (issue 49), with a stand-in runner whose state and death the test sets, so
every interleaving is forced, never raced: a message is always answered, queued or given back (beside what is
being written, never instead of it); once the runner is given up there is one way out, Ctrl+L, which keeps the
conversation and the unsent text; the status line's context is the chat's on screen (Ctrl+N, a reopened chat);
"starting it again" goes once the runner is back."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from helpers_engine import ScriptedEngine
from helpers_tui import ScreenHost
from textual.widgets import Static
from waiting import wait_until

from clover_local import user_prefs
from clover_local.engine.types import GenerationEvent, GenerationRequest, RunnerHealth
from clover_local.errors import RunnerDied
from clover_local.tui.screens.chat import ChatScreen
from clover_local.tui.services import LoadAgain
from clover_local.tui.widgets.message_box import MessageBox
from clover_local.tui.widgets.messages import UserMessage


class StandInRunner(ScriptedEngine):
    """A supervised engine whose state the test sets; with ``dying`` set, the next reply waits at ``gate``
    (``held`` says it does) and then dies as a killed llama-server's does."""

    def __init__(self) -> None:
        super().__init__(pieces=("fine.",))
        self.state = RunnerHealth()
        self.dying = 0
        self.held = threading.Event()
        self.gate = threading.Event()

    def health(self) -> RunnerHealth:
        return self.state

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        if self.dying:
            self.dying -= 1
            self.held.set()
            self.gate.wait(60)
            raise RunnerDied("llama-server stopped (exit code -9) while answering this request")
        yield from super().generate(request, cancel)


def _host(engine: StandInRunner) -> tuple[ScreenHost, list[object]]:
    results: list[object] = []
    return ScreenHost(
        lambda: ChatScreen(engine, "scripted", user_prefs.ModelSettings()), results.append
    ), results


def _status(screen: ChatScreen) -> str:
    return str(screen.query_one("#status", Static).render())


async def _type(pilot, text: str, *, send: bool = True) -> None:  # type: ignore[no-untyped-def]
    box = pilot.app.screen.query_one("#prompt", MessageBox)
    box.focus()
    box.text = text
    if send:
        await pilot.press("enter")


async def test_a_failed_turn_is_given_back_beside_what_is_being_written() -> None:
    engine = StandInRunner()
    app, _ = _host(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        engine.dying = 1
        await _type(pilot, "first")
        await wait_until(engine.held.is_set, "the reply under way", pilot=pilot)
        await _type(pilot, "written meanwhile", send=False)
        engine.gate.set()
        await wait_until(lambda: not screen.generating, "the reply to fail", pilot=pilot)
        box = screen.query_one("#prompt", MessageBox)
        assert box.text == "first\n\nwritten meanwhile", "the failed message is back, and nothing was wiped"
        assert screen.query(UserMessage).last().has_class("-failed")


async def test_queued_behind_a_dying_reply_a_message_is_sent_and_if_it_fails_given_back_too() -> None:
    """The CI case: A's runner dies mid-reply while B waits in the queue; B is sent as the runner restarts and
    fails as well. Both end in the box: A was given back when B was sent, so B's failure met a box with text,
    and was dropped (marked "back in the message box" but not there)."""
    engine = StandInRunner()
    app, _ = _host(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        engine.dying = 2
        await _type(pilot, "message A")
        await wait_until(engine.held.is_set, "A's reply under way", pilot=pilot)
        await _type(pilot, "message B")
        assert screen._pending == ["message B"], "queued"
        engine.gate.set()
        await wait_until(
            lambda: screen.failed_turns == 2 and not screen.generating, "both to fail", pilot=pilot
        )
        box = screen.query_one("#prompt", MessageBox)
        assert "message A" in box.text and "message B" in box.text, box.text
        assert not screen.history and not screen._pending
        await _type(pilot, "message C")  # the runner answers again: a new message is answered
        await wait_until(lambda: len(screen.history) == 2, "C answered", pilot=pilot)
        shown = [w.text for w in screen.query(UserMessage)]
        assert shown[-1] == "message C", "in the transcript, in view"


async def test_given_up_the_chat_offers_one_way_out_that_keeps_everything() -> None:
    engine = StandInRunner()
    app, results = _host(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _type(pilot, "hello")
        await wait_until(lambda: len(screen.history) == 2, "the first turn", pilot=pilot)
        engine.state = RunnerHealth("failed", "llama-server stopped 4 times within 300 s", 0)
        await wait_until(lambda: "Ctrl+L loads it again" in _status(screen), "the status line", pilot=pilot)
        await _type(pilot, "are you there?")
        await wait_until(lambda: screen.failed_turns == 1, "the refused turn", pilot=pilot)
        error = " ".join(str(w.render()) for w in screen.query(".error"))
        assert "Ctrl+L loads the model again" in error and "doctor" not in error, error
        box = screen.query_one("#prompt", MessageBox)
        assert box.text == "are you there?"
        await pilot.press("ctrl+l")
        await wait_until(lambda: bool(results), "the chat to hand back", pilot=pilot)
    (again,) = results
    assert isinstance(again, LoadAgain) and again.draft == "are you there?" and again.chat_id is not None

    carried = ScreenHost(
        lambda: ChatScreen(StandInRunner(), "scripted", user_prefs.ModelSettings(), carried=again)
    )
    async with carried.run_test(size=(100, 30)) as pilot:
        screen = carried.screen
        assert isinstance(screen, ChatScreen)
        await wait_until(lambda: len(screen.history) == 2, "the conversation carried on", pilot=pilot)
        assert screen.history[0].content == "hello"
        await wait_until(
            lambda: screen.query_one("#prompt", MessageBox).text == "are you there?", "the draft", pilot=pilot
        )
        await wait_until(lambda: "ctx -/" not in _status(screen), "its context counted", pilot=pilot)


async def test_the_status_line_counts_the_chat_on_screen_and_the_restart_notice_goes() -> None:
    engine = StandInRunner()
    app, _ = _host(engine)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _type(pilot, "one two three")
        await wait_until(lambda: len(screen.history) == 2, "the first turn", pilot=pilot)
        assert "ctx -/" not in _status(screen)
        await pilot.press("ctrl+n")
        await wait_until(lambda: not screen.history, "a new chat", pilot=pilot)
        assert "ctx -/" in _status(screen), "the last chat's context is not this one's"

        engine.state = RunnerHealth("restarting", "llama-server stopped (exit code -9); starting it again", 0)
        await wait_until(
            lambda: any("starting it again" in n.message for n in app._notifications),
            "the notice",
            pilot=pilot,
        )
        engine.state = RunnerHealth("ready", "started again", 1)
        await wait_until(lambda: screen.runner.state == "ready", "the runner back", pilot=pilot)
        assert not any("starting it again" in n.message for n in app._notifications)
