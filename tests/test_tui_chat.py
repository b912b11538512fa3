"""The chat screen with the real Gemma 3 270M engine: streaming, stop, queueing, history edits, save/load. The
tests that need a reply still going hold it (``GatedEngine``) and run at three speeds (``any_speed_engine``:
Gemma, an instant and a slow scripted engine)."""

from __future__ import annotations

import random
import stat
import threading
from collections.abc import Iterator

import pytest
from helpers_engine import EngineWrapper, GatedEngine, WithoutPromptCache
from helpers_tui import ScreenHost
from textual.widgets import Input, Markdown, Static
from waiting import wait_until

from clover_local import chat_store, conversations, user_prefs
from clover_local.engine.types import (
    ChatEngine,
    GenerationEvent,
    GenerationRequest,
    RunnerHealth,
    RunnerThreads,
)
from clover_local.presets import load_preset
from clover_local.tui.screens.chat import ChatScreen
from clover_local.tui.screens.chat_list import ChatList
from clover_local.tui.screens.modals import HelpScreen, SettingsScreen
from clover_local.tui.widgets.message_box import MessageBox
from clover_local.tui.widgets.messages import ReplyView

pytestmark = pytest.mark.slow

PROMPT = "Write a list of the planets of the solar system."
COUNTING = "Count from one to five hundred, one number per line."


def _settings(max_tokens: int = 24) -> user_prefs.ModelSettings:
    base = user_prefs.ModelSettings.from_preset(load_preset("gemma3-270m"))
    return user_prefs.ModelSettings(**{**base.__dict__, "max_tokens": max_tokens, "ctx": 1024})


def _host(engine: ChatEngine, max_tokens: int = 24) -> ScreenHost:
    return ScreenHost(lambda: ChatScreen(engine, "gemma3-270m", _settings(max_tokens)))


def _reply_done(screen: ChatScreen, n_messages: int) -> bool:
    return not screen.generating and len(screen.history) >= n_messages


async def _send(pilot, text: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.click("#prompt")
    pilot.app.screen.query_one("#prompt", MessageBox).text = text
    await pilot.press("enter")


async def test_reply_streams_into_markdown_and_status_shows_stats(any_speed_engine: ChatEngine) -> None:
    gate = GatedEngine(any_speed_engine)  # the reply waits after its first piece until released
    app = _host(gate)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, PROMPT)
        await wait_until(
            lambda: gate.held.is_set() and bool(screen.query(ReplyView)) and _shown(screen) == 1,
            "the reply's first piece on screen",
            pilot=pilot,
        )
        reply = screen.query(ReplyView).last()
        status = str(screen.query_one("#status", Static).render())
        assert screen.generating and status.startswith("generating"), "shown while the reply goes on"
        gate.release()
        await wait_until(lambda: _reply_done(screen, 2), "the reply", pilot=pilot)
        assert reply.deltas_shown > 1, "the reply arrived in more than one piece"
        answer = reply.query_one(".answer", Markdown).source
        assert answer.strip() and answer == reply.answer == screen.history[-1].content
        stats = screen.last_stats
        assert stats is not None and stats.completion_tokens > 0
        status = str(screen.query_one("#status", Static).render())
        assert f"tok/s {stats.decode_tokens_per_s:.1f}" in status
        assert f"ctx {stats.prompt_tokens + stats.completion_tokens}/{gate.n_ctx}" in status
        assert "TTFT" in status and "draft" in status and status.startswith("ready")


def _shown(screen: ChatScreen) -> int:
    return screen.query(ReplyView).last().deltas_shown


