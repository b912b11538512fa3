"""The chat people expect from a terminal (issue 32), with the real Gemma 3 270M and SmolLM2 engines: pastes and
multi-line messages arrive whole, a full context is said and the next message is answered, chats are kept as
they go (listed, renamed, deleted, searched, there again after Ctrl+Q), Ctrl+C stops a reply, slash commands,
PageUp from the message box, and an offline first run that reaches a chat with the demo model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers_engine import GatedEngine
from helpers_runner import BUILT, RUNTIMES
from helpers_tui import ScreenHost
from textual import events
from textual.containers import VerticalScroll
from textual.widgets import Input, OptionList, Static
from waiting import wait_until

from clover_local import chat_store, conversations, user_prefs
from clover_local.detect import parse_simulate
from clover_local.engine.types import ChatEngine, ChatMessage
from clover_local.presets import load_preset
from clover_local.testing.models import tiny_model
from clover_local.tui import services
from clover_local.tui.app import CloverApp, StartOptions
from clover_local.tui.screens.chat import ChatScreen
from clover_local.tui.screens.chat_list import ChatList
from clover_local.tui.screens.launch import LaunchScreen
from clover_local.tui.screens.modals import ContextFullScreen, HelpScreen
from clover_local.tui.screens.plan import PlanScreen
from clover_local.tui.widgets.message_box import MessageBox
from clover_local.tui.widgets.messages import ReplyView, UserMessage

pytestmark = pytest.mark.slow


def _settings(max_tokens: int = 16) -> user_prefs.ModelSettings:
    """Gemma's settings, greedy (asked for: the preset samples): the summaries and answers read here come out
    the same on every run."""
    base = user_prefs.ModelSettings.from_preset(load_preset("gemma3-270m"))
    return user_prefs.ModelSettings(
        **{**base.__dict__, "max_tokens": max_tokens, "ctx": 1024, "temperature": 0.0}
    )


def _host(engine: ChatEngine, max_tokens: int = 16) -> ScreenHost:
    return ScreenHost(lambda: ChatScreen(engine, "gemma3-270m", _settings(max_tokens)))


def _box(pilot) -> MessageBox:  # type: ignore[no-untyped-def]
    chat = next(s for s in pilot.app.screen_stack if isinstance(s, ChatScreen))
    return chat.query_one("#prompt", MessageBox)


async def _send(pilot, text: str) -> None:  # type: ignore[no-untyped-def]
    _box(pilot).text = text
    _box(pilot).focus()
    await pilot.press("enter")


def _words(n: int, word: str = "river") -> str:
    return " ".join([word] * n)


async def test_a_paste_keeps_every_line_and_ctrl_j_starts_a_new_one(gemma_engine: ChatEngine) -> None:
    app = _host(gemma_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        box = _box(pilot)
        box.focus()
        app.post_message(
            events.Paste("first line of paste\nsecond line\nthird line")
        )  # as the terminal sends it
        await wait_until(lambda: box.text.count("\n") == 2, "the paste in the box", pilot=pilot)
        await pilot.press("ctrl+j", *"four")
        assert box.text == "first line of paste\nsecond line\nthird line\nfour"
        await pilot.press("enter")
        await wait_until(lambda: screen.replies_done == 1, "the reply", pilot=pilot)
        assert screen.history[0] == ChatMessage("user", "first line of paste\nsecond line\nthird line\nfour")
        shown = str(screen.query(UserMessage).first().render())
        assert "second line" in shown and "four" in shown
        assert box.text == "" and screen.history[1].role == "assistant"

        long = "\n".join(f"line {i}" for i in range(40))
        app.post_message(events.Paste(long))
        await wait_until(lambda: box.text == long, "the long paste", pilot=pilot)
        assert "pasted 40 lines" in str(box.border_subtitle)
        await pilot.press("enter")
        await wait_until(lambda: screen.replies_done == 2, "the second reply", pilot=pilot)
        assert screen.history[2].content == long, "sent whole"
        folded = screen.query(UserMessage).last()
        assert (
            folded.folded
            and "[pasted 40 lines" in str(folded.render())
            and "line 39" not in str(folded.render())
        )
        await pilot.click(folded)
        assert "line 39" in str(folded.render()), "a click unfolds it"


async def test_a_full_context_is_said_and_the_next_message_is_answered(gemma_engine: ChatEngine) -> None:
    # Gemma loaded with a 1024-token context: one 600-word message fits, two do not.
    app = _host(gemma_engine, max_tokens=12)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "Summarize: " + _words(600))
        await wait_until(lambda: screen.replies_done == 1, "the first reply", pilot=pilot)
        assert [m.role for m in screen.history] == ["user", "assistant"]

        second = "And this one: " + _words(600, "stone")
        await _send(pilot, second)
        await wait_until(lambda: screen.replies_done == 2, "the refusal", pilot=pilot)
        failed = screen.query(ReplyView).last()
        error = str(failed.query_one(".error", Static).render())
        assert "The context is full" in error and "1024" in error, "said, never an empty reply"
        assert failed.border_subtitle == "failed"
        assert screen.query(UserMessage).last().has_class("-failed")
        assert [m.role for m in screen.history] == ["user", "assistant"], "the failed turn left no trace"
        assert _box(pilot).text == second, "the message is back in the box"
        await wait_until(lambda: isinstance(app.screen, ContextFullScreen), "the choices", pilot=pilot)

        await pilot.press("escape")  # keep the message; a short one is answered, the history unpoisoned
        await wait_until(lambda: app.screen is screen, "back to the chat", pilot=pilot)
        await _send(pilot, "Thanks. Name one colour.")
        await wait_until(lambda: screen.replies_done == 3, "the next reply", pilot=pilot)
        assert [m.role for m in screen.history] == ["user", "assistant", "user", "assistant"]
        assert screen.history[-1].content.strip(), "answered"

        await _send(pilot, second)  # full again: this time leave out the oldest turns, and remember that
        await wait_until(lambda: isinstance(app.screen, ContextFullScreen), "the choices again", pilot=pilot)
        app.screen.query_one("#full-remember").value = True  # type: ignore[attr-defined]
        await pilot.press("d")
        await wait_until(lambda: screen.replies_done == 5, "the reply without the oldest turns", pilot=pilot)
        assert screen.history[-2].content == second and screen.history[-1].role == "assistant"
        assert screen.context_from == 2 and screen.query(UserMessage).first().has_class("-dropped")
        assert user_prefs.load_prefs().context_overflow == "drop"
        screen.journal.flush()
        kept = chat_store.ChatStore().load(chat_store.ChatStore().list()[0].id)
        assert len(kept.messages) == 6, "what was left out of the context is still in the chat"


@pytest.mark.parametrize("remembered", ["drop", "summary"])
async def test_a_remembered_choice_for_a_full_context_is_taken_without_asking(
    gemma_engine: ChatEngine, remembered: str
) -> None:
    from dataclasses import replace

    user_prefs.save_prefs(replace(user_prefs.load_prefs(), context_overflow=remembered))
    app = _host(gemma_engine, max_tokens=12)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "Remember these words: " + _words(600))
        await wait_until(lambda: screen.replies_done == 1, "the first reply", pilot=pilot)
        second = "And these: " + _words(600, "stone")
        await _send(pilot, second)
        if remembered == "drop":
            await wait_until(
                lambda: screen.replies_done == 2, "the reply without the oldest turn", pilot=pilot
            )
            assert screen.context_from == 2 and screen.history[-2].content == second
            assert screen.failed_turns == 0
        else:
            await wait_until(
                lambda: bool(screen.query(".summary")) and len(screen.history) == 2 and not screen.generating,
                "the summary, then the new chat's reply",
                pilot=pilot,
            )
            assert screen.history[0].content == second
            assert "Summary of an earlier conversation:" in screen.system_prompt
        assert screen.history[-1].role == "assistant"
        assert not any(isinstance(s, ContextFullScreen) for s in app.screen_stack), "not asked again"
        assert _box(pilot).text == ""


async def test_ctrl_c_stops_a_reply_and_the_chat_goes_on(any_speed_engine: ChatEngine) -> None:
    gate = GatedEngine(any_speed_engine)  # still going when Ctrl+C comes, however fast the machine
    app = _host(gate, max_tokens=600)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "Count from one to five hundred, one number per line.")
        await wait_until(
            lambda: gate.held.is_set() and screen._reply is not None and screen._reply.deltas_shown > 0,
            "the reply to stream",
            pilot=pilot,
        )
        await pilot.press("ctrl+c")
        await wait_until(lambda: not screen.generating, "the stop", pilot=pilot)
        assert app.is_running and app.screen is screen, "Ctrl+C during a reply stops it, not the app"
        assert screen.last_stats is not None and screen.last_stats.finish_reason == "cancelled"
        assert screen.query(ReplyView).last().border_subtitle == "stopped"
        await _send(pilot, "Now just say hello.")
        await wait_until(lambda: screen.replies_done == 2, "the next reply", pilot=pilot)
        assert len(screen.history) == 4


async def test_slash_commands_are_commands_not_messages(gemma_engine: ChatEngine) -> None:
    app = _host(gemma_engine)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        box = _box(pilot)
        box.focus()
        await pilot.press(*"/se", "tab")
        assert box.text == "/set ", "Tab completes the command"
        await pilot.press(*"temperature 0.3", "enter")
        assert screen.model_settings.temperature == 0.3
        assert user_prefs.load_prefs().settings_for("gemma3-270m").temperature == 0.3, "saved for the model"
        await _send(pilot, "/system Answer in French.")
        assert screen.system_prompt == "Answer in French."
        await _send(pilot, "/clear")
        await _send(pilot, "/frobnicate")
        assert box.text == "/frobnicate", "an unknown command stays in the box, said, not sent"
        assert screen.history == [] and not screen.query(ReplyView), "nothing went to the model"
        await _send(pilot, "/help")
        await wait_until(lambda: isinstance(app.screen, HelpScreen), "help", pilot=pilot)
        assert "/set temperature" in str(app.screen.query_one("#help-text", Static).render())
        await pilot.press("escape")
        await _send(pilot, "//etc/hosts is a file. Say yes.")
        await wait_until(lambda: screen.replies_done == 1, "the reply", pilot=pilot)
        assert screen.history[0].content == "/etc/hosts is a file. Say yes.", "// sends a leading /"


async def test_page_up_scrolls_the_transcript_from_the_message_box() -> None:
    from helpers_tui import StillEngine

    turns = tuple(ChatMessage("user" if i % 2 == 0 else "assistant", f"message {i}\n" * 4) for i in range(30))
    conv = conversations.Conversation(title="long", messages=turns)
    app = ScreenHost(lambda: ChatScreen(StillEngine(), "m", user_prefs.ModelSettings(max_tokens=8, ctx=1024)))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await screen.show_conversation(conv)
        transcript = screen.query_one("#transcript", VerticalScroll)
        await wait_until(
            lambda: transcript.max_scroll_y > 0 and transcript.is_vertical_scroll_end, "the end", pilot=pilot
        )
        end = transcript.scroll_y
        _box(pilot).focus()
        await pilot.press("pageup")
        await wait_until(lambda: transcript.scroll_y < end, "a page up", pilot=pilot)
        assert app.focused is _box(pilot), "the message box keeps the focus"
        await pilot.press("pagedown")
        await wait_until(lambda: transcript.scroll_y == end, "a page down", pilot=pilot)


async def test_chats_are_listed_renamed_searched_and_deleted(gemma_engine: ChatEngine) -> None:
    app = _host(gemma_engine, max_tokens=8)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "Tell me about owls.")
        await wait_until(lambda: screen.replies_done == 1, "the first chat's reply", pilot=pilot)
        await pilot.press("ctrl+n")
        await _send(pilot, "Tell me about boats.")
        await wait_until(lambda: screen.replies_done == 2, "the second chat's reply", pilot=pilot)
        await pilot.press("ctrl+o")
        await wait_until(
            lambda: isinstance(app.screen, ChatList) and app.screen.listings > 0, "the list", pilot=pilot
        )
        chats = app.screen
        assert isinstance(chats, ChatList)
        assert [c.title for c in chats.chats] == ["Tell me about boats.", "Tell me about owls."]
        await pilot.press(*"owls")
        await wait_until(
            lambda: [c.title for c in chats.chats] == ["Tell me about owls."], "search", pilot=pilot
        )
        await pilot.press("f2")
        search = chats.query_one("#chats-search", Input)
        search.value = "Owls, renamed"
        await pilot.press("enter")
        await wait_until(
            lambda: [c.title for c in chats.chats] == ["Tell me about boats.", "Owls, renamed"],
            "the rename",
            pilot=pilot,
        )
        chats.query_one(OptionList).highlighted = 0
        await pilot.press("tab")  # from the search box to the list
        assert app.focused is chats.query_one(OptionList)
        await pilot.press("delete")
        assert "Press Delete again" in str(chats.query_one("#chats-note", Static).render()), "asked first"
        await pilot.press("delete")
        await wait_until(
            lambda: [c.title for c in chats.chats] == ["Owls, renamed"], "the delete", pilot=pilot
        )
        await pilot.press("enter")
        await wait_until(lambda: app.screen is screen, "the chat opened", pilot=pilot)
        await pilot.pause()
        assert screen.history[0].content == "Tell me about owls."
    assert [c.title for c in chat_store.ChatStore().list()] == ["Owls, renamed"]
    path = chat_store.store_path()
    assert path.stat().st_mode & 0o777 == 0o600 and path.parent.stat().st_mode & 0o777 == 0o700


async def test_ctrl_q_then_a_new_start_lists_the_last_chat(gemma_path: Path) -> None:
    short = user_prefs.ModelSettings(**{**_settings(8).__dict__})
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings(gemma_path.name, short))
    options = StartOptions(model_path=str(gemma_path), simulate="ram=16G,cpu=2")
    app = CloverApp(options)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: isinstance(app.screen, ChatScreen), "the chat", pilot=pilot)
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        assert chat.model_key == gemma_path.name and chat.model_settings.max_tokens == 8
        await _send(pilot, "What do bees make?")
        await wait_until(lambda: chat.replies_done == 1, "the reply", pilot=pilot)
        await pilot.press("ctrl+q")
    again = CloverApp(options)
    async with again.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: isinstance(again.screen, ChatScreen), "the chat again", pilot=pilot)
        await pilot.press("ctrl+o")
        await wait_until(
            lambda: isinstance(again.screen, ChatList) and again.screen.listings > 0, "the list", pilot=pilot
        )
        chats = again.screen
        assert isinstance(chats, ChatList)
        assert [(c.title, c.n_messages) for c in chats.chats] == [("What do bees make?", 2)]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Hugging Face Hub unreachable: a closed port on this machine."""
    from huggingface_hub import constants, hf_api

    url = "http://127.0.0.1:9"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(constants, "ENDPOINT", url)
    monkeypatch.setattr(
        constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}"
    )
    monkeypatch.setattr(hf_api.api, "endpoint", url)


