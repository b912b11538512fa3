"""The chat: a scrolling transcript, a message box that stays usable while a reply streams, and a status line.

Generation runs on the engine's thread, which only posts messages to the reply widget, so the engine runs at
its own speed. Esc or Ctrl+C stops a reply within a token or two (the engine's ``cancel`` event). Every message is
written to the chat store as it completes (:mod:`clover_local.chat_store`), so nothing is lost to Ctrl+N,
Ctrl+Q or a crash. A turn that fails stays on screen with its reason and leaves the conversation as it was; a
full context is said before sending, with the choice of leaving out the oldest turns or a new chat carrying a
summary. Dismisses with a :class:`~clover_local.tui.services.ModelChoice` when the person switches model, or
:class:`~clover_local.tui.services.LoadAgain` when the runner was given up and they load the model again (Ctrl+L):
the one way out, which keeps the conversation and the text not yet sent.

A message the person sends is always answered, queued, or given back to the box (beside what they are writing,
never instead of it): a turn that fails, a queue behind a reply that fails, a summary that fails.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from dataclasses import dataclass, field, replace
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static

from clover_local import chat_store, conversations, user_prefs
from clover_local.engine.types import (
    END,
    ChatEngine,
    ChatMessage,
    GenerationRequest,
    GenerationStats,
    RunnerHealth,
    TextDelta,
    prompt_tokens,
)
from clover_local.errors import CloverError
from clover_local.serve.slots import SlotQueue, Ticket
from clover_local.tui import context_fit, slash
from clover_local.tui.reply_stream import LOAD_AGAIN, post_reply, post_ticket
from clover_local.tui.services import LoadAgain, ModelChoice
from clover_local.tui.thinking import strip_thinking
from clover_local.tui.widgets.message_box import MessageBox
from clover_local.tui.widgets.messages import ReplyView, UserMessage

RUNNER_CHECK_S = 0.5
"""How often the chat looks at its runner's state (a dict read; the supervisor does the watching)."""
SUMMARY_REQUEST = (
    "Summarize our conversation so far in at most 120 words: the facts, decisions and open questions a new "
    "conversation needs to carry on. Write only the summary."
)


def format_status(
    stats: GenerationStats | None,
    n_ctx: int,
    *,
    generating: bool = False,
    runner: RunnerHealth | None = None,
    used_tokens: int | None = None,
) -> str:
    """The status line: the runner's state, speed, time to first token, context used / size, draft acceptance.
    ``used_tokens``: the context the conversation holds when no reply says it (a chat reopened from the list)."""
    used = "-" if used_tokens is None else str(used_tokens)
    if stats is None:
        parts = ["tok/s -", "TTFT -"]
        draft = "draft -"
    else:
        used = str(stats.prompt_tokens + stats.completion_tokens)
        parts = [f"tok/s {stats.decode_tokens_per_s:.1f}", f"TTFT {stats.ttft_s:.2f}s"]
        draft = "draft -" if stats.draft_acceptance is None else f"draft {stats.draft_acceptance:.0%}"
    state = "generating… (Esc stops)" if generating else "ready"
    if runner is not None and runner.state == "restarting":
        state = "restarting the runner…"
    elif runner is not None and runner.state in ("failed", "stopped"):
        state = "runner stopped (Ctrl+L loads it again)"
    load = [_load_note(runner)] if runner is not None and _load_note(runner) else []
    return " · ".join([state, *parts, f"ctx {used}/{n_ctx}", draft, *load])


def _load_note(runner: RunnerHealth) -> str:
    return runner.threads.note if runner.threads is not None else ""


