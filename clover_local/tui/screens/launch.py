"""Launch: load the model with progress, then say what went where, any fallback, and the llama-server command.

Dismisses with the opened engine (the person chose to chat) or None (back to the plan after a failed load); the
App decides what comes next."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, ProgressBar, Static
from textual.worker import get_current_worker

from clover_local.errors import CloverError
from clover_local.facts import LaunchFacts
from clover_local.launch import Launch, OpenedEngine, open_launch, with_model_file
from clover_local.presets import Preset
from clover_local.tui import services
from clover_local.user_prefs import ModelSettings


class LaunchScreen(Screen[OpenedEngine | None]):
    """Loads ``model_path`` in a worker; on success offers (or goes straight to) the chat."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("c", "copy_command", "Copy llama-server cmd", id="launch.copy"),
        Binding("enter", "chat", "Chat", id="launch.chat"),
        Binding("escape", "back", "Back to plan", id="launch.back"),
    ]

    @dataclass
    class Progress(Message, bubble=False):
        fraction: float

    @dataclass
    class Planned(Message, bubble=False):
        """The launch decided for this machine and the person's settings (its command can be shown)."""

        launch: Launch

    @dataclass
    class Ready(Message, bubble=False):
        loaded: OpenedEngine | None
        error: str | None

    def __init__(
        self,
        model_path: str,
        preset: Preset,
        model_settings: ModelSettings,
        launch: Launch | None = None,
        *,
        auto_continue: bool = False,
        rpc: str | None = None,
        force: bool = False,
        facts: LaunchFacts | None = None,
    ) -> None:
        super().__init__()
        self.rpc = rpc
        """Workers (``--rpc``) to plan with when no launch is given; a plan with workers runs in llama-server."""
        self.force = force
        """Plan the file even when the llama.cpp here cannot load its architecture (``chat --force``)."""
        self.facts = facts
        """What the command read about the file already (``chat``): the launch is decided from them."""
        self.model_path = model_path
        self.preset = preset
        self.model_settings = model_settings
        self.shown = launch
        """The plan screen's launch, if any: opened as shown, run from ``model_path`` once downloaded
        (``launch.with_model_file``); without one the launch is decided here for ``model_settings``."""
        self.launch: Launch | None = None
        self.auto_continue = auto_continue
        self.loaded: OpenedEngine | None = None
        self.failed = False
        self.command = ""

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="launch-body"):
            yield Static(f"Loading {self.model_path}", id="launch-title", markup=False)
            yield ProgressBar(total=1.0, show_eta=False, id="load-progress")
            yield Static("", id="launch-placement", markup=False)
            yield Static("", id="launch-fallback", markup=False)
            yield Static("Equivalent llama-server command (c copies):", classes="section-title")
            yield Static("", id="launch-command", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Chat", variant="primary", id="launch-chat", disabled=True, action="screen.chat")
        yield Footer()

    def on_mount(self) -> None:
        self._show_command()
        # After the first paint: planning and loading run Python (headers, llama_cpp's import) that would
        # otherwise hold the GIL while Textual draws this screen.
        self.call_after_refresh(self._load)

    def _show_command(self) -> None:
        self.command = self.launch.command if self.launch is not None else "(planning for this machine…)"
        self.query_one("#launch-command", Static).update(self.command)

    def on_launch_screen_planned(self, message: Planned) -> None:
        self.launch = message.launch
        self._show_command()

    @work(thread=True, exclusive=True, group="load")
    def _load(self) -> None:
        worker = get_current_worker()

        def progress(fraction: float) -> None:
            if not worker.is_cancelled:
                self.post_message(LaunchScreen.Progress(float(fraction)))

        try:
            if self.shown is not None:
                launch = with_model_file(self.shown, self.model_path)
            else:
                launch = services.launch_for(
                    self.preset,
                    self.model_path,
                    self.model_settings,
                    rpc=self.rpc,
                    force=self.force,
                    facts=self.facts,
                )
            self.post_message(LaunchScreen.Planned(launch))
            loaded = open_launch(launch, progress=progress)
        except CloverError as exc:
            self.post_message(LaunchScreen.Ready(None, str(exc)))
            return
        if worker.is_cancelled:
            loaded.engine.close()
            return
        self.post_message(LaunchScreen.Ready(loaded, None))

    def on_launch_screen_progress(self, message: Progress) -> None:
        self.query_one("#load-progress", ProgressBar).update(progress=min(max(message.fraction, 0.0), 1.0))

    def on_launch_screen_ready(self, message: Ready) -> None:
        if message.error or message.loaded is None:
            self.failed = True
            self.query_one("#launch-title", Static).update("Could not load the model (Esc: back to the plan)")
            self.query_one("#launch-placement", Static).update(message.error or "")
            self.query_one("#launch-placement", Static).add_class("error")
            self.refresh_bindings()
            return
        self.loaded = message.loaded
        self.launch = message.loaded.launch  # after an out-of-memory re-plan: the launch that loaded
        self._show_command()
        self.query_one("#load-progress", ProgressBar).update(progress=1.0)
        self.query_one("#launch-title", Static).update(f"Loaded {message.loaded.engine.model_name}")
        self.query_one("#launch-placement", Static).update(message.loaded.placement)
        if message.loaded.fallback_message:
            fallback = self.query_one("#launch-fallback", Static)
            fallback.update(message.loaded.fallback_message)
            fallback.add_class("warning")
        self.refresh_bindings()
        button = self.query_one("#launch-chat", Button)
        button.disabled = False
        button.focus()
        if self.auto_continue:
            self.action_chat()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Chat once loaded; back to the plan once failed (the footer offers only what works)."""
        if action == "chat":
            return self.loaded is not None
        if action == "back":
            return self.failed
        return True

    def action_chat(self) -> None:
        if self.loaded is not None:
            self.dismiss(self.loaded)

    def action_back(self) -> None:
        """After a failed load: back to the plan screen to choose differently."""
        if self.failed:
            self.dismiss(None)

    def action_copy_command(self) -> None:
        self.app.copy_to_clipboard(self.command)
        self.notify("llama-server command copied.", timeout=3)