@pytest.mark.usefixtures("offline")
async def test_offline_first_run_reaches_a_chat_with_the_demo_model() -> None:
    app = CloverApp(StartOptions(), machine=parse_simulate("ram=16G,cpu=2"))
    async with app.run_test(size=(80, 24)) as pilot:
        plan = app.screen
        assert isinstance(plan, PlanScreen)
        await wait_until(lambda: plan.plan is not None, "the plan", pilot=pilot)
        await pilot.press("d")  # key 1: download; offline, Clover's runtime cannot be installed first
        await wait_until(
            lambda: any("needs llama.cpp b12060" in str(n.message) for n in app._notifications),
            "the runtime it needs, said",
            pilot=pilot,
        )
        assert app.screen is plan, "nothing is downloaded that nothing here could run"
        await pilot.press("m")  # key 2: the demo model, which ships with clover-local
        await wait_until(lambda: isinstance(app.screen, ChatScreen), "the chat", pilot=pilot)
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        assert chat.model_key == "smollm2-135m" and chat.engine.n_ctx <= 8192, "the demo's own settings"
        await _send(pilot, "What is the capital of France?")  # key 3: Enter
        await wait_until(lambda: chat.replies_done == 1, "the reply", pilot=pilot)
        assert chat.history[-1].content.strip()
    first = user_prefs.load_prefs().first_run
    assert first.preset == "smollm2-135m" and first.complete, "the next start goes to this chat"


