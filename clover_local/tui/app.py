"""The clover-local app: from a bare machine to a running chat, and the chat itself afterwards.

Start-up decides the first screen: a GGUF given on the command line (or remembered from the first run) goes
to the launch screen and on to chat; otherwise the machine-and-plan screen starts the first-run flow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.theme import Theme

from clover_local import user_prefs
from clover_local.detect.machine import Machine
from clover_local.plan.types import Plan
from clover_local.presets import Preset, load_preset
from clover_local.tui import services


@dataclass(frozen=True)
class StartOptions:
    """How the app was started (command-line choices)."""

    preset: str | None = None
    model_path: str | None = None
    """A local GGUF: skip planning and download, load it and chat."""
    simulate: str | None = None
    """Plan for a described machine (``--simulate`` syntax) instead of this one."""
    ctx: int | None = None
    rpc: str | None = None
    """Workers lending devices over llama.cpp RPC (``--rpc``): the model then runs in llama-server."""


def model_key(preset: Preset, model_path: str | None, *, preset_chosen: bool = True) -> str:
    """What per-model settings are saved under: the preset's name, or the GGUF's file name when a file was
    given without a preset (its settings then belong to that file, not to the default preset)."""
    if model_path and not preset_chosen:
        return Path(model_path).name
    return preset.name


class CloverApp(App[None]):
    CSS_PATH = Path(__file__).with_name("clover.tcss")
    TITLE = "clover-local"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f1", "help", "Help", id="app.help"),
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True, show=False),
    ]

    def __init__(self, options: StartOptions | None = None, *, machine: Machine | None = None) -> None:
        super().__init__()
        self.options = options or StartOptions()
        self.machine = machine
        """A fixed machine (tests, snapshots); None: detect (or simulate) on the plan screen."""
        self.prefs = user_prefs.load_prefs()

    def on_mount(self) -> None:
        if self.prefs.theme and self.prefs.theme in self.available_themes:
            self.theme = self.prefs.theme
        self.theme_changed_signal.subscribe(self, self._remember_theme)
        opts = self.options
        first = self.prefs.first_run
        if opts.model_path:
            preset = load_preset(opts.preset or _preset_for_file(opts.model_path))
            key = model_key(preset, opts.model_path, preset_chosen=bool(opts.preset))
            self.launch(opts.model_path, preset, auto_continue=True, key=key)
        elif first.complete and not opts.preset and not opts.simulate:
            self.launch(first.model_path, load_preset(first.preset or None), auto_continue=True)
        else:
            from clover_local.tui.screens.plan import PlanScreen

            self.push_screen(PlanScreen(load_preset(opts.preset), self.machine, simulate=opts.simulate))

    def launch(
        self,
        model_path: str,
        preset: Preset,
        plan: Plan | None = None,
        *,
        auto_continue: bool = False,
        key: str | None = None,
    ) -> None:
        """Load a model (launch screen), then chat with it; ``key`` names its saved settings."""
        from clover_local.tui.screens.launch import LaunchScreen

        key = key or preset.name
        settings = self.prefs.settings_for(key, preset)
        if self.options.ctx:
            settings = replace(settings, ctx=self.options.ctx)
        elif plan is not None:
            settings = replace(settings, ctx=plan.ctx)
        screen = LaunchScreen(
            model_path, preset, settings, plan, auto_continue=auto_continue, key=key, rpc=self.options.rpc
        )
        if len(self.screen_stack) > 1:
            self.switch_screen(screen)
        else:
            self.push_screen(screen)

    def remember_first_run(self, preset: Preset, quant: str, ctx: int, model_path: str) -> None:
        first = user_prefs.FirstRun(preset=preset.name, quant=quant, ctx=ctx, model_path=model_path)
        self.prefs = self.prefs.with_first_run(first)
        self._save_prefs()

    def open_chat(self, loaded: services.Loaded, key: str, settings: user_prefs.ModelSettings) -> None:
        from clover_local.tui.screens.chat import ChatScreen

        info = loaded.fallback_message or ""
        self.switch_screen(ChatScreen(loaded.engine, key, settings, info=info))

    def action_help(self) -> None:
        from clover_local.tui.screens.modals import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def _remember_theme(self, theme: Theme) -> None:
        self.prefs = replace(user_prefs.load_prefs(), theme=theme.name)
        self._save_prefs()

    def _save_prefs(self) -> None:
        from clover_local.errors import CloverError

        try:
            user_prefs.save_prefs(self.prefs)
        except CloverError as exc:
            self.notify(str(exc), severity="error")

    def on_unmount(self) -> None:
        from clover_local.tui.screens.chat import ChatScreen

        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                screen.action_stop()


def _preset_for_file(model_path: str) -> str | None:
    """The shipped test preset for the Gemma test file; otherwise the default preset."""
    name = Path(model_path).name.lower()
    return "gemma3-270m" if "gemma" in name and "270m" in name else None


def run_app(options: StartOptions | None = None) -> int:
    """Run the app in this terminal until the person quits."""
    CloverApp(options).run()
    return 0
