"""Machine and plan: what was detected, what the planner recommends and why, where memory goes.

Changing the quant or the context re-plans at once (the planner is pure and fast). A local GGUF can be chosen
instead of downloading. Detection runs in a worker so the screen paints before any probe (or llama_cpp) loads.
"""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, Select, Static
from textual.worker import get_current_worker

from clover_local.detect.machine import Machine
from clover_local.errors import CloverError
from clover_local.fetch.describe import QuantDescriptions
from clover_local.plan.types import Plan
from clover_local.presets import Preset
from clover_local.tui import services
from clover_local.tui.widgets.memory import MemoryView, gigabytes, legend

CTX_CHOICES = (2048, 4096, 8192, 16384, 32768, 65536, 131072)
NARROW_WIDTH = 110


def describe_machine(machine: Machine) -> str:
    """The detected machine in a few lines: CPU, RAM, disk, each GPU, the llama.cpp build."""
    gib = gigabytes
    lines = [
        f"CPU   {machine.cpu.model or 'unknown'} ({machine.cpu.physical_cores} cores)",
        f"RAM   {gib(machine.memory.available_bytes)} free of {gib(machine.memory.total_bytes)}",
        f"Disk  {gib(machine.disk.free_bytes)} free" + _where(machine.disk.path),
    ]
    for g in machine.gpus:
        kind = "unified" if g.unified else "VRAM"
        lines.append(f"GPU{g.index}  {g.name}: {gib(g.free_bytes)} free of {gib(g.total_bytes)} {kind}")
    if not machine.gpus:
        lines.append("GPU   none found: the CPU runs the model")
    build = machine.build
    backends = ", ".join(build.backends) or "cpu"
    version = build.version or "not installed"
    lines.append(f"llama.cpp  llama-cpp-python {version}, backends: {backends}")
    lines.extend(f"hint  {h}" for h in machine.hints)
    if machine.simulated:
        lines.append("(simulated machine)")
    return "\n".join(lines)


def _where(path: str) -> str:
    return f" in {path}" if path and not path.startswith("(") else ""


def describe_plan(plan: Plan) -> str:
    """The recommendation in words: quant, context, offload, speed, and the planner's reasons."""
    where = "all layers on GPU" if plan.n_gpu_layers == -1 else f"{plan.n_gpu_layers} layers on GPU"
    if plan.backend == "cpu":
        where = "CPU only"
    experts = f", experts of {plan.n_cpu_moe} layers in RAM" if plan.n_cpu_moe else ""
    spec = "on" if plan.speculative.enabled else "off"
    est = " (estimated sizes)" if plan.estimated else ""
    head = [
        f"{plan.quant} · {gigabytes(plan.file_bytes)}{est} · context {plan.ctx:,} tokens",
        f"{where}{experts} · speculative decoding {spec}",
        f"Predicted speed: about {plan.predicted_tokens_per_s:.0f} tokens/s"
        if plan.diffusion is None
        else f"Diffusion: {plan.diffusion.schedule} schedule, {plan.diffusion.steps_per_block} steps per block",
        "FITS" if plan.fits else "DOES NOT FIT: see the reasons",
    ]
    return "\n".join(head)