async def _run_file_from_plan(app: CloverApp, pilot: Any, path: Path) -> None:
    """What a person does on the first screen: type a GGUF's path into the plan screen and run it."""
    plan = app.screen
    assert isinstance(plan, PlanScreen)
    await wait_until(lambda: plan.plan is not None, "the plan", pilot=pilot)
    box = plan.query_one("#local-path", Input)
    box.value = str(path)
    box.focus()
    await pilot.press("enter")
    await wait_until(lambda: plan.model_path is not None, "the file", pilot=pilot)
    plan.action_run_local()


async def test_a_file_picked_on_the_plan_screen_chats_with_its_own_settings() -> None:
    path = tiny_model("llama")  # a GGUF no preset names
    preset, key, matched = services.preset_and_key_for_file(str(path))
    assert not matched and key == path.name
    own = services.settings_for_file(str(path), preset, matched)
    assert (own.temperature, own.top_k) == (
        user_prefs.ModelSettings().temperature,
        user_prefs.ModelSettings().top_k,
    )
    app = CloverApp(StartOptions(), machine=parse_simulate("ram=16G,cpu=2"))
    async with app.run_test(size=(80, 24)) as pilot:
        await _run_file_from_plan(app, pilot, path)
        await wait_until(
            lambda: isinstance(app.screen, (LaunchScreen, ChatScreen)), "the launch", pilot=pilot
        )
        await wait_until(lambda: isinstance(app.screen, ChatScreen), "the chat", pilot=pilot)
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        clover = user_prefs.ModelSettings.from_preset(load_preset("clover-35b-a3b"))
        assert chat.model_key == path.name and chat.model_settings == own
        assert own.ctx != clover.ctx and chat.engine.n_ctx == own.ctx, (
            "the file's context, not the Clover preset's"
        )
        assert str(chat.query_one("#chat-title", Static).render()).startswith(path.name)
        assert user_prefs.load_prefs().first_run.model_path == str(path), "loaded: the next start goes to it"


