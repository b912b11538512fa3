"""Helpers for the TUI tests: a host app for one screen, and an engine for pictures that never generates."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence

from textual.app import App
from textual.screen import Screen

from clover_local.engine.types import (
    ChatMessage,
    GenerationEvent,
    GenerationRequest,
    RunnerHealth,
    ToolFormat,
)
from clover_local.tui.app import CloverApp


class ScreenHost(App[None]):
    """The app's stylesheet around one screen built by ``make_screen`` (a screen under test)."""

    CSS_PATH = CloverApp.CSS_PATH

    def __init__(
        self, make_screen: Callable[[], Screen[object]], on_result: Callable[[object], None] | None = None
    ) -> None:
        super().__init__()
        self._make_screen = make_screen
        self._on_result = on_result
        """Gets what the screen hands back when it is dismissed."""

    def on_mount(self) -> None:
        self.push_screen(self._make_screen(), self._on_result)


class StillEngine:
    """A ``ChatEngine`` for snapshot tests, which show a saved conversation and never generate: its name and
    context are those of the Gemma test model loaded with a 1024-token context, so the pictures are the same
    without loading a model. Generating is a test bug and fails loudly."""

    model_name = "Gemma 3 270m"
    n_ctx = 1024
    tool_format: ToolFormat = "hermes"
    slots = 1
    submit = None

    def count_tokens(self, text: str) -> int:
        return len(text.split())

    def check_request(self, request: GenerationRequest) -> None:
        """Nothing is refused up front."""

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str | None:
        return None

    def health(self) -> RunnerHealth:
        return RunnerHealth()  # in this process: always ready

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        raise AssertionError("a snapshot test asked the still engine to generate")

    def close(self) -> None:
        pass


def steady_cursors(app: App[object]) -> None:
    """Stop every input's cursor from blinking, shown, so a picture does not depend on when it is taken (the
    blink flips every 0.5 s, and a busy machine takes pictures late)."""
    from textual.widgets import Input, TextArea

    for screen in app.screen_stack:
        for field in screen.query(Input):
            field.cursor_blink = False  # Input then shows the cursor steadily
        for area in screen.query(TextArea):
            area.cursor_blink = False