class PlanScreen(Screen[None]):
    """The first-run screen: choose quant and context (or a local GGUF), then download or launch."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "download", "Download", id="plan.download"),
        Binding("l", "focus_local", "Local GGUF", id="plan.local"),
    ]

    class MachineReady(Message, bubble=False):
        def __init__(self, machine: Machine | None, error: str | None) -> None:
            super().__init__()
            self.machine = machine
            self.error = error

    class ModelsDescribed(Message, bubble=False):
        """Each quant's sizes, exact where a file or the Hub's GGUF header could be read."""

        def __init__(self, models: QuantDescriptions) -> None:
            super().__init__()
            self.models = models

    def __init__(
        self, preset: Preset, machine: Machine | None = None, *, simulate: str | None = None
    ) -> None:
        super().__init__()
        self.preset = preset
        self.machine = machine
        self.simulate = simulate
        self.plan: Plan | None = None
        self.model_path: str | None = None
        self.models: QuantDescriptions | None = None
        """Exact sizes per quant once the detection worker has read them; estimates until then."""
        self.plan_count = 0
        """How many plans were made (tests wait on it)."""

    def compose(self) -> ComposeResult:
        yield Static(
            f"{self.preset.display_name}: plan for this machine", id="plan-title", classes="section-title"
        )
        quants = [("quant: auto", "auto"), *((f"quant: {q}", q) for q in self.preset.quants)]
        ctxs = [("ctx: auto", 0), *((f"ctx: {c:,}", c) for c in CTX_CHOICES if c <= self.preset.ctx_max)]
        with Horizontal(id="plan-controls"):
            yield Select(quants, value="auto", allow_blank=False, id="quant")
            yield Select(ctxs, value=0, allow_blank=False, id="ctx")
            yield Input(placeholder="or a local .gguf path, then Enter", id="local-path")
        with VerticalScroll(id="plan-body"), Horizontal(id="plan-columns"):
            yield Static("Detecting this machine…", id="machine-panel", markup=False)
            with Vertical(id="plan-panel"):
                yield Static("", id="plan-summary", markup=False)
                yield Vertical(id="memory-bars")
                yield Static(legend(), classes="muted")
                yield Static("Why", classes="section-title")
                yield Static("", id="plan-reasons", markup=False)
                yield Static("Alternatives", classes="section-title")
                yield Static("", id="plan-alternatives", markup=False)
        with Horizontal(id="plan-buttons"):
            yield Button("Download and run", variant="primary", id="plan-download", disabled=True)
            yield Button("Run local file", id="plan-run-local", disabled=True)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#plan-columns").set_class(self.app.size.width < NARROW_WIDTH, "-narrow")
        if self.machine is not None:
            self._machine_ready(self.machine)
        else:
            self._detect()

    def on_resize(self) -> None:
        self.query_one("#plan-columns").set_class(self.app.size.width < NARROW_WIDTH, "-narrow")

    @work(thread=True, exclusive=True, group="detect")
    def _detect(self) -> None:
        try:
            machine = services.detect(self.simulate)
        except CloverError as exc:
            self.post_message(PlanScreen.MachineReady(None, str(exc)))
            return
        self.post_message(PlanScreen.MachineReady(machine, None))
        if self.simulate is None and not get_current_worker().is_cancelled:
            # The plan shows at once from estimates; exact sizes (file or Hub header) replace them when read.
            self.post_message(PlanScreen.ModelsDescribed(services.describe_models(self.preset)))

    def on_plan_screen_machine_ready(self, message: MachineReady) -> None:
        if message.machine is None:
            panel = self.query_one("#machine-panel", Static)
            panel.update(message.error or "Detection failed.")
            panel.add_class("error")
            return
        self._machine_ready(message.machine)

    def on_plan_screen_models_described(self, message: ModelsDescribed) -> None:
        self.models = message.models
        self.replan()

    def _machine_ready(self, machine: Machine) -> None:
        self.machine = machine
        self.query_one("#machine-panel", Static).update(describe_machine(machine))
        self.replan()

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.replan()

    def replan(self) -> None:
        """Make the plan for the current choices and show it."""
        if self.machine is None:
            return
        quant = str(self.query_one("#quant", Select).value)
        ctx = int(self.query_one("#ctx", Select).value or 0) or None  # type: ignore[arg-type]
        try:
            plan = services.make_plan(self.machine, self.preset, quant, ctx, self.model_path, self.models)
        except CloverError as exc:
            self.plan = None
            self.query_one("#plan-summary", Static).update(str(exc))
            self.query_one("#plan-summary", Static).add_class("error")
            self.query_one("#plan-download", Button).disabled = True
            self.plan_count += 1
            return
        self.show_plan(plan)

    def show_plan(self, plan: Plan) -> None:
        self.plan = plan
        self.plan_count += 1
        summary = self.query_one("#plan-summary", Static)
        summary.update(describe_plan(plan))
        summary.set_class(not plan.fits, "error")
        bars = self.query_one("#memory-bars", Vertical)
        bars.remove_children()
        devices = [*plan.memory.gpus, plan.memory.ram]
        bars.mount_all([MemoryView(d, label=d.name.upper()) for d in devices])
        self.query_one("#plan-reasons", Static).update("\n".join(f"• {r}" for r in plan.reasons) or "-")
        alts = [f"• {a.quant}: {a.why_not}" for a in plan.alternatives]
        self.query_one("#plan-alternatives", Static).update("\n".join(alts) or "-")
        self.query_one("#plan-download", Button).disabled = self.model_path is not None
        self.query_one("#plan-run-local", Button).disabled = self.model_path is None

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

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "plan-download":
            self.action_download()
        elif event.button.id == "plan-run-local":
            self.action_run_local()

    def action_focus_local(self) -> None:
        self.query_one("#local-path", Input).focus()

    def action_download(self) -> None:
        if self.plan is None or self.model_path is not None:
            return
        from clover_local.tui.screens.download import DownloadScreen

        self.app.push_screen(DownloadScreen(self.preset, self.plan), self._downloaded)

    def _downloaded(self, path: str | None) -> None:
        if path and self.plan is not None:
            self._launch(path)

    def action_run_local(self) -> None:
        if self.model_path is not None:
            self._launch(self.model_path)

    def _launch(self, path: str) -> None:
        from clover_local.tui.app import CloverApp

        app = self.app
        assert isinstance(app, CloverApp)
        plan = self.plan
        if plan is not None:
            app.remember_first_run(self.preset, plan.quant, plan.ctx, path)
        app.launch(path, self.preset, plan)