async def test_a_file_that_fails_to_load_is_not_where_the_next_start_goes(tmp_path: Path) -> None:
    # A tokenizer llama.cpp does not know ("zzzzz" for "llama", in place): every check before the load passes
    # (a truncated file is refused on the plan screen already), and llama.cpp refuses to load it.
    data = bytearray(tiny_model("llama").read_bytes())
    at = data.index(b"tokenizer.ggml.model") + len(b"tokenizer.ggml.model") + 4 + 8  # key, type, length
    assert data[at : at + 5] == b"llama"
    data[at : at + 5] = b"zzzzz"
    broken = tmp_path / "unknown-tokenizer.gguf"
    broken.write_bytes(bytes(data))

    async def fail_then_back(app: CloverApp, pilot) -> None:  # type: ignore[no-untyped-def]
        await wait_until(
            lambda: isinstance(app.screen, LaunchScreen) and app.screen.failed, "the failed load", pilot=pilot
        )
        await pilot.press("escape")
        await wait_until(lambda: isinstance(app.screen, PlanScreen), "back to the plan", pilot=pilot)

    app = CloverApp(StartOptions(), machine=parse_simulate("ram=16G,cpu=2"))
    async with app.run_test(size=(80, 24)) as pilot:
        await _run_file_from_plan(app, pilot, broken)
        await fail_then_back(app, pilot)
    assert user_prefs.load_prefs().first_run.model_path == "", "picked, failed: never remembered"

    # Remembered before it failed (an older clover-local, or a file damaged since): forgotten once it fails.
    stale = user_prefs.FirstRun(preset="clover-35b-a3b", model_path=str(broken), kind="file")
    user_prefs.save_prefs(user_prefs.load_prefs().with_first_run(stale))
    app = CloverApp(StartOptions(), machine=parse_simulate("ram=16G,cpu=2"))
    async with app.run_test(size=(80, 24)) as pilot:
        await fail_then_back(app, pilot)
    assert not user_prefs.load_prefs().first_run.complete, "the next plain start goes to the plan"


