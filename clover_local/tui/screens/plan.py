"""Machine and plan: what was detected, what the planner recommends and why, where memory goes.

Changing the quant or the context re-plans at once (the planner is pure and fast). A local GGUF can be chosen
instead of downloading. Detection runs in a worker so the screen paints before any probe (or llama_cpp) loads.
Each plan is the plan of a launch (``launch.decide_launch``: the runner chosen first, the plan budgeted for it),
so what is shown is what runs. Dismisses with that :class:`Launch` (download its quant, then run it), or with a
:class:`ModelChoice` (the demo model, a model on disk, a local GGUF typed in: opened with its own settings).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Collapsible, Footer, Input, Select, Static
from textual.worker import get_current_worker

from clover_local import model_files
from clover_local.detect.machine import Machine
from clover_local.detect.report import machine_summary
from clover_local.errors import CloverError
from clover_local.facts import LaunchFacts
from clover_local.fetch.describe import QuantDescriptions
from clover_local.launch import Launch, LaunchRequest, needs_community
from clover_local.launcher import Launcher
from clover_local.plan.planner import context_limit
from clover_local.plan.reasons import folded_reasons, leading_reasons
from clover_local.plan.render import plan_summary
from clover_local.plan.types import Plan
from clover_local.presets import Preset
from clover_local.runtimes.installed import InstalledRuntime
from clover_local.tui import services
from clover_local.tui.services import ModelChoice
from clover_local.tui.widgets.memory import MemoryView, legend

CTX_CHOICES = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
NARROW_WIDTH = 110


class PlanScreen(Screen[Launch | ModelChoice]):
    """The first-run screen: choose quant and context (or a local GGUF), then download or launch; or chat at
    once with the demo model or a model already on disk (no network needed)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "download", "Download", id="plan.download"),
        Binding("l", "focus_local", "Local GGUF", id="plan.local"),
        Binding("m", "demo", "Demo model", id="plan.demo"),
        Binding("o", "on_disk", "Models on disk", id="plan.on_disk"),
        Binding("i", "install_runtime", "Install llama.cpp", id="plan.install"),
    ]

    @dataclass
    class MachineReady(Message, bubble=False):
        machine: Machine | None
        error: str | None

    @dataclass
    class FactsRead(Message, bubble=False):
        """The facts of the current choices (or the community quants) were read by a worker, into the launcher;
        or reading them failed: ``error``."""

        error: str | None = None

    @dataclass
    class ModelsDescribed(Message, bubble=False):
        """Each quant's sizes, exact where a file or the Hub's GGUF header could be read."""

        models: QuantDescriptions

    def __init__(
        self,
        preset: Preset,
        machine: Machine | None = None,
        *,
        simulate: str | None = None,
        initial: Plan | None = None,
        request: LaunchRequest | None = None,
    ) -> None:
        super().__init__()
        self.preset = preset
        self.request = request or LaunchRequest()
        """What the person asked beyond this screen's choices (the speculation mode, ``--rpc``, ``--force``,
        ``--ctx`` while the context is ``auto``); the screen sets the preset, quant, context and file."""
        self.initial = initial
        """A plan chosen before (back from a cancelled download): its quant and context are preselected."""
        self.machine = machine
        self.simulate = simulate
        self.launch: Launch | None = None
        """The launch shown (its plan, budgeted for its runner); what Download and run hands back."""
        self.model_path: str | None = None
        self.models: QuantDescriptions | None = None
        """Exact sizes per quant once the detection worker has read them; estimates until then."""
        self.plan_count = 0
        """How many plans were made (tests wait on it)."""
        self.installing: str | None = None
        """The release the Runtimes screen is installing for this plan (the install key opened it), else None."""
        self.launcher = Launcher(machine=machine)
        """Owns what the plans are decided from: facts read by a worker, kept while the choices change only the
        quant or context (decided on the UI thread, nothing read); read again when sizes, community quants or
        a runtime arrive."""
        self._community_asked = False

    def compose(self) -> ComposeResult:
        yield Static(
            f"{self.preset.display_name}: plan for this machine", id="plan-title", classes="section-title"
        )
        quants = [("quant: auto", "auto"), *((f"quant: {q}", q) for q in self.preset.quants)]
        ctxs = [
            ("ctx: auto", 0),
            *((f"ctx: {c:,}", c) for c in CTX_CHOICES if c <= context_limit(self.preset)),
        ]
        with Horizontal(id="plan-controls"):
            quant, ctx = self._initial_choices()
            yield Select(quants, value=quant, allow_blank=False, id="quant")
            yield Select(ctxs, value=ctx, allow_blank=False, id="ctx")
            yield Input(placeholder="or a local .gguf path, then Enter", id="local-path")
        with VerticalScroll(id="plan-body"), Horizontal(id="plan-columns"):
            yield Static("Detecting this machine…", id="machine-panel", markup=False)
            with Vertical(id="plan-panel"):
                yield Static("", id="plan-summary", markup=False)
                yield Vertical(id="memory-bars")
                yield Static(legend(), classes="muted")
                yield Static("Why", classes="section-title")
                yield Static("", id="plan-reasons", markup=False)
                with Collapsible(title="More reasons", id="plan-more"):  # folded: the leading ones decide
                    yield Static("", id="plan-more-reasons", markup=False)
                yield Static("Alternatives", classes="section-title")
                yield Static("", id="plan-alternatives", markup=False)
        with Horizontal(id="plan-buttons"):
            yield Button(
                "Download and run",
                variant="primary",
                id="plan-download",
                disabled=True,
                action="screen.download",
            )
            yield Button("Run local file", id="plan-run-local", disabled=True, action="screen.run_local")
            install = Button(
                "Install llama.cpp", variant="warning", id="plan-install", action="screen.install_runtime"
            )
            install.display = False  # shown when the plan needs a release that is not installed
            yield install
        yield Footer()

    def _initial_choices(self) -> tuple[str, int]:
        plan = self.initial
        if plan is None:
            return "auto", 0
        quant = plan.quant if plan.quant in self.preset.quants else "auto"
        ctx = plan.ctx if plan.ctx in CTX_CHOICES and plan.ctx <= context_limit(self.preset) else 0
        return quant, ctx

    def on_mount(self) -> None:
        self.query_one("#plan-columns").set_class(self.app.size.width < NARROW_WIDTH, "-narrow")
        if self.machine is not None:
            self._machine_ready(self.machine)
        else:
            self.call_after_refresh(self._detect)  # after the first paint (detection imports llama_cpp)

    def on_resize(self) -> None:
        self.query_one("#plan-columns").set_class(self.app.size.width < NARROW_WIDTH, "-narrow")

    @work(thread=True, exclusive=True, group="detect")
    def _detect(self) -> None:
        try:
            machine = model_files.detect(self.simulate, self.request.rpc, self.request.link)
        except CloverError as exc:
            self.post_message(PlanScreen.MachineReady(None, str(exc)))
            return
        self.post_message(PlanScreen.MachineReady(machine, None))
        if self.simulate is None and not get_current_worker().is_cancelled:
            # The plan shows at once from estimates; exact sizes (a downloaded file, else the GGUF header read
            # on the Hub with range requests, else the preset's estimate) replace them when read.
            from clover_local.fetch.describe import describe_quants

            self.post_message(PlanScreen.ModelsDescribed(describe_quants(self.preset)))

    def on_plan_screen_machine_ready(self, message: MachineReady) -> None:
        if message.machine is None:
            panel = self.query_one("#machine-panel", Static)
            panel.update(message.error or "Detection failed.")
            panel.add_class("error")
            return
        self._machine_ready(message.machine)

    @property
    def facts(self) -> LaunchFacts | None:
        """What the plan shown was decided from (None until a worker has read them)."""
        return self.launcher.facts

    def on_plan_screen_models_described(self, message: ModelsDescribed) -> None:
        self.models = message.models
        self.launcher.read_again(models=message.models)
        self.replan()

    def _machine_ready(self, machine: Machine) -> None:
        self.machine = machine
        self.launcher.read_again(machine=machine)
        self.query_one("#machine-panel", Static).update(machine_summary(machine))
        self.replan()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.replan()

    def _request(self) -> LaunchRequest:
        """What the current choices ask for."""
        quant = str(self.query_one("#quant", Select).value)
        ctx = int(self.query_one("#ctx", Select).value or 0) or self.request.ctx  # type: ignore[arg-type]
        return replace(
            self.request,
            preset=self.preset,
            model=self.model_path,
            repo=None,
            quant=quant,
            ctx=ctx,
            describe=False,
        )

    def replan(self) -> None:
        """Make the plan for the current choices and show it: decided here from the facts held (nothing read on
        the UI thread); when they do not answer for the choices (the first plan, a file typed in, something read
        again), a worker reads them first and the plan follows."""
        if self.machine is None:
            return
        request = self._request()
        try:
            launch = self.launcher.decide_now(request)
        except CloverError as exc:
            self._show_error(str(exc))
            return
        if launch is None:
            self._read_facts(request)
            return
        self.show_launch(launch)
        if not self._community_asked and needs_community(launch.request, launch.preset, launch.plan.fits):
            self._community_asked = True
            self._find_community(launch)

    def _show_error(self, text: str) -> None:
        self.launch = None
        self.query_one("#plan-summary", Static).update(text)
        self.query_one("#plan-summary", Static).add_class("error")
        self.query_one("#plan-download", Button).disabled = True
        self.plan_count += 1

    @work(thread=True, exclusive=True, group="facts")
    def _read_facts(self, request: LaunchRequest) -> None:
        """Read the facts ``request`` is decided from (headers, the architecture tables, llama-server's
        ``--help``), then plan again on the UI thread."""
        try:
            self.launcher.facts_for(request)
        except CloverError as exc:
            if not get_current_worker().is_cancelled:
                self.post_message(PlanScreen.FactsRead(str(exc)))
            return
        if not get_current_worker().is_cancelled:
            self.post_message(PlanScreen.FactsRead())

    def on_plan_screen_facts_read(self, message: FactsRead) -> None:
        if message.error is not None:
            self._show_error(message.error)
            return
        self.replan()

    @work(thread=True, exclusive=True, group="community")
    def _find_community(self, launch: Launch) -> None:
        """The community repos' smaller quants for a plan that does not fit well (network: a listing per repo,
        a few headers); the plan is made again with them and names the best that fits."""
        facts = self.launcher.with_community(launch.request, launch)
        if not get_current_worker().is_cancelled and facts.community is not None:
            self.post_message(PlanScreen.FactsRead())

    @property
    def plan(self) -> Plan | None:
        """The plan shown: the launch's."""
        return self.launch.plan if self.launch is not None else None

    def show_launch(self, launch: Launch) -> None:
        self.launch = launch
        plan = launch.plan
        self.plan_count += 1
        summary = self.query_one("#plan-summary", Static)
        summary.update(plan_summary(plan))
        summary.set_class(not plan.fits, "error")
        bars = self.query_one("#memory-bars", Vertical)
        bars.remove_children()
        devices = [*plan.memory.gpus, plan.memory.ram]
        bars.mount_all([MemoryView(d, label=d.name.upper()) for d in devices])
        self.query_one("#machine-panel", Static).update(machine_summary(launch.machine, _llama_cpp(launch)))
        leading, folded = leading_reasons(plan.reasons), folded_reasons(plan.reasons)
        self.query_one("#plan-reasons", Static).update("\n".join(f"• {r.text}" for r in leading) or "-")
        more = self.query_one("#plan-more", Collapsible)
        more.title = f"{len(folded)} more reasons"
        more.display = bool(folded)
        self.query_one("#plan-more-reasons", Static).update("\n".join(f"• {r.text}" for r in folded))
        alts = [f"• {a.quant}: {a.why_not}" for a in plan.alternatives]
        self.query_one("#plan-alternatives", Static).update("\n".join(alts) or "-")
        install = self._install_tag()
        download = self.query_one("#plan-download", Button)
        download.label = "Run (on disk)" if self._quant_on_disk(plan) else "Download and run"
        download.disabled = self.model_path is not None or install is not None
        self.query_one("#plan-run-local", Button).disabled = self.model_path is None or install is not None
        button = self.query_one("#plan-install", Button)
        button.display = install is not None
        if install is not None and self.installing is None:
            button.label = f"Install llama.cpp {install} (i)"
        self.refresh_bindings()

    def _quant_on_disk(self, plan: Plan) -> bool:
        """The plan's quant is downloaded already (as the quants were described: no disk read here)."""
        described = self.models or (self.facts.quants if self.facts is not None else None)
        return described is not None and plan.quant in described.paths

    def _install_tag(self) -> str | None:
        """The release the plan says to install before this model can run (None: nothing to install)."""
        arch = self.plan.architecture if self.plan is not None else None
        return arch.install if arch is not None and not arch.supported else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "install_runtime":
            return self._install_tag() is not None and self.installing is None
        return True

    def action_install_runtime(self) -> None:
        """``i``: the Runtimes screen installs the release the plan names (progress, ``Esc`` cancels); when it
        returns, the plan is made again and names the runtime installed."""
        from clover_local.tui.screens.runtimes import RuntimesScreen

        tag = self._install_tag()
        if tag is None or self.installing is not None:
            return
        self.installing = tag
        self.refresh_bindings()
        self.app.push_screen(RuntimesScreen(install=tag), self._runtime_returned)

    def _runtime_returned(self, runtime: InstalledRuntime | None) -> None:
        self.installing = None
        if runtime is not None:
            self.notify(f"Installed {runtime.label}.", timeout=5)
        self.read_again()

    def read_again(self) -> None:
        """Plan again from facts read again (a runtime was installed: what loads the model has changed)."""
        self.launcher.read_again()
        self.replan()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        text = event.value.strip()
        if not text:
            self.model_path = None
            self.replan()
            return
        path = Path(text).expanduser()
        if not path.is_file() or path.suffix.lower() != ".gguf":
            self.notify(f"No .gguf file at {path}.", severity="error", timeout=5)
            return
        self.model_path = str(path.resolve())
        self.replan()

    def action_demo(self) -> None:
        self.dismiss(ModelChoice(preset=services.DEMO_PRESET))

    def action_on_disk(self) -> None:
        from clover_local.tui.screens.models import ModelPicker

        self.app.push_screen(ModelPicker(), self._picked)

    def _picked(self, choice: ModelChoice | None) -> None:
        if choice is not None:
            self.dismiss(choice)

    def action_focus_local(self) -> None:
        self.query_one("#local-path", Input).focus()

    def action_download(self) -> None:
        if self.launch is None or self.model_path is not None:
            return
        tag = self._install_tag()
        if tag is not None:  # nothing is downloaded that no llama.cpp here could run
            self.notify(
                f"This model needs llama.cpp {tag} or newer, which is not installed: i installs it first "
                "(m chats with the demo model meanwhile).",
                severity="warning",
                timeout=10,
            )
            return
        self.dismiss(self.launch)

    def action_run_local(self) -> None:
        if self.launch is not None and self.model_path is not None:
            self.dismiss(ModelChoice(path=self.model_path))


def _llama_cpp(launch: Launch) -> str | None:
    """The llama.cpp that runs ``launch``, for the machine panel (None: the pinned one, llama-cpp-python's): after
    a runtime install it is that runtime, not the pinned build the machine was detected with."""
    runner = launch.runner
    if runner.runtime is not None:
        return f"{runner.runtime} (installed runtime, its llama-server)"
    if runner.install is not None:
        return "none here loads this model yet (Runs with names the release)"
    if runner.binary is not None:
        return f"llama-server ({runner.binary.source})"
    return None