async def test_escape_stops_a_long_reply(any_speed_engine: ChatEngine) -> None:
    gate = GatedEngine(any_speed_engine)  # still going when Esc comes, however fast the machine
    app = _host(gate, max_tokens=900)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, COUNTING)
        await wait_until(
            lambda: gate.held.is_set() and bool(screen.query(ReplyView)) and _shown(screen) >= 1,
            "the first piece of the reply",
            pilot=pilot,
        )
        await pilot.press("escape")  # the cancel also lets the held reply go on, to its stop
        await wait_until(lambda: _reply_done(screen, 2), "the stop", pilot=pilot)
        assert screen.last_stats is not None and screen.last_stats.finish_reason == "cancelled"
        assert screen.last_stats.completion_tokens < 900
        assert screen.query(ReplyView).last().border_subtitle == "stopped"


async def test_input_stays_usable_while_streaming(any_speed_engine: ChatEngine) -> None:
    gate = GatedEngine(any_speed_engine)  # the first reply is held still going; the second is not
    app = _host(gate, max_tokens=200)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, COUNTING)
        await wait_until(
            lambda: gate.held.is_set() and screen._reply is not None and screen._reply.deltas_shown > 0,
            "the reply to stream",
            pilot=pilot,
        )
        await _send(pilot, "And the moons of Mars?")
        assert screen.query_one("#prompt", MessageBox).text == "", "typed and sent while the reply streams"
        assert screen.generating, "the second message waits for the first reply"
        assert [m.role for m in screen.history] == ["user"], "not sent yet: queued"
        gate.release()
        await wait_until(lambda: _reply_done(screen, 4), "both replies", pilot=pilot)
        assert [m.role for m in screen.history] == ["user", "assistant", "user", "assistant"]
        assert screen.history[2].content == "And the moons of Mars?"


class RequestsSeen(WithoutPromptCache):
    """Every prompt from scratch (the same seed then samples the same reply), and each request kept."""

    def __init__(self, inner: ChatEngine) -> None:
        super().__init__(inner)
        self.requests: list[GenerationRequest] = []

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        self.requests.append(request)
        return super().generate(request, cancel)


async def test_regenerate_writes_a_new_reply_with_the_presets_sampling_and_edit_last(
    gemma_engine: ChatEngine,
) -> None:
    preset = load_preset("gemma3-270m").sampling
    engine = RequestsSeen(gemma_engine)
    # Seeded: the chat's seeds, and so its replies, are the same on every run of the test.
    app = ScreenHost(lambda: ChatScreen(engine, "gemma3-270m", _settings(), seeds=random.Random(1)))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "Write a short poem about the sea.")
        await wait_until(lambda: _reply_done(screen, 2), "the reply", pilot=pilot)
        first = screen.history[-1].content
        await pilot.press("ctrl+r")
        await wait_until(lambda: screen.replies_done == 2, "the regenerated reply", pilot=pilot)
        assert len(screen.history) == 2 and len(screen.query(ReplyView)) == 1
        asked, again = engine.requests
        assert (asked.temperature, asked.top_k, asked.top_p) == (
            preset.temperature,
            preset.top_k,
            preset.top_p,
        )
        assert asked.temperature > 0 and asked.top_k != 1, "the preset samples: it is not greedy"
        assert again.seed is not None and again.seed != asked.seed, "Regenerate draws a new seed"
        assert again.messages == asked.messages and again.temperature == asked.temperature
        assert screen.history[-1].content != first, "a new reply, not the same one again"
        await pilot.press("ctrl+g")
        assert screen.history == [] and not screen.query(ReplyView)
        assert screen.query_one("#prompt", MessageBox).text == "Write a short poem about the sea."