async def test_a_full_context_can_go_on_in_a_new_chat_carrying_a_summary(gemma_engine: ChatEngine) -> None:
    app = _host(gemma_engine, max_tokens=12)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "Remember these words: " + _words(600))
        await wait_until(lambda: screen.replies_done == 1, "the first reply", pilot=pilot)
        second = "And these: " + _words(600, "stone")
        await _send(pilot, second)
        await wait_until(lambda: isinstance(app.screen, ContextFullScreen), "the choices", pilot=pilot)
        await pilot.press("s")
        await wait_until(
            lambda: bool(screen.query(".summary")) and len(screen.history) == 2 and not screen.generating,
            "the summary, then the new chat's reply",
            pilot=pilot,
        )
        assert screen.history[0].content == second, "the message went on in the new chat"
        assert "Summary of an earlier conversation:" in screen.system_prompt
        assert screen.query(".summary"), "the summary is shown at the top of the new chat"
        screen.journal.flush()
        kept = chat_store.ChatStore().list()
        assert len(kept) == 2, "the full chat is kept, and the new one"
        assert "Summary of an earlier" in chat_store.ChatStore().load(kept[0].id).system_prompt


async def test_ctrl_l_switches_to_a_model_on_disk_with_its_own_settings(gemma_path: Path) -> None:
    from clover_local.testing.models import smollm2_path
    from clover_local.tui.screens.models import ModelPicker

    app = CloverApp(StartOptions(model_path=str(gemma_path), simulate="ram=16G,cpu=2"))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(lambda: isinstance(app.screen, ChatScreen), "the chat", pilot=pilot)
        first = app.screen
        await pilot.press("ctrl+l")
        await wait_until(
            lambda: isinstance(app.screen, ModelPicker) and app.screen.ready,
            "the models on disk",
            pilot=pilot,
        )
        picker = app.screen
        assert isinstance(picker, ModelPicker)
        options = picker.query_one("#models-list", OptionList)
        demo = next(key for key, c in picker.choices.items() if c.path == str(smollm2_path()))
        options.highlighted = options.get_option_index(demo)
        options.focus()
        await pilot.press("enter")
        await wait_until(
            lambda: isinstance(app.screen, ChatScreen) and app.screen is not first,
            "the demo's chat",
            pilot=pilot,
        )
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        demo_preset = load_preset("smollm2-135m")
        assert chat.model_key == smollm2_path().name and chat.title_text == demo_preset.display_name
        assert chat.model_settings.temperature == demo_preset.sampling.temperature, "its preset's sampling"
        await _send(pilot, "Say hello.")
        await wait_until(lambda: chat.replies_done == 1, "the demo's reply", pilot=pilot)


