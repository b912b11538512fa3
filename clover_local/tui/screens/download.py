"""Download: overall and per-shard progress, speed, ETA, disk left, pause/resume and cancel, verification.

The download runs in a thread worker with a ``threading.Event`` to stop it; what was fetched stays on disk,
so "Resume" (or the next start) carries on where it stopped. Dismisses with the local path, or None.
"""

from __future__ import annotations

import shutil
import threading
from dataclasses import dataclass
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Button, Footer, ProgressBar, Static

from clover_local import settings
from clover_local.detect.memory import nearest_existing
from clover_local.detect.units import format_bytes
from clover_local.errors import CloverError, DownloadCancelled
from clover_local.fetch.progress import DownloadProgress, format_duration
from clover_local.fetch.sidecars import draft_kind_of
from clover_local.plan.types import Plan
from clover_local.presets import Preset
from clover_local.tui import services
from clover_local.tui.services import ModelChoice

PHASE_WORDS = {
    "waiting": "Waiting for another download of this file to finish",
    "checking": "Checking what is already on disk",
    "downloading": "Downloading",
    "verifying": "Verifying (sha256)",
    "done": "Done",
}


def describe_progress(p: DownloadProgress) -> str:
    """One line of numbers under the bars."""
    shard = f"file {p.file_index + 1} of {p.file_count}: " if p.file_count > 1 else ""
    name = p.file.rsplit("/", 1)[-1]
    kind = draft_kind_of(name)
    if kind is not None:
        name += f" ({kind} draft head for self-speculation)"
    line = f"{PHASE_WORDS.get(p.phase, p.phase)} · {shard}{name} · {format_bytes(p.done)} of {format_bytes(p.total)}"
    if p.speed_bps > 0:
        line += f" · {format_bytes(p.speed_bps)}/s · ETA {format_duration(p.eta_s)}"
    return line


def disk_left_text() -> str:
    """Free space where the Hugging Face cache lives."""
    folder = nearest_existing(settings.hf_cache_dir())
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "Disk left: unknown"
    return f"Disk left: {format_bytes(free)} ({folder})"


class DownloadScreen(Screen[str | ModelChoice | None]):
    """Downloads the plan's quant of the preset's repo. When it fails (the Hub unreachable, offline), it offers
    what needs no network: the demo model and the models already on disk (dismissing with that choice)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("p", "pause", "Pause/Resume", id="download.pause"),
        Binding("m", "demo", "Demo model", id="download.demo"),
        Binding("o", "on_disk", "Models on disk", id="download.on_disk"),
        Binding("escape", "cancel", "Cancel", id="download.cancel"),
    ]

    @dataclass
    class Progressed(Message, bubble=False):
        progress: DownloadProgress

    @dataclass
    class Ended(Message, bubble=False):
        path: str | None
        error: str | None
        cancelled: bool

    def __init__(self, preset: Preset, plan: Plan) -> None:
        super().__init__()
        self.preset = preset
        self.plan = plan
        self._cancel = threading.Event()
        self.running = False
        self.last: DownloadProgress | None = None
        self._closing = False
        self.failed = False
        """The last try failed: the demo model and the models on disk are offered."""

    def compose(self) -> ComposeResult:
        with Vertical(id="download-body"):
            yield Static(
                f"{self.preset.display_name} {self.plan.quant} from {self.preset.repo}",
                classes="section-title",
            )
            yield Static("All files", classes="muted")
            yield ProgressBar(total=100, id="overall", show_eta=False)
            yield Static("This file", classes="muted")
            yield ProgressBar(total=100, id="shard", show_eta=False)
            yield Static("Starting…", id="download-status", markup=False)
            yield Static(disk_left_text(), id="disk-left", markup=False)
            yield Static("", id="download-error", markup=False)
            yield Static("", id="download-offline", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Demo model (m)", id="download-demo", classes="-offline", action="screen.demo")
                yield Button(
                    "Models on disk (o)", id="download-on-disk", classes="-offline", action="screen.on_disk"
                )
                yield Button("Pause", id="download-pause", action="screen.pause")
                yield Button("Cancel", variant="error", id="download-cancel", action="screen.cancel")
        yield Footer()

    def on_mount(self) -> None:
        self._start()

    def _start(self) -> None:
        self._cancel = threading.Event()
        self.running = True
        self.query_one("#download-pause", Button).label = "Pause"
        self.query_one("#download-error", Static).update("")
        self.query_one("#download-error", Static).remove_class("error")
        self.query_one("#download-status", Static).update("Starting…")
        self.failed = False
        self._show_offline()
        self._download(self._cancel)

    def _show_offline(self) -> None:
        """The ways to a chat that need no network, shown while the download cannot go on."""
        for button in self.query(".-offline").results(Button):
            button.display = self.failed
        self.query_one("#download-offline", Static).update(
            "Without the download: m chats with the demo model (it ships with clover-local), o lists the "
            "models already on this machine. p tries the download again."
            if self.failed
            else ""
        )
        self.refresh_bindings()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("demo", "on_disk"):
            return self.failed
        return True

    @work(thread=True, exclusive=True, group="download")
    def _download(self, cancel: threading.Event) -> None:
        def progress(p: DownloadProgress) -> None:
            self.post_message(DownloadScreen.Progressed(p))

        from clover_local.fetch.download import download_model

        try:  # resumes what an earlier try left; the path of the first shard
            path = str(download_model(self.preset, self.plan.quant, progress=progress, cancel=cancel))
        except DownloadCancelled:
            self.post_message(DownloadScreen.Ended(None, None, cancelled=True))
        except CloverError as exc:
            self.post_message(DownloadScreen.Ended(None, str(exc), cancelled=False))
        else:
            self.post_message(DownloadScreen.Ended(path, None, cancelled=False))

    def on_download_screen_progressed(self, message: Progressed) -> None:
        p = message.progress
        self.last = p
        self.query_one("#overall", ProgressBar).update(total=max(p.total, 1), progress=p.done)
        self.query_one("#shard", ProgressBar).update(total=max(p.file_total, 1), progress=p.file_done)
        self.query_one("#download-status", Static).update(describe_progress(p))
        self.query_one("#disk-left", Static).update(disk_left_text())

    def on_download_screen_ended(self, message: Ended) -> None:
        self.running = False
        if self._closing:
            self.dismiss(None)
            return
        if message.path:
            self.dismiss(message.path)
            return
        self.query_one("#download-pause", Button).label = "Resume"
        if message.cancelled:
            self.query_one("#download-status", Static).update("Paused: what was downloaded is kept.")
        else:
            error = self.query_one("#download-error", Static)
            error.update(message.error or "The download failed.")
            error.add_class("error")
            self.query_one("#download-status", Static).update("Stopped: the download failed.")
            self.failed = True
            self._show_offline()

    def action_demo(self) -> None:
        if not self.running:
            self.dismiss(ModelChoice(preset=services.DEMO_PRESET))

    def action_on_disk(self) -> None:
        from clover_local.tui.screens.models import ModelPicker

        if not self.running:
            self.app.push_screen(ModelPicker(), self._picked)

    def _picked(self, choice: ModelChoice | None) -> None:
        if choice is not None:
            self.dismiss(choice)

    def action_pause(self) -> None:
        if self.running:
            self._cancel.set()
        else:
            self._start()

    def action_cancel(self) -> None:
        if self.running:
            self._closing = True
            self._cancel.set()
        else:
            self.dismiss(None)
