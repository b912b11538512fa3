"""The clover-local app: from a bare machine to a running chat, and the chat itself afterwards.

The App owns the flow: screens return results (``dismiss``) and :meth:`CloverApp.run_flow` chains them,
plan -> download -> launch -> chat, going back to the plan after a cancelled download or a failed load. A GGUF
given on the command line (or remembered from the first run) starts at the launch screen. No screen imports the
App.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import App
from textual.binding import Binding, BindingType

from clover_local import model_files, user_files, user_prefs
from clover_local.compare.options import CompareOptions
from clover_local.compare.report import CompareReport
from clover_local.detect.machine import Machine
from clover_local.facts import LaunchFacts
from clover_local.launch import Launch, LaunchRequest
from clover_local.plan.speculation import SpecMode
from clover_local.plan.types import Plan
from clover_local.presets import Preset, load_preset
from clover_local.tui import services
from clover_local.tui.services import LoadAgain, ModelChoice


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
    spec: SpecMode | None = None
    """``--spec``: the speculation mode for this session (None: the saved setting)."""
    force: bool = False
    """``--force``: load a GGUF whose architecture the llama.cpp here cannot load (checked first)."""
    facts: LaunchFacts | None = None
    """What ``chat`` read about ``model_path`` before the app started (``facts.gather_facts``): its launch is
    decided from them, not read again."""
    compare: tuple[str, ...] | None = None
    """``compare --app``: open at the Compare screen with these contenders (the app closes after it)."""
    compare_tasks: str = "builtin"
    compare_options: CompareOptions = field(default_factory=CompareOptions)
    """``compare --app``'s options (``--temperature``, ``--repeat``, ``--max-tokens``, ``--ctx``, ``--engine``,
    ``--key-env``...), as the command runs them."""
    compare_report: Path | None = None
    """``--json`` (or ``--resume``) FILE: where the report is written as it runs."""
    compare_previous: CompareReport | None = None
    """``--resume``: the interrupted run, whose finished tasks are kept and not run again."""


class CloverApp(App[None]):
    CSS_PATH = Path(__file__).with_name("clover.tcss")
    TITLE = "clover-local"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("f1", "help", "Help", id="app.help"),
        Binding("f3", "runtimes", "Runtimes", id="app.runtimes"),
        Binding("f4", "compare", "Compare", id="app.compare", show=False),
        Binding("ctrl+q", "quit", "Quit", id="app.quit", priority=True, show=False),
    ]

    def __init__(self, options: StartOptions | None = None, *, machine: Machine | None = None) -> None:
        super().__init__()
        self.options = options or StartOptions()
        self.machine = machine
        """A fixed machine (tests, snapshots); None: detect (or simulate) on the plan screen."""
        self.prefs = user_prefs.load_prefs()
        self.last_compare: CompareReport | None = None
        """The report of the last comparison run in the Compare screen."""

    def on_mount(self) -> None:
        try:
            self._start()
        finally:
            for notice in user_files.take_notices():  # a damaged settings file or preset, set aside
                self.notify(notice, title="A file was set aside", severity="warning", timeout=30)

    def _start(self) -> None:
        if self.prefs.theme and self.prefs.theme in self.available_themes:
            self.theme = self.prefs.theme
        self.theme_changed_signal.subscribe(
            self, lambda theme: self._save_prefs(replace(user_prefs.load_prefs(), theme=theme.name))
        )
        opts = self.options
        first = self.prefs.first_run
        if opts.compare is not None:
            self.run_compare_flow(opts, then_exit=True)
        elif opts.model_path and opts.preset:
            self.run_flow(load_preset(opts.preset), opts.model_path)
        elif opts.model_path:
            self.run_flow(load_preset(None), choice=ModelChoice(path=opts.model_path, remember=False))
        elif first.complete and not opts.preset and not opts.simulate:
            if first.kind == "file":
                self.run_flow(load_preset(None), choice=ModelChoice(path=first.model_path, remember=False))
            else:
                self.run_flow(load_preset(first.preset or None), first.model_path)
        else:
            self.run_flow(load_preset(opts.preset))

    @work(exclusive=True, group="flow")
    async def run_flow(
        self, preset: Preset, model_path: str | None = None, *, choice: ModelChoice | None = None
    ) -> None:
        """plan -> download -> launch -> chat, and again for each model picked in the chat. With
        ``model_path`` (the preset's file, given or remembered) it starts at the launch and goes straight on
        to chat, its settings saved under the preset's name. A ``choice`` (a file, or a preset, picked on any
        screen) is opened with its own settings."""
        from clover_local.tui.screens.chat import ChatScreen
        from clover_local.tui.screens.download import DownloadScreen
        from clover_local.tui.screens.launch import LaunchScreen
        from clover_local.tui.screens.plan import PlanScreen

        launch: Launch | None = None
        """The plan screen's launch: downloaded, then opened as shown (not decided again)."""
        plan: Plan | None = None
        direct = model_path is not None
        key: str | None = None  # what the model's settings are saved under (None: the preset's name)
        defaults: user_prefs.ModelSettings | None = None
        title = ""
        first: user_prefs.FirstRun | None = None  # the next start's model, remembered once it has loaded
        carried: LoadAgain | None = None  # the last chat's conversation and unsent text, for the next chat
        while True:
            if choice is not None:
                target = await self._open_choice(choice)
                preset, model_path, key, defaults, title, first = target
                choice, launch, plan, direct = None, None, None, model_path is not None
            if model_path is None:
                request = self._plan_request(preset)
                picked = await self.push_screen_wait(
                    PlanScreen(
                        preset, self.machine, simulate=self.options.simulate, initial=plan, request=request
                    )
                )
                if isinstance(picked, ModelChoice):  # a typed-in file is opened with its own settings
                    choice = picked
                    continue
                launch, plan = picked, picked.plan
                downloaded = await self.push_screen_wait(DownloadScreen(preset, plan))
                if isinstance(downloaded, ModelChoice):  # offline: the demo model or one on disk
                    choice = downloaded
                    continue
                if downloaded is None:
                    continue
                model_path = downloaded
                first = user_prefs.FirstRun(
                    preset=preset.name, quant=plan.quant, ctx=plan.ctx, model_path=downloaded
                )
                key, defaults, title = None, None, ""
            key = key or preset.name
            settings = self._settings_for(key, preset, plan, defaults)
            screen = LaunchScreen(
                model_path,
                preset,
                settings,
                launch,
                auto_continue=direct,
                rpc=self.options.rpc,
                force=self.options.force,
                facts=self.options.facts if model_path == self.options.model_path else None,
            )
            opened = await self.push_screen_wait(screen)
            if opened is None:  # the load failed: back to the plan, and the next start does not try it again
                self._forget_first_run(model_path)
                model_path, direct, launch, first = None, False, None, None
                continue
            if first is not None:
                self._save_prefs(user_prefs.load_prefs().with_first_run(first))
                first = None
            chat = ChatScreen(
                opened.engine,
                key,
                settings,
                info=opened.fallback_message or "",
                title=title or preset.display_name,
                carried=carried,
            )
            carried = None
            switch = await self.push_screen_wait(chat)
            await asyncio.to_thread(opened.engine.close)
            if switch is None:
                return
            if isinstance(switch, LoadAgain):  # its runner was given up: the same launch, the same chat
                carried, direct = switch, True
                continue
            carried = LoadAgain(None, switch.draft) if switch.draft.strip() else None
            choice, model_path, key, defaults, title = switch, None, None, None, ""

    def _plan_request(self, preset: Preset) -> LaunchRequest:
        """What the plan screen plans with besides its own choices: the speculation mode the chat will use
        (``--spec``, else the model's saved one), ``--ctx`` while its context is ``auto``, ``--rpc`` and
        ``--force``, so its launch is the one the launch screen opens."""
        spec = self._settings_for(preset.name, preset, None).spec_mode
        opts = self.options
        return LaunchRequest(preset, ctx=opts.ctx, spec=spec, rpc=opts.rpc, force=opts.force)

    async def _open_choice(
        self, choice: ModelChoice
    ) -> tuple[Preset, str | None, str, user_prefs.ModelSettings | None, str, user_prefs.FirstRun | None]:
        """What a picked model opens: its preset, its file (None: not on disk, plan and download it), the key its
        settings are saved under, its first-time settings, the chat's title, and what the next start goes to
        once it has loaded (None: the choice is not to be remembered)."""
        if choice.path is not None:
            path = choice.path
            preset, key, matched = services.preset_and_key_for_file(path)
            defaults = await asyncio.to_thread(services.settings_for_file, path, preset, matched)
            kept = user_prefs.FirstRun(preset=preset.name, ctx=defaults.ctx, model_path=path, kind="file")
            title = preset.display_name if matched else Path(path).name
            return preset, path, key, defaults, title, (kept if choice.remember else None)
        preset = load_preset(choice.preset)
        found = await asyncio.to_thread(model_files.find_model, preset)
        if found is None:  # not on disk: plan and download it
            return preset, None, preset.name, None, preset.display_name, None
        first = user_prefs.FirstRun(preset=preset.name, model_path=str(found)) if choice.remember else None
        return preset, str(found), preset.name, None, preset.display_name, first

    def _settings_for(
        self, key: str, preset: Preset, plan: Plan | None, defaults: user_prefs.ModelSettings | None = None
    ) -> user_prefs.ModelSettings:
        """The model's saved settings (else ``defaults``, else the preset's), with the plan screen's context
        (the launch opened), else the one given on the command line, else (nothing saved for it) the one its first
        run loaded with, and the speculation mode given with ``--spec``."""
        self.prefs = user_prefs.load_prefs()  # what the last chat saved
        if key in self.prefs.models or defaults is None:
            settings = self.prefs.settings_for(key, preset)
        else:
            settings = defaults
        first = self.prefs.first_run
        if plan is not None:
            settings = replace(settings, ctx=plan.ctx)
        elif self.options.ctx:
            settings = replace(settings, ctx=self.options.ctx)
        elif key not in self.prefs.models and first.complete and first.preset == preset.name and first.ctx:
            settings = replace(settings, ctx=first.ctx)  # what the first run planned and loaded
        if self.options.spec and self.options.spec != "auto":
            settings = replace(settings, spec_mode=self.options.spec)
        return settings

    def _forget_first_run(self, model_path: str) -> None:
        """A remembered model that failed to load: the next plain start goes to the plan, not to it again."""
        prefs = user_prefs.load_prefs()
        if prefs.first_run.model_path == model_path:
            self._save_prefs(prefs.with_first_run(user_prefs.FirstRun()))

    def action_compare(self) -> None:
        """The Compare screen, over whatever is shown; not while a chat holds a loaded model (compare loads each
        model in turn, never beside another)."""
        from clover_local.tui.screens.chat import ChatScreen
        from clover_local.tui.screens.compare import CompareScreen
        from clover_local.tui.screens.launch import LaunchScreen

        if any(isinstance(s, CompareScreen) for s in self.screen_stack):
            return
        if any(isinstance(s, ChatScreen | LaunchScreen) for s in self.screen_stack):
            self.notify(
                "Compare loads each model in turn, never beside another: leave the loaded model first "
                "(or run clover-local compare).",
                severity="warning",
            )
            return
        self.run_compare_flow(StartOptions(), then_exit=False)

    @work(exclusive=True, group="compare-flow")
    async def run_compare_flow(self, opts: StartOptions, *, then_exit: bool) -> None:
        """The Compare screen with ``opts``' contenders (run at once when there are some), tasks and options, until
        the person leaves it; its report is kept in :attr:`last_compare`."""
        from clover_local.tui.screens.compare import CompareScreen

        contenders = opts.compare or ()
        screen = CompareScreen(
            contenders,
            opts.compare_tasks,
            options=opts.compare_options,
            auto_start=bool(contenders),
            report_path=opts.compare_report,
            previous=opts.compare_previous,
        )
        self.last_compare = await self.push_screen_wait(screen)
        if then_exit:
            self.exit()

    def action_help(self) -> None:
        from clover_local.tui.screens.modals import HelpScreen

        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_runtimes(self) -> None:
        from clover_local.tui.screens.runtimes import RuntimesScreen

        if not isinstance(self.screen, RuntimesScreen):
            self.push_screen(RuntimesScreen(), self._after_runtimes)

    def _after_runtimes(self, installed: object) -> None:
        """A runtime installed from the Runtimes screen may be the one the plan below waits for: plan again."""
        from clover_local.tui.screens.plan import PlanScreen

        if installed is not None and isinstance(self.screen, PlanScreen):
            self.screen.read_again()

    def _save_prefs(self, prefs: user_prefs.Prefs) -> None:
        """Keep ``prefs`` (read just before and changed), saying a save that failed."""
        from clover_local.errors import CloverError

        self.prefs = prefs
        try:
            user_prefs.save_prefs(prefs)
        except CloverError as exc:
            self.notify(str(exc), severity="error")

    def on_unmount(self) -> None:
        from clover_local.tui.screens.chat import ChatScreen

        for screen in self.screen_stack:
            if isinstance(screen, ChatScreen):
                screen.action_stop()
                screen.shutdown()  # what the reply wrote so far is kept; every write finished


def run_app(options: StartOptions | None = None) -> int:
    """Run the app in this terminal until the person quits."""
    _log_to_file()
    CloverApp(options).run()
    return 0


def _log_to_file() -> None:
    """clover-local's log (a runner that stopped and its last lines, ...) to ``settings.log_path()``: the app draws
    on the terminal, so nothing may print there. A log that cannot be opened costs the log, never the app."""
    import logging
    import logging.handlers

    from clover_local import settings

    path = settings.log_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.handlers.RotatingFileHandler(
            path, maxBytes=1_000_000, backupCount=2, encoding="utf-8"
        )
    except OSError:
        handler = logging.NullHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    root = logging.getLogger("clover_local")
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    root.propagate = False
