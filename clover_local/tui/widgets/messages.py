"""The chat transcript's pieces: a person's message, and a model reply that streams in as Markdown.

A reply is fed from a generation thread by posting :class:`ReplyView.Delta` messages to it (thread-safe,
non-blocking, so the UI never slows the engine). It splits the model's ``<think>`` text into a collapsed
"Thinking" section and writes both parts through ``Markdown.get_stream()``, which batches appends when tokens
arrive faster than the widget can render.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.widgets import Collapsible, Markdown, Static
from textual.widgets.markdown import MarkdownStream

from clover_local.engine.types import GenerationStats
from clover_local.tui.thinking import ThinkSplitter

FOLD_LINES = 12
"""A message longer than this many lines shows its first lines and a count; a click unfolds it."""
FOLD_SHOWN = 6


class UserMessage(Static):
    """What the person typed, shown as plain text (never parsed as markup). A long paste is shown folded
    (``[pasted 120 lines: click to show all]``); it is sent whole either way."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.folded = text.count("\n") + 1 > FOLD_LINES
        super().__init__(self._shown(), markup=False, classes="user-message")
        self.border_title = "You"

    def _shown(self) -> str:
        if not self.folded:
            return self.text
        lines = self.text.split("\n")
        return "\n".join([*lines[:FOLD_SHOWN], f"[pasted {len(lines)} lines: click to show all]"])

    def on_click(self) -> None:
        if self.text.count("\n") + 1 > FOLD_LINES:
            self.folded = not self.folded
            self.update(self._shown())

    def mark_failed(self, why: str) -> None:
        """The turn failed: the message stays on screen, marked, and is not part of the conversation."""
        self.add_class("-failed")
        self.border_subtitle = why


class ReplyView(Vertical):
    """One model reply. Streams while generating; afterwards holds the final answer text."""

    @dataclass
    class Delta(Message, bubble=False):
        """New text from the engine (posted from the generation thread)."""

        text: str

    @dataclass
    class Refine(Message, bubble=False):
        """A diffusion step: the reply as it stands, masks included (posted from the generation thread)."""

        text: str
        step: int
        total_steps: int

    @dataclass
    class Prompting(Message, bubble=False):
        """The prompt is being read (posted from the generation thread before the first token)."""

        tokens: int
        eta_s: float | None

    @dataclass
    class Dropped(Message):
        """The oldest ``count`` messages were left out of the context so the prompt fits (bubbles to the chat)."""

        count: int

    @dataclass
    class Done(Message, bubble=False):
        """The engine finished, was stopped, or failed (posted from the generation thread)."""

        stats: GenerationStats | None
        error: str | None
        _: KW_ONLY
        context_full: bool = False

    @dataclass
    class Completed(Message):
        """Everything received is on screen: the chat may record the reply and start the next one."""

        reply: ReplyView
        stats: GenerationStats | None
        error: str | None
        _: KW_ONLY
        context_full: bool = False

    def __init__(self, text: str = "", *, streaming: bool = True) -> None:
        super().__init__(classes="reply")
        self.border_title = "Model"
        self.splitter = ThinkSplitter()
        self.streaming = streaming
        self.deltas_shown = 0
        """Pieces of text written to the screen so far (the chat batches tokens into pieces)."""
        self._initial = text
        self._answer_stream: MarkdownStream | None = None
        self._thinking_stream: MarkdownStream | None = None

    def compose(self) -> ComposeResult:
        if self._initial:
            self.splitter.feed(self._initial)
            self.splitter.flush()
        thinking = self.splitter.thinking
        with Collapsible(
            title="Thinking", collapsed=True, classes="thinking" + ("" if thinking else " -empty")
        ):
            yield Markdown(thinking, classes="thinking-text")
        yield Markdown(self.splitter.answer, classes="answer")
        yield Static("", classes="canvas -empty", markup=False)

    def on_mount(self) -> None:
        if self.streaming:
            self.add_class("-streaming")
            self._answer_stream = Markdown.get_stream(self.query_one(".answer", Markdown))

    @property
    def answer(self) -> str:
        return self.splitter.answer

    @property
    def raw_text(self) -> str:
        """Thinking and answer as the model wrote them (tags included), for saving."""
        thinking = self.splitter.thinking
        return (f"<think>{thinking}</think>" if thinking else "") + self.splitter.answer

    def on_reply_view_prompting(self, message: ReplyView.Prompting) -> None:
        if self.deltas_shown == 0:
            eta = (
                f" · about {message.eta_s:.0f} s" if message.eta_s is not None and message.eta_s >= 1 else ""
            )
            self.border_subtitle = f"reading the prompt: {message.tokens} tokens{eta}"

    async def on_reply_view_delta(self, message: ReplyView.Delta) -> None:
        if self.deltas_shown == 0:
            self.border_subtitle = ""
        self.deltas_shown += 1
        await self._write(self.splitter.feed(message.text))

    def on_reply_view_refine(self, message: ReplyView.Refine) -> None:
        """Show the diffusion canvas being refined in place, below the settled text."""
        canvas = self.query_one(".canvas", Static)
        canvas.remove_class("-empty")
        canvas.update(message.text)
        self.border_subtitle = f"diffusion step {message.step + 1}/{message.total_steps}"

    async def on_reply_view_done(self, message: ReplyView.Done) -> None:
        canvas = self.query_one(".canvas", Static)
        canvas.update("")
        canvas.add_class("-empty")
        self.border_subtitle = ""
        try:
            await self._write(self.splitter.flush())
        finally:
            await self._stop_streams()
            self.streaming = False
            self.remove_class("-streaming")
        if message.stats is not None and message.stats.finish_reason == "cancelled":
            self.border_subtitle = "stopped"
        if message.error:
            self.border_subtitle = "failed"
            await self.mount(Static(message.error, markup=False, classes="error"))
        self.post_message(
            ReplyView.Completed(self, message.stats, message.error, context_full=message.context_full)
        )

    async def on_unmount(self) -> None:
        await self._stop_streams()

    async def _write(self, parts: Sequence[tuple[str, str]]) -> None:
        for part, text in parts:
            if part == "thinking":
                if self._thinking_stream is None:
                    self.query_one(".thinking", Collapsible).remove_class("-empty")
                    self._thinking_stream = Markdown.get_stream(self.query_one(".thinking-text", Markdown))
                await self._thinking_stream.write(text)
            elif self._answer_stream is not None:
                await self._answer_stream.write(text)

    async def _stop_streams(self) -> None:
        for stream in (self._thinking_stream, self._answer_stream):
            if stream is not None:
                await stream.stop()
        self._thinking_stream = self._answer_stream = None