async def test_conversation_is_kept_as_it_goes_exported_and_reopened(gemma_engine: ChatEngine) -> None:
    app = _host(gemma_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, PROMPT)
        await wait_until(lambda: _reply_done(screen, 2), "the reply", pilot=pilot)
        said = list(screen.history)
        await pilot.press("ctrl+y")
        assert app.clipboard == screen.query(ReplyView).last().answer
        screen.journal.flush()
        kept = chat_store.ChatStore().list()
        assert len(kept) == 1 and kept[0].n_messages == 2, "kept without Ctrl+S"
        assert chat_store.ChatStore().load(kept[0].id).messages == tuple(said)
        await pilot.press("ctrl+s")  # export
        saved = conversations.list_saved()
        assert len(saved) == 1 and conversations.load(saved[0].path).messages == tuple(said)
        markdown = saved[0].path.with_suffix(".md").read_text(encoding="utf-8")
        assert markdown.startswith("# ") and PROMPT in markdown and "## Model" in markdown
        for private in (saved[0].path, saved[0].path.with_suffix(".md")):  # a chat is personal
            assert stat.S_IMODE(private.stat().st_mode) == 0o600
        assert stat.S_IMODE(saved[0].path.parent.stat().st_mode) == 0o700
        await pilot.press("ctrl+n")
        assert screen.history == [] and not screen.query(ReplyView)
        await pilot.press("ctrl+o")
        await wait_until(
            lambda: isinstance(app.screen, ChatList) and app.screen.listings > 0, "the chat list", pilot=pilot
        )
        await pilot.press("enter")
        await wait_until(lambda: app.screen is screen, "back to the chat", pilot=pilot)
        await pilot.pause()
        assert screen.history == said
        assert screen.query(ReplyView).last().query_one(".answer", Markdown).source == said[-1].content


async def test_settings_are_saved_per_model_and_help_lists_keys(gemma_engine: ChatEngine) -> None:
    app = _host(gemma_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        await pilot.press("f2")
        await wait_until(lambda: isinstance(app.screen, SettingsScreen), "settings", pilot=pilot)
        app.screen.query_one("#set-temperature", Input).value = "0.4"
        app.screen.query_one("#set-top_k", Input).value = "seven"
        await pilot.click("#settings-save")
        assert "Top-k (0 = off): 'seven' is not a whole number" in str(
            app.screen.query_one("#settings-error", Static).render()
        )
        top_k = app.screen.query_one("#set-top_k", Input)
        top_k.value = "7"
        top_k.focus()
        await pilot.press("enter")
        await wait_until(lambda: app.screen is screen, "settings to close", pilot=pilot)
        saved = user_prefs.load_prefs().settings_for("gemma3-270m")
        assert (saved.temperature, saved.top_k) == (0.4, 7)
        assert isinstance(screen, ChatScreen) and screen.model_settings.top_k == 7
        app.push_screen(HelpScreen())
        await wait_until(lambda: isinstance(app.screen, HelpScreen), "help", pilot=pilot)
        await pilot.pause()
        keys = str(app.screen.query_one("#help-text", Static).render())
        assert "Ctrl+R" in keys and "F4  compare models" in keys, "every binding is in the footer or F1"
        await pilot.press("escape")
        await wait_until(lambda: app.screen is screen, "help to close", pilot=pilot)


class _Threads(EngineWrapper):
    """An engine whose runner says the threads a test sets (as a llama-server that follows the load does)."""

    def __init__(self, inner: ChatEngine) -> None:
        super().__init__(inner)
        self.runner = RunnerHealth()

    def health(self) -> RunnerHealth:
        return self.runner


async def test_the_status_line_says_when_another_program_slows_the_model(gemma_engine: ChatEngine) -> None:
    engine = _Threads(gemma_engine)
    app = _host(engine)
    async with app.run_test(size=(120, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)

        def status() -> str:
            return str(screen.query_one("#status", Static).render())

        engine.runner = RunnerHealth(threads=RunnerThreads(2, 2, relaunching=True))
        await wait_until(
            lambda: "restarting the model with other threads" in status(), "the relaunch", pilot=pilot
        )
        engine.runner = RunnerHealth(threads=RunnerThreads(1, 2, others_busy=1.0, relaunches=1))
        await wait_until(
            lambda: "another program is busy: 1 thread of 2" in status(), "fewer threads", pilot=pilot
        )
        engine.runner = RunnerHealth(threads=RunnerThreads(2, 2, relaunches=2))
        await wait_until(lambda: "another program" not in status(), "every thread again", pilot=pilot)
        assert status().startswith("ready · ")
