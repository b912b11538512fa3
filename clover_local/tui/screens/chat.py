"""The chat: a scrolling transcript, an input that stays usable while a reply streams, and a status line.

Generation runs in a thread worker that only posts messages to the reply widget, so the engine runs at its
own speed. Esc stops a reply within a token or two (the engine's ``cancel`` event).
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Input, Static
from textual.worker import get_current_worker

from clover_local import conversations, user_prefs
from clover_local.engine.types import (
    ChatEngine,
    ChatMessage,
    Finished,
    GenerationRequest,
    GenerationStats,
    Refining,
    TextDelta,
)
from clover_local.errors import CloverError
from clover_local.tui.thinking import strip_thinking
from clover_local.tui.widgets.messages import ReplyView, UserMessage

POST_INTERVAL_S = 1 / 10
"""At most this often the generation thread hands new text to the screen (the first token goes at once). Ten
updates a second still reads as a stream; at twenty the rendering (which holds the GIL) slowed the engine's
loop to 0.95 of its headless rate on 2 cores, at ten it keeps up (0.99-1.00, ``scripts/bench_tui.py``)."""


def format_status(stats: GenerationStats | None, n_ctx: int, *, generating: bool = False) -> str:
    """The status line: speed, time to first token, context used / size, draft acceptance."""
    if stats is None:
        used = "-"
        parts = ["tok/s -", "TTFT -"]
        draft = "draft -"
    else:
        used = str(stats.prompt_tokens + stats.completion_tokens)
        parts = [f"tok/s {stats.decode_tokens_per_s:.1f}", f"TTFT {stats.ttft_s:.2f}s"]
        draft = "draft -" if stats.draft_acceptance is None else f"draft {stats.draft_acceptance:.0%}"
    state = "generating… (Esc stops)" if generating else "ready"
    return " · ".join([state, *parts, f"ctx {used}/{n_ctx}", draft])


class ChatScreen(Screen[None]):
    """Multi-turn chat with one loaded engine."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop", id="chat.stop"),
        Binding("ctrl+r", "regenerate", "Regen", id="chat.regenerate"),
        Binding("ctrl+g", "edit_last", "Edit", id="chat.edit_last"),
        Binding("ctrl+y", "copy_reply", "Copy", id="chat.copy_reply"),
        Binding("ctrl+s", "save", "Save", id="chat.save"),
        Binding("ctrl+o", "open", "Open", id="chat.open"),
        Binding("ctrl+n", "new_chat", "New", id="chat.new", show=False),
        Binding("f2", "settings", "Settings", id="chat.settings"),
    ]

    def __init__(
        self, engine: ChatEngine, model_key: str, model_settings: user_prefs.ModelSettings, *, info: str = ""
    ) -> None:
        super().__init__()
        self.engine = engine
        self.model_key = model_key
        self.model_settings = model_settings
        self.info = info
        self.history: list[ChatMessage] = []
        self._views: list[Widget] = []
        """One widget per history entry, in the same order."""
        self._pending: list[str] = []
        self._reply: ReplyView | None = None
        self._cancel = threading.Event()
        self._created = _now()
        self.last_stats: GenerationStats | None = None
        self.replies_done = 0
        """Replies finished (stopped or failed included) since the screen opened."""
        self.reply_started_at = 0.0
        self.reply_shown_at = 0.0
        """``time.perf_counter()`` when the last reply was requested, and when all of it was on screen."""

    def compose(self) -> ComposeResult:
        yield Static(self._title_text(), id="chat-title", markup=False)
        yield VerticalScroll(id="transcript")
        yield Input(placeholder="Message (Enter sends; F1 help)", id="prompt")
        yield Static(format_status(None, self.engine.n_ctx), id="status", markup=False)
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#transcript", VerticalScroll).anchor()
        self.query_one("#prompt", Input).focus()
        if self.info:
            self.notify(self.info, severity="warning", timeout=10)

    @property
    def generating(self) -> bool:
        return self._reply is not None

    # Sending and receiving

    async def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        event.input.clear()
        if not text:
            return
        if self.generating:
            self._pending.append(text)
            self.notify(
                "Queued: it is sent when this reply ends (Esc stops the reply and puts it back here).",
                timeout=3,
            )
            return
        await self.send(text)

    async def send(self, text: str) -> None:
        """Add the person's message and start the reply."""
        view = UserMessage(text)
        self.history.append(ChatMessage("user", text))
        self._views.append(view)
        await self.query_one("#transcript", VerticalScroll).mount(view)
        await self._start_reply()

    async def _start_reply(self) -> None:
        reply = ReplyView()
        self._reply = reply
        await self.query_one("#transcript", VerticalScroll).mount(reply)
        self._cancel = threading.Event()
        self._set_status(generating=True)
        self.reply_started_at = time.perf_counter()
        self._generate(reply, self._request(), self._cancel)

    def _request(self) -> GenerationRequest:
        s = self.model_settings
        system = (ChatMessage("system", s.system_prompt),) if s.system_prompt.strip() else ()
        return GenerationRequest(
            messages=system + tuple(self.history),
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            speculative=False
            if s.spec_mode == "off"
            else None,  # on: as the plan chose (auto may have said off)
        )

    @work(thread=True, exclusive=True, group="reply")
    def _generate(self, reply: ReplyView, request: GenerationRequest, cancel: threading.Event) -> None:
        worker = get_current_worker()
        stats: GenerationStats | None = None
        error: str | None = None
        pending: list[str] = []
        last_post = 0.0
        last_refine = 0.0
        if hasattr(self.engine, "live"):
            self.engine.live = self.model_settings.diffusion_live  # diffusion engines: the live view
        try:
            for event in self.engine.generate(request, cancel):
                if worker.is_cancelled:
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
        except CloverError as exc:
            error = str(exc)
        except Exception as exc:  # an engine bug must not take the whole app down mid-chat
            error = f"Generation failed: {type(exc).__name__}: {exc}"
        finally:
            if pending:
                reply.post_message(ReplyView.Delta("".join(pending)))
            reply.post_message(ReplyView.Done(stats, error))

    async def on_reply_view_completed(self, message: ReplyView.Completed) -> None:
        if message.reply is not self._reply:
            return
        self._reply = None
        self.reply_shown_at = time.perf_counter()
        self.replies_done += 1
        if message.stats is not None:
            self.last_stats = message.stats
        if message.reply.raw_text or not message.error:
            self.history.append(ChatMessage("assistant", message.reply.raw_text))
            self._views.append(message.reply)
        else:
            await message.reply.remove()
        self._set_status(generating=False)
        if self._pending:
            await self.send(self._pending.pop(0))

    def _set_status(self, *, generating: bool) -> None:
        text = format_status(self.last_stats, self.engine.n_ctx, generating=generating)
        self.query_one("#status", Static).update(text)

    def _title_text(self) -> str:
        return f"{self.engine.model_name}" + (f" · {self.info}" if self.info else "")

    # Actions

    def action_stop(self) -> None:
        """Stop the reply. Messages queued behind it go back into the input (with whatever is being
        typed after them), unsent but never lost: Enter sends them."""
        if not self.generating:
            return
        self._cancel.set()
        queued, self._pending = self._pending, []
        if not queued:
            return
        try:
            prompt = self.query_one("#prompt", Input)
        except NoMatches:  # the screen is closing
            return
        prompt.value = " ".join([*queued, prompt.value.strip()]).strip()
        prompt.cursor_position = len(prompt.value)
        prompt.focus()
        self.notify("Stopped. Your queued message is back in the input: Enter sends it.", timeout=5)

    async def action_regenerate(self) -> None:
        if self.generating or not self.history or self.history[-1].role != "assistant":
            self.notify("Nothing to regenerate yet.", severity="warning", timeout=3)
            return
        self.history.pop()
        await self._views.pop().remove()
        await self._start_reply()

    async def action_edit_last(self) -> None:
        """Put the last message back in the input and drop it (and its reply) from the chat."""
        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning", timeout=3)
            return
        users = [i for i, m in enumerate(self.history) if m.role == "user"]
        if not users:
            return
        at = users[-1]
        text = self.history[at].content
        for view in self._views[at:]:
            await view.remove()
        del self.history[at:], self._views[at:]
        prompt = self.query_one("#prompt", Input)
        prompt.value = text
        prompt.cursor_position = len(text)
        prompt.focus()

    def action_copy_reply(self) -> None:
        replies = [m for m in self.history if m.role == "assistant"]
        if not replies:
            self.notify("No reply to copy yet.", severity="warning", timeout=3)
            return
        self.app.copy_to_clipboard(strip_thinking(replies[-1].content))
        self.notify("Reply copied to the clipboard.", timeout=3)

    def action_save(self) -> None:
        if not self.history:
            self.notify("Nothing to save yet.", severity="warning", timeout=3)
            return
        conv = self.conversation()
        try:
            path = conversations.save(conv)
        except CloverError as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(f"Saved to {path}", timeout=5)

    def conversation(self) -> conversations.Conversation:
        return conversations.Conversation(
            title=conversations.title_from(self.history),
            messages=tuple(self.history),
            system_prompt=self.model_settings.system_prompt,
            model=self.model_key,
            created=self._created,
        )

    def action_open(self) -> None:
        from clover_local.tui.screens.modals import ConversationPicker

        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning", timeout=3)
            return
        self.app.push_screen(ConversationPicker(conversations.list_saved()), self._open_picked)

    async def _open_picked(self, picked: conversations.Conversation | None) -> None:
        if picked is not None:
            await self.show_conversation(picked)

    async def show_conversation(self, conv: conversations.Conversation) -> None:
        """Replace the transcript with a saved conversation; the next message continues it."""
        transcript = self.query_one("#transcript", VerticalScroll)
        await transcript.remove_children()
        self.history = list(conv.messages)
        self._views = [
            UserMessage(m.content) if m.role == "user" else ReplyView(m.content, streaming=False)
            for m in self.history
        ]
        await transcript.mount_all(self._views)
        self._created = conv.created
        if conv.system_prompt:
            self.model_settings = replace(self.model_settings, system_prompt=conv.system_prompt)
        transcript.scroll_end(animate=False)

    async def action_new_chat(self) -> None:
        self.action_stop()
        if self.generating:
            return
        await self.query_one("#transcript", VerticalScroll).remove_children()
        self.history, self._views, self._created = [], [], _now()

    def action_settings(self) -> None:
        from clover_local.tui.screens.modals import SettingsScreen

        self.app.push_screen(SettingsScreen(self.model_settings, self.engine.n_ctx), self._settings_done)

    def _settings_done(self, new: user_prefs.ModelSettings | None) -> None:
        if new is None:
            return
        ctx_changed = new.ctx != self.model_settings.ctx
        mode_changed = new.spec_mode != self.model_settings.spec_mode
        self.model_settings = new
        prefs = user_prefs.load_prefs().with_model_settings(self.model_key, new)
        try:
            user_prefs.save_prefs(prefs)
        except CloverError as exc:
            self.notify(str(exc), severity="error")
        if ctx_changed or mode_changed:
            what = f"Context {new.ctx}" if ctx_changed else f"Speculation {new.spec_mode}"
            self.notify(f"{what} applies the next time the model loads.", timeout=5)
        else:
            self.notify("Settings saved for this model.", timeout=3)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