class ChatScreen(Screen[ModelChoice | LoadAgain | None]):
    """Multi-turn chat with one loaded engine."""

    @dataclass
    class Summarized(Message, bubble=False):
        """The summary a new chat carries is written (posted from the generation thread)."""

        reply: ReplyView
        summary: str
        text: str
        error: str | None

    @dataclass
    class Counted(Message, bubble=False):
        """The context a reopened conversation holds, counted (posted from a worker)."""

        history: list[ChatMessage]
        tokens: int

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "stop", "Stop", id="chat.stop"),
        Binding("ctrl+c", "stop_or_quit", "Stop/Quit", show=False, priority=True, id="chat.stop_or_quit"),
        Binding("ctrl+n", "new_chat", "New", id="chat.new"),
        Binding("ctrl+o", "open", "Chats", id="chat.open"),
        Binding("ctrl+r", "regenerate", "Regen", id="chat.regenerate"),
        Binding("ctrl+g", "edit_last", "Edit", show=False, id="chat.edit_last"),
        Binding("ctrl+y", "copy_reply", "Copy", show=False, id="chat.copy_reply", priority=True),
        Binding("ctrl+s", "save", "Export", show=False, id="chat.save"),
        Binding("f2", "settings", "Settings", id="chat.settings"),
        Binding("ctrl+l", "model", "Model", show=False, id="chat.model"),
        Binding("pageup", "page('up')", "Scroll up", show=False, priority=True, id="chat.page_up"),
        Binding("pagedown", "page('down')", "Scroll down", show=False, priority=True, id="chat.page_down"),
    ]

    def __init__(
        self,
        engine: ChatEngine,
        model_key: str,
        model_settings: user_prefs.ModelSettings,
        *,
        info: str = "",
        title: str = "",
        store: chat_store.ChatStore | None = None,
        seeds: random.Random | None = None,
        carried: LoadAgain | None = None,
    ) -> None:
        super().__init__()
        self.carried = carried
        """The conversation and unsent text of the chat before it (its runner given up), carried on here."""
        self.engine = engine
        self.queue = SlotQueue(engine, engine.slots, max_queue=1)
        """Replies and summaries go to the engine through the queue ``serve`` uses, one at a time."""
        self.model_key = model_key
        self.model_settings = model_settings
        self.system_prompt = model_settings.system_prompt
        """This chat's system prompt (``/system``; a chat opened from the list brings its own)."""
        self.info = info
        self.title_text = title or engine.model_name
        self.history: list[ChatMessage] = []
        self._views: list[Widget] = []
        """One widget per history entry, in the same order."""
        self.context_from = 0
        """History entries before this index were left out of the context (to fit); they stay on screen."""
        self._pending: list[str] = []
        self._reply: ReplyView | None = None
        self._cancel = threading.Event()
        self.store = store or chat_store.ChatStore()
        self.journal = chat_store.ChatJournal(self.store, self._store_failed)
        self.journal.begin(model_key, self.system_prompt)
        self.last_stats: GenerationStats | None = None
        self.used_tokens: int | None = None
        """The context a reopened conversation holds, until a reply says it (``last_stats``)."""
        self.replies_done = 0
        """Replies finished (stopped or failed included) since the screen opened."""
        self.reply_started_at = 0.0
        self.reply_shown_at = 0.0
        """``time.perf_counter()`` when the last reply was requested, and when all of it was on screen."""
        self.failed_turns = 0
        self.seeds = seeds or random.Random()
        """Where each reply's seed comes from: every reply, a regenerated one too, draws a new one (so Ctrl+R
        writes a new reply with any sampling but greedy); a seeded ``Random`` makes a chat reproducible."""
        self._shut = False
        self.runner = RunnerHealth()
        """The engine's runner as last said (a llama-server child: ready, restarting, failed); the status line
        reads the engine's state itself whenever it is drawn."""

    def compose(self) -> ComposeResult:
        title = self.title_text + (f" · {self.info}" if self.info else "")
        yield Static(title, id="chat-title", markup=False)
        yield VerticalScroll(id="transcript")
        yield MessageBox(
            commands=list(slash.COMMANDS),
            placeholder="Message (Enter sends · Ctrl+J new line · /help · F1 keys)",
            id="prompt",
        )
        yield Static(format_status(None, self.engine.n_ctx), id="status", markup=False)
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#transcript", VerticalScroll).anchor()
        self.query_one("#prompt", MessageBox).focus()
        if self.info:
            self.notify(self.info, severity="warning", timeout=10)
        if self.carried is None:
            self._last_chat_hint()
        else:
            self.call_after_refresh(self._carry_on, self.carried)
        self.set_interval(RUNNER_CHECK_S, self._check_runner)

    async def _carry_on(self, carried: LoadAgain) -> None:
        """The chat before this one (its runner given up) goes on here: its conversation and its unsent text."""
        if carried.chat_id is not None:
            try:
                conv = self.store.load(carried.chat_id)
            except CloverError as exc:
                self.notify(str(exc), severity="error", timeout=10)
            else:
                await self.show_conversation(conv, chat_id=carried.chat_id)
        if carried.draft:
            self._give_back(carried.draft)

    def _check_runner(self) -> None:
        """Say when the runner stops, is started again, is back or was given up (once each), in the status line
        and one notification; the conversation stays as it is."""
        now = self.engine.health()
        before, self.runner = self.runner, now
        if (now.state, now.restarts) == (before.state, before.restarts):
            if _load_note(now) != _load_note(before):  # only the threads the load allows
                self._set_status(generating=self.generating)
            return
        if now.state == "restarting":
            self.notify(f"{now.why}…", severity="warning", timeout=8)
        elif now.state == "ready":
            self.app.clear_notifications()  # "starting it again" is no longer true
            self.notify("The model's runner is running again: your conversation is kept.", timeout=6)
        elif now.state == "failed":
            self.notify(f"{now.why}. {LOAD_AGAIN}.", severity="error", timeout=30)
        self._set_status(generating=self.generating)

    @work(thread=True, group="store-read")
    def _last_chat_hint(self) -> None:
        try:
            saved = self.store.list()
        except CloverError:
            return
        if saved:
            self.app.call_from_thread(
                self.notify, f"Your last chat: {saved[0].title!r}. Ctrl+O lists your chats.", timeout=6
            )

    @property
    def generating(self) -> bool:
        return self._reply is not None

    # Sending and receiving

    async def on_message_box_submitted(self, event: MessageBox.Submitted) -> None:
        text = event.text
        if not text.strip():
            return
        try:
            command = slash.parse(text)
        except CloverError as exc:
            self.notify(str(exc), severity="warning", timeout=8)
            if not event.box.text:
                event.box.set_text(text)  # to correct it
            return
        if command is not None:
            await self.run_command(command)
            return
        text = slash.message_text(text)
        if self.generating:
            self._pending.append(text)
            self.notify(
                "Queued: it is sent when this reply ends (Esc stops the reply and puts it back here).",
                timeout=3,
            )
            return
        await self.send(text)

    async def send(self, text: str, *, drop_oldest: bool | None = None) -> None:
        """Add the person's message and start the reply (written to the store at once)."""
        view = UserMessage(text)
        self.history.append(ChatMessage("user", text))
        self._views.append(view)
        self.journal.put(len(self.history) - 1, self.history[-1])
        transcript = self.query_one("#transcript", VerticalScroll)
        await transcript.mount(view)
        transcript.scroll_end(animate=False)  # what was just sent is in view, even if it was scrolled
        await self._start_reply(drop_oldest=drop_oldest)

    async def _start_reply(self, *, drop_oldest: bool | None = None) -> None:
        seed = self.seeds.randrange(2**31)
        reply = await self._mount_reply()
        self.reply_started_at = time.perf_counter()
        if drop_oldest is None:
            drop_oldest = user_prefs.load_prefs().context_overflow == "drop"
        post_reply(
            self.queue,
            reply,
            self._request((), seed),
            self._system(),
            self.history[self.context_from :],
            drop_oldest=drop_oldest,
            cancel=self._cancel,
            prefill_rate=self.last_stats.prefill_tokens_per_s if self.last_stats else 0.0,
        )

    async def _mount_reply(self, title: str = "") -> ReplyView:
        """A new reply at the end of the transcript, the one generating now (with its own cancel: Esc)."""
        reply = ReplyView()
        reply.border_title = title or reply.border_title
        self._reply = reply
        await self.query_one("#transcript", VerticalScroll).mount(reply)
        self._cancel = threading.Event()
        self._set_status(generating=True)
        return reply

    def _system(self) -> tuple[ChatMessage, ...]:
        return (ChatMessage("system", self.system_prompt),) if self.system_prompt.strip() else ()

    def _request(self, messages: tuple[ChatMessage, ...], seed: int | None) -> GenerationRequest:
        s = self.model_settings
        return GenerationRequest(
            messages=messages,
            max_tokens=s.max_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            seed=seed,
            speculative=False if s.spec_mode == "off" else None,  # else as the plan chose (auto may say off)
            live=s.diffusion_live,  # diffusion engines: the live view
        )

    def on_reply_view_dropped(self, message: ReplyView.Dropped) -> None:
        """The oldest turns were left out of the context: they stay on screen, marked."""
        self.context_from += message.count
        for view in self._views[: self.context_from]:
            view.add_class("-dropped")
            view.border_subtitle = "left out of the context"

    async def on_reply_view_completed(self, message: ReplyView.Completed) -> None:
        if message.reply is not self._reply:
            return
        self._reply = None
        self.reply_shown_at = time.perf_counter()
        self.replies_done += 1
        if message.stats is not None:
            self.last_stats = message.stats
            self.used_tokens = None

        if message.error:
            await self._turn_failed(message)
        else:
            self.history.append(ChatMessage("assistant", message.reply.raw_text))
            self._views.append(message.reply)
            self.journal.put(len(self.history) - 1, self.history[-1])
        self._set_status(generating=False)
        if self._pending:
            await self.send(self._pending.pop(0))

    async def _turn_failed(self, message: ReplyView.Completed) -> None:
        """The reply failed: its error stays on screen, the person's message goes back to the box (marked
        "not answered" in the transcript) and out of the conversation, so the next message is answered."""
        self.failed_turns += 1
        text = ""
        if self.history and self.history[-1].role == "user":
            text = self.history.pop().content
            view = self._views.pop()
            if isinstance(view, UserMessage):
                view.mark_failed("not answered: it is back in the message box")
            self.journal.truncate(len(self.history))
        full = bool(message.context_full and text and self.history[self.context_from :])
        runner_gone = self.engine.health().state in ("failed", "stopped")
        # A queue behind a full context waits for the choice below; behind a runner given up, nothing answers it.
        queued, self._pending = (self._pending, []) if full or runner_gone else ([], self._pending)
        if text or queued:
            self._give_back(*([text] if text else []), *queued)
        if full:
            remembered = user_prefs.load_prefs().context_overflow
            if remembered == "summary":
                self._take_back(text)
                await self._summarize_then_send(text)
            elif remembered != "drop":  # "drop" was tried: this message alone does not fit, said above
                self._ask_context_full(text)

    def _give_back(self, *texts: str) -> None:
        """Put messages that were not sent back in the box, before what is being written there (never instead
        of it): Enter sends them all."""
        box = self.query_one("#prompt", MessageBox)
        parts = [t.strip() for t in (*texts, box.text) if t.strip()]
        box.set_text("\n\n".join(parts))

    def _take_back(self, text: str) -> None:
        """Take ``text`` out of the box again (it is being sent after all); what else is written there stays."""
        box = self.query_one("#prompt", MessageBox)
        current = box.text.strip()
        if current == text.strip():
            box.clear_text()
        elif current.startswith(text.strip()):
            box.set_text(current[len(text.strip()) :].strip())

    def _set_status(self, *, generating: bool) -> None:
        text = format_status(
            self.last_stats,
            self.engine.n_ctx,
            generating=generating,
            runner=self.engine.health(),
            used_tokens=self.used_tokens,
        )
        self.query_one("#status", Static).update(text)

    # A full context

    def _ask_context_full(self, text: str) -> None:
        from clover_local.tui.screens.modals import ContextFullScreen

        self.app.push_screen(ContextFullScreen(self.engine.n_ctx), lambda c: self._context_choice(c, text))

    async def _context_choice(self, choice: tuple[str, bool] | None, text: str) -> None:
        if choice is None:
            return
        how, remember = choice
        if remember:
            try:
                prefs = user_prefs.load_prefs()
                user_prefs.save_prefs(replace(prefs, context_overflow=how))
            except CloverError as exc:
                self.notify(str(exc), severity="error")
        self._take_back(text)
        if how == "drop":
            await self.send(text, drop_oldest=True)
        else:
            await self._summarize_then_send(text)

    async def _summarize_then_send(self, text: str) -> None:
        reply = await self._mount_reply("Summary for a new chat")
        system = self._system()
        turns = [*self.history[self.context_from :], ChatMessage("user", SUMMARY_REQUEST)]

        def prepare(request: GenerationRequest) -> GenerationRequest:
            """Where the engine takes the ticket: the oldest turns left out until the summary's request fits."""
            fitted = context_fit.fit(self.engine, system, turns, 256, drop=True)
            return replace(request, messages=(*system, *turns[fitted.dropped :]))

        request = replace(self._request((), None), max_tokens=256)
        post_ticket(self.queue, Ticket(request, SummarySink(self, reply, text), self._cancel, prepare))

    async def on_chat_screen_summarized(self, message: Summarized) -> None:
        reply, summary, text, error = message.reply, message.summary, message.text, message.error
        self._reply = None
        reply.post_message(ReplyView.Done(None, error))
        self._set_status(generating=False)
        if error or not summary:
            self._give_back(text)
            self.notify(error or "The model wrote no summary.", severity="error", timeout=10)
            return
        base = self.model_settings.system_prompt.strip()
        carried = f"Summary of an earlier conversation: {summary}"
        await self.new_chat(system_prompt=f"{base}\n\n{carried}".strip(), quiet=True)
        await self.query_one("#transcript", VerticalScroll).mount(
            Static(carried, markup=False, classes="summary")
        )
        self.notify("A new chat, carrying a summary of the last one (which is kept: Ctrl+O).", timeout=6)
        await self.send(text)

    # Actions

    def action_stop(self) -> None:
        """Stop the reply. Messages queued behind it go back into the box (with whatever is being typed
        after them), unsent but never lost: Enter sends them."""
        if not self.generating:
            return
        self._cancel.set()
        queued, self._pending = self._pending, []
        if not queued:
            return
        try:
            self.query_one("#prompt", MessageBox)
        except NoMatches:  # the screen is closing
            return
        self._give_back(*queued)
        self.notify("Stopped. Your queued message is back in the message box: Enter sends it.", timeout=5)

    def action_stop_or_quit(self) -> None:
        """Ctrl+C: stop the reply; with text selected in the box, copy it; otherwise quit (as in a shell)."""
        if self.generating:
            self.action_stop()
            self.notify("Stopped. Ctrl+C again (or Ctrl+Q) quits.", timeout=4)
            return
        box = self.query_one("#prompt", MessageBox)
        if box.selected_text:
            self.app.copy_to_clipboard(box.selected_text)
            return
        self.app.exit()

    def action_page(self, direction: str) -> None:
        transcript = self.query_one("#transcript", VerticalScroll)
        (transcript.scroll_page_up if direction == "up" else transcript.scroll_page_down)()

    async def action_regenerate(self) -> None:
        if self.generating or not self.history or self.history[-1].role != "assistant":
            self.notify("Nothing to regenerate yet.", severity="warning", timeout=3)
            return
        s = self.model_settings
        if s.temperature == 0 or s.top_k == 1:
            self.notify(
                "Greedy sampling (temperature 0 or top-k 1) writes the same reply again: raise both in F2 "
                "(or /set) for a different one.",
                timeout=6,
            )
        self.history.pop()
        await self._views.pop().remove()
        self.journal.truncate(len(self.history))
        await self._start_reply()  # a new seed: a new reply

    async def action_edit_last(self) -> None:
        """Put the last message back in the box and drop it (and its reply) from the chat."""
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
        self.context_from = min(self.context_from, at)
        self.journal.truncate(at)
        self.query_one("#prompt", MessageBox).set_text(text)

    def action_copy_reply(self) -> None:
        replies = [m for m in self.history if m.role == "assistant"]
        if not replies:
            self.notify("No reply to copy yet.", severity="warning", timeout=3)
            return
        self.app.copy_to_clipboard(strip_thinking(replies[-1].content))
        self.notify("Reply copied to the clipboard.", timeout=3)

    def action_save(self) -> None:
        """Export the chat as JSON and Markdown (it is already kept in the chat list as it goes)."""
        if not self.history:
            self.notify("Nothing to export yet.", severity="warning", timeout=3)
            return
        try:
            json_path, md_path = conversations.export(self.conversation())
        except CloverError as exc:
            self.notify(str(exc), severity="error")
            return
        self.notify(f"Exported to {md_path} and {json_path.name}", timeout=6)

    def conversation(self) -> conversations.Conversation:
        return conversations.Conversation(
            title=conversations.title_from(self.history),
            messages=tuple(self.history),
            system_prompt=self.system_prompt,
            model=self.model_key,
            created=conversations.now(),
        )

    def action_open(self) -> None:
        from clover_local.tui.screens.chat_list import ChatList

        if self.generating:
            self.notify("Stop the reply first (Esc).", severity="warning", timeout=3)
            return
        self.journal.flush()
        self.app.push_screen(ChatList(self.store, current=self.journal.chat_id), self._open_picked)

    async def _open_picked(self, picked: tuple[int, conversations.Conversation] | None) -> None:
        if picked is not None:
            await self.show_conversation(picked[1], chat_id=picked[0])

    async def show_conversation(self, conv: conversations.Conversation, chat_id: int | None = None) -> None:
        """Replace the transcript with a kept conversation; the next message continues it."""
        transcript = self.query_one("#transcript", VerticalScroll)
        await transcript.remove_children()
        self.history = list(conv.messages)
        self.context_from = 0
        self._views = [
            UserMessage(m.content) if m.role == "user" else ReplyView(m.content, streaming=False)
            for m in self.history
        ]
        await transcript.mount_all(self._views)
        self.system_prompt = conv.system_prompt or self.model_settings.system_prompt
        self.journal.begin(conv.model or self.model_key, self.system_prompt, chat_id, conv.created)
        transcript.scroll_end(animate=False)
        self.last_stats, self.used_tokens = None, None
        self._set_status(generating=self.generating)
        self._count_context(self._system(), list(self.history))

    @work(thread=True, exclusive=True, group="count")
    def _count_context(self, system: tuple[ChatMessage, ...], history: list[ChatMessage]) -> None:
        """How much of the context a reopened conversation holds, for the status line (before its next reply)."""
        try:
            tokens = prompt_tokens(self.engine, [*system, *history])
        except CloverError:
            return  # the runner is away: the status line says "-" until the next reply
        self.post_message(ChatScreen.Counted(history, tokens))

    def on_chat_screen_counted(self, message: Counted) -> None:
        if message.history == self.history and self.last_stats is None:
            self.used_tokens = message.tokens
            self._set_status(generating=self.generating)

    async def action_new_chat(self) -> None:
        await self.new_chat()

    async def new_chat(self, *, system_prompt: str | None = None, quiet: bool = False) -> None:
        """A fresh chat; the one on screen stays in the chat list."""
        self.action_stop()
        if self.generating:
            return
        had = bool(self.history)
        await self.query_one("#transcript", VerticalScroll).remove_children()
        self.history, self._views, self.context_from = [], [], 0
        self.last_stats, self.used_tokens = None, None  # the last chat's context is not this one's
        self._set_status(generating=False)
        self.system_prompt = self.model_settings.system_prompt if system_prompt is None else system_prompt
        self.journal.begin(self.model_key, self.system_prompt)
        if had and not quiet:
            self.notify("New chat. The last one is kept: Ctrl+O lists your chats.", timeout=4)

    def action_settings(self) -> None:
        from clover_local.tui.screens.modals import SettingsScreen

        self.app.push_screen(SettingsScreen(self.model_settings), self._settings_done)

    def _settings_done(self, new: user_prefs.ModelSettings | None) -> None:
        if new is None:
            return
        ctx_changed = new.ctx != self.model_settings.ctx
        mode_changed = new.spec_mode != self.model_settings.spec_mode
        if new.system_prompt != self.model_settings.system_prompt:
            self.system_prompt = new.system_prompt
            self.journal.set_system_prompt(new.system_prompt)
        self._save_settings(new)
        if ctx_changed or mode_changed:
            what = f"Context {new.ctx}" if ctx_changed else f"Speculation {new.spec_mode}"
            self.notify(f"{what} applies the next time the model loads.", timeout=5)
        else:
            self.notify("Settings saved for this model.", timeout=3)

    def _save_settings(self, new: user_prefs.ModelSettings) -> None:
        self.model_settings = new
        prefs = user_prefs.load_prefs().with_model_settings(self.model_key, new)
        try:
            user_prefs.save_prefs(prefs)
        except CloverError as exc:
            self.notify(str(exc), severity="error")

    def action_model(self) -> None:
        """Ctrl+L: choose another model; once the runner was given up, load this one again, carrying on this
        conversation and the text in the box."""
        from clover_local.tui.screens.models import ModelPicker

        if self.generating:  # the engine is closed for the next model: never under a running reply
            self.notify("Stop the reply first (Esc).", severity="warning", timeout=3)
            return
        if self.engine.health().state in ("failed", "stopped"):
            self.journal.flush()
            self._leave(LoadAgain(self.journal.chat_id if self.history else None))
            return
        self.app.push_screen(ModelPicker(), self._model_picked)

    def _model_picked(self, choice: ModelChoice | None) -> None:
        if choice is not None and not self.generating:
            self._leave(choice)

    def _leave(self, result: ModelChoice | LoadAgain) -> None:
        """Hand this chat over to the App for the next one, with the text in the box (not sent) carried on."""
        draft = self.query_one("#prompt", MessageBox).text
        self.shutdown()
        self.dismiss(replace(result, draft=draft))

    async def run_command(self, command: slash.Command) -> None:
        """Carry out a slash command."""
        from clover_local.tui.screens.modals import HelpScreen

        if command.name in ("/new", "/clear"):
            await self.new_chat()
        elif command.name == "/chats":
            self.action_open()
        elif command.name == "/model":
            self.action_model()
        elif command.name == "/save":
            self.action_save()
        elif command.name == "/help":
            self.app.push_screen(HelpScreen())
        elif command.name == "/system":
            if not command.argument:
                self.notify(f"System prompt: {self.system_prompt or '(none)'}", timeout=8)
                return
            self.system_prompt = command.argument
            self.journal.set_system_prompt(command.argument)
            self._save_settings(replace(self.model_settings, system_prompt=command.argument))
            self.notify("System prompt set for this chat, and saved for this model.", timeout=4)
        elif command.name == "/set":
            try:
                changes: dict[str, object] = {command.setting: command.value}
                new = replace(self.model_settings, **changes).validated()  # type: ignore[arg-type]
            except CloverError as exc:
                self.notify(str(exc), severity="warning", timeout=8)
                return
            self._save_settings(new)
            self.notify(f"{command.setting} = {command.value}, saved for this model.", timeout=4)

    # Keeping the chat

    def _store_failed(self, exc: CloverError) -> None:
        """A write to the chat store failed (called on the journal's thread): said, the chat goes on."""
        with contextlib.suppress(RuntimeError):  # the app is gone
            self.app.call_from_thread(self.notify, str(exc), severity="error", timeout=15)

    def on_unmount(self) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        """Before the app quits or the model changes: stop the reply, keep what it wrote, finish writing.
        Called again (the screen unmounting after the App asked), it writes nothing more."""
        if self._reply is not None and not self._shut:
            self._cancel.set()
            partial = self._reply.raw_text
            if partial.strip():
                self.journal.put(len(self.history), ChatMessage("assistant", partial))
        self._shut = True
        self.queue.close()
        self.journal.close()


@dataclass
class SummarySink:
    """A summary's items from the engine's thread: its text shown as it comes, then all of it handed to the
    screen at :data:`END`."""

    screen: ChatScreen
    reply: ReplyView
    text: str
    parts: list[str] = field(default_factory=list)
    error: str | None = None

    def post(self, item: object) -> None:
        if isinstance(item, TextDelta):
            self.parts.append(item.text)
            self.reply.post_message(ReplyView.Delta(item.text))
        elif isinstance(item, BaseException):
            self.error = str(item)
        elif item is END:
            summary = strip_thinking("".join(self.parts)).strip()
            self.screen.post_message(ChatScreen.Summarized(self.reply, summary, self.text, self.error))
