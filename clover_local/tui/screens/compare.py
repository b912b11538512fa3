"""Compare: the same tasks through several models on this machine, one after another, with a progress bar (what
runs now, the time left), then the table and the picture of accuracy against latency.

The run goes in a worker thread (``compare.runner.run_compare``: each local model loaded through ``open_launch``
and closed before the next). Dismisses with the report (None when nothing ran); the App decides what follows."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, Input, ProgressBar, Static
from textual.worker import get_current_worker

from clover_local.compare.options import CompareOptions, Opener, Progress
from clover_local.compare.report import CompareReport
from clover_local.errors import CloverError


class CompareScreen(Screen[CompareReport | None]):
    """Contenders and tasks in, a comparison out."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "close", "Stop / back", id="compare.close")]

    @dataclass
    class Step(Message, bubble=False):
        progress: Progress

    @dataclass
    class Done(Message, bubble=False):
        report: CompareReport | None
        error: str | None

    def __init__(
        self,
        contenders: tuple[str, ...] = (),
        tasks: str = "builtin",
        *,
        options: CompareOptions | None = None,
        opener: Opener | None = None,
        auto_start: bool = False,
        report_path: Path | None = None,
        previous: CompareReport | None = None,
    ) -> None:
        super().__init__()
        self.initial_contenders = contenders
        self.initial_tasks = tasks
        self.options = options or CompareOptions()
        self.opener = opener
        """How contenders are opened (None: ``compare.openers.open_contender``)."""
        self.auto_start = auto_start
        self.report_path = report_path
        """Where the report is saved as it runs (None: a new file in clover-local's data folder)."""
        self.previous = previous
        """An interrupted run to go on with (``--resume``): its finished tasks are not run again."""
        self.saved: tuple[Path, Path] | None = None
        """The report and its picture, once written."""
        self.report: CompareReport | None = None
        self.steps: list[Progress] = []
        self.error: str | None = None
        self._cancel = threading.Event()
        self.running = False

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="compare-body"):
            yield Static("Compare models on the same tasks, on this machine", classes="section-title")
            yield Input(
                " ".join(self.initial_contenders),
                placeholder="contenders: smollm2-135m ./model.gguf hf:OWNER/REPO:Q4_K_M http://host:port/v1#MODEL",
                id="compare-contenders",
            )
            yield Input(
                self.initial_tasks, placeholder="tasks: builtin or a .jsonl / .yaml file", id="compare-tasks"
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Run", variant="primary", id="compare-run", action="screen.run")
            yield ProgressBar(total=1.0, show_eta=False, id="compare-progress")
            yield Static("", id="compare-status", markup=False)
            yield Static("", id="compare-table", markup=False)
            yield Static("", id="compare-picture", markup=False)
        yield Footer()

    def on_mount(self) -> None:
        if self.auto_start:
            self.call_after_refresh(self.action_run)

    def action_run(self) -> None:
        if self.running:
            return
        self.running = True
        self.error = None
        self._cancel.clear()
        self.query_one("#compare-run", Button).disabled = True
        self.query_one("#compare-status", Static).remove_class("error")
        names = self.query_one("#compare-contenders", Input).value.split()
        tasks = self.query_one("#compare-tasks", Input).value.strip() or "builtin"
        self._run(names, tasks)

    @work(thread=True, exclusive=True, group="compare")
    def _run(self, names: list[str], tasks_source: str) -> None:
        from clover_local.compare.contenders import parse_contenders
        from clover_local.compare.openers import check_contenders
        from clover_local.compare.picture import save_picture
        from clover_local.compare.report import default_report_path, save_report
        from clover_local.compare.runner import run_compare
        from clover_local.compare.tasks import load_tasks

        worker = get_current_worker()

        def step(p: Progress) -> None:
            if not worker.is_cancelled:
                self.post_message(CompareScreen.Step(p))

        try:
            contenders = parse_contenders(names)
            tasks = load_tasks(tasks_source)
            check_contenders(contenders, self.options)
            path = self.report_path or default_report_path()
            report = run_compare(
                contenders,
                tasks,
                self.options,
                opener=self.opener,
                previous=self.previous,
                on_progress=step,
                cancel=self._cancel,
                save=lambda r: save_report(r, path),
            )
            self.saved = (path, save_picture(report, path))
        except (CloverError, OSError) as exc:
            self.post_message(CompareScreen.Done(None, str(exc)))
            return
        self.post_message(CompareScreen.Done(report, None))

    def on_compare_screen_step(self, message: Step) -> None:
        from clover_local.fetch.progress import format_duration

        p = message.progress
        self.steps.append(p)
        if p.total:
            self.query_one("#compare-progress", ProgressBar).update(progress=p.done / p.total)
        left = f" · about {format_duration(p.eta_s)} left" if p.eta_s is not None else ""
        now = p.task if p.kind == "task" else p.kind
        line = f"{p.done}/{p.total} · {p.contender}: {now}{left}"
        if p.kind == "failed":
            line += f"\n{p.message}"
        self.query_one("#compare-status", Static).update(line)

    def on_compare_screen_done(self, message: Done) -> None:
        from clover_local.compare.picture import text_picture
        from clover_local.compare.report import format_table

        self.running = False
        self.previous = None  # gone on with: another Run starts afresh
        self.query_one("#compare-run", Button).disabled = False
        status = self.query_one("#compare-status", Static)
        if message.error or message.report is None:
            self.error = message.error
            status.update(message.error or "")
            status.add_class("error")
            return
        self.report = message.report
        self.query_one("#compare-progress", ProgressBar).update(progress=1.0)
        done = "Done." if message.report.complete else "Stopped: what ran is shown (and kept)."
        if self.saved is not None:
            done += f" Report: {self.saved[0]}  Picture: {self.saved[1]}"
        status.update(done)
        self.query_one("#compare-table", Static).update(format_table(message.report))
        self.query_one("#compare-picture", Static).update(text_picture(message.report))

    def on_unmount(self) -> None:
        self._cancel.set()  # the app is closing: the worker stops after its task and unloads the model

    def action_close(self) -> None:
        """While running: stop after the task in progress (the model is unloaded); else back, with the report."""
        if self.running:
            self._cancel.set()
            self.query_one("#compare-status", Static).update("Stopping after this task…")
            return
        self.dismiss(self.report)