async def test_a_reply_says_it_is_reading_the_prompt_until_its_first_words() -> None:
    from textual.screen import Screen

    app = ScreenHost(Screen)
    async with app.run_test(size=(80, 24)) as pilot:
        reply = ReplyView()
        await app.screen.mount(reply)
        reply.post_message(ReplyView.Prompting(1237, 6.4))
        await wait_until(lambda: bool(reply.border_subtitle), "the progress line", pilot=pilot)
        assert reply.border_subtitle == "reading the prompt: 1237 tokens · about 6 s"
        reply.post_message(ReplyView.Delta("Hello"))
        await wait_until(lambda: reply.deltas_shown == 1, "the first words", pilot=pilot)
        assert reply.border_subtitle == ""


async def test_quitting_mid_reply_keeps_what_the_reply_wrote(any_speed_engine: ChatEngine) -> None:
    gate = GatedEngine(any_speed_engine)  # the reply is still going when Ctrl+Q comes
    app = _host(gate, max_tokens=600)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "Count from one to five hundred, one number per line.")
        await wait_until(
            lambda: gate.held.is_set() and screen._reply is not None and bool(screen._reply.raw_text.strip()),
            "the reply's first words on screen",
            pilot=pilot,
        )
        shown = screen._reply.raw_text if screen._reply is not None else ""
        await pilot.press("ctrl+q")
    kept = chat_store.ChatStore().list()
    messages = chat_store.ChatStore().load(kept[0].id).messages
    assert [m.role for m in messages] == ["user", "assistant"], "Ctrl+Q lost nothing"
    assert messages[1].content.startswith(shown.strip()[:1]) and messages[1].content.strip()


async def test_offline_a_download_that_cannot_reach_the_hub_offers_the_demo_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Clover with a runtime that loads it installed (the test runtime), offline: the download fails at once,
    says so, and offers the demo model."""
    from clover_local.tui.screens.download import DownloadScreen

    if BUILT is None:
        pytest.skip("the test runtime is not built (scripts/make_test_runtime.py)")
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(RUNTIMES))
    app = CloverApp(StartOptions(), machine=parse_simulate("ram=16G,cpu=2"))
    async with app.run_test(size=(80, 24)) as pilot:
        plan = app.screen
        assert isinstance(plan, PlanScreen)
        await wait_until(lambda: plan.plan is not None, "the plan", pilot=pilot)
        await pilot.press("d")
        await wait_until(
            lambda: isinstance(app.screen, DownloadScreen) and app.screen.failed, "the failure", pilot=pilot
        )
        download = app.screen
        assert isinstance(download, DownloadScreen)
        assert "Starting" not in str(download.query_one("#download-status", Static).render()), "nothing stale"
        assert "demo model" in str(download.query_one("#download-offline", Static).render())
        assert download.query_one("#download-demo").display
        await pilot.press("m")
        await wait_until(lambda: isinstance(app.screen, ChatScreen), "the chat", pilot=pilot)
