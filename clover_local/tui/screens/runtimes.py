"""llama.cpp runtimes: the pinned llama.cpp and the upstream releases installed beside it; install the latest
release (progress and each step in words, ``Esc`` cancels), remove one after asking, build one from source
when no prebuilt archive fits this machine.

The releases API is read and installs run in thread workers (:mod:`clover_local.runtimes`); they reach the screen
only through messages. A failure (offline, a wrong digest, no archive) is said as a line, never a traceback.
Dismisses with the runtime installed during this visit (the last one), or None.
"""

from __future__ import annotations

import threading
from dataclasses import KW_ONLY, dataclass
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Button, DataTable, Footer, Log, ProgressBar, Static

from clover_local import settings
from clover_local.errors import CloverError, InstallCancelled, NoArchiveError
from clover_local.fetch.progress import DownloadProgress
from clover_local.runtimes.installed import InstalledRuntime, installed_runtimes, pinned_runtimes
from clover_local.runtimes.releases import Release
from clover_local.tui.screens.download import describe_progress

PINNED_KEY = "pinned-"
"""Row keys of the pinned llama.cpp start with this (``pinned-0``); an installed runtime's row key is its tag."""


class ConfirmRemove(ModalScreen[bool]):
    """Asks before a runtime's folder is deleted."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("y", "dismiss(True)", "Remove", id="confirm.yes"),
        Binding("n,escape", "dismiss(False)", "Keep", id="confirm.no"),
    ]

    def __init__(self, runtime: InstalledRuntime) -> None:
        super().__init__()
        self.runtime = runtime

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box", classes="dialog"):
            yield Static(f"Remove {self.runtime.label}?", classes="dialog-title", markup=False)
            yield Static(
                f"Its folder {self.runtime.root} is deleted. Models that need it would have to install it again.",
                markup=False,
            )
            with Horizontal(classes="dialog-buttons"):
                yield Button("Remove (y)", variant="error", id="confirm-yes", action="screen.dismiss(True)")
                yield Button("Keep (n)", id="confirm-no", action="screen.dismiss(False)")


class RuntimesScreen(Screen[InstalledRuntime | None]):
    """Lists, installs and removes llama.cpp runtimes."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("i", "install", "Install latest", id="runtimes.install"),
        Binding("x,delete", "remove", "Remove", id="runtimes.remove"),
        Binding("r", "refresh", "Refresh", id="runtimes.refresh"),
        Binding("escape", "back", "Cancel / Back", id="runtimes.back"),
    ]

    @dataclass
    class LatestRead(Message, bubble=False):
        release: Release | None
        error: str | None

    @dataclass
    class Progressed(Message, bubble=False):
        progress: DownloadProgress

    @dataclass
    class Stepped(Message, bubble=False):
        text: str

    @dataclass
    class Ended(Message, bubble=False):
        """An install or a removal ended: what it made, or why not."""

        runtime: InstalledRuntime | None = None
        error: str | None = None
        _: KW_ONLY
        cancelled: bool = False
        no_archive: str | None = None
        """The tag a source build is offered for: no prebuilt archive fits this machine."""
        removed: str | None = None

    def __init__(self, install: str | None = None) -> None:
        super().__init__()
        self.install_at_once = install
        """A tag (or ``latest``) to install as soon as the screen opens: the plan screen's offer."""
        self.latest: Release | None = None
        self.latest_error: str | None = None
        self.busy = False
        """An install or a removal is running."""
        self.installing = False
        self.ended = 0
        """How many installs and removals ended (tests wait on it)."""
        self.installed_now: InstalledRuntime | None = None
        self.source_offer: str | None = None
        """The tag whose source build is offered (no archive fits), else None."""
        self._cancel = threading.Event()

    def compose(self) -> ComposeResult:
        with Vertical(id="runtimes-body"):
            yield Static("llama.cpp runtimes", classes="section-title")
            yield Static(
                f"The pinned llama.cpp, and upstream releases installed beside it in {settings.runtimes_dir()}.",
                classes="muted",
                markup=False,
            )
            yield DataTable(id="runtimes-table", cursor_type="row", zebra_stripes=True)
            yield Static("Checking the latest llama.cpp release…", id="runtimes-latest", markup=False)
            yield ProgressBar(total=100, id="runtime-progress", show_eta=False)
            yield Static("", id="runtime-status", markup=False)
            yield Log(id="runtime-steps", auto_scroll=True)
            yield Static("", id="runtime-error", markup=False)
            with Horizontal(id="runtimes-buttons"):
                yield Button(
                    "Install latest",
                    variant="primary",
                    id="runtime-install",
                    disabled=True,
                    action="screen.install",
                )
                yield Button(
                    "Build from source", id="runtime-build", classes="-hidden", action="screen.build"
                )
                yield Button("Remove", id="runtime-remove", action="screen.remove")
                yield Button("Back", id="runtime-back", action="screen.back")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one("#runtimes-table", DataTable)
        table.add_columns("Runtime", "Backend", "Origin", "Path")
        self._fill_table()
        self.query_one("#runtime-progress", ProgressBar).display = False
        self.query_one("#runtime-steps", Log).display = False  # shown once an install has steps to tell
        if self.install_at_once:
            self._start_install(self.install_at_once, from_source=False)
        self._read_latest()

    # -- the list ----------------------------------------------------------------------------------------

    def _fill_table(self) -> None:
        table = self.query_one("#runtimes-table", DataTable)
        table.clear()
        for rt in installed_runtimes():
            table.add_row(rt.tag, rt.backend, rt.origin, str(rt.root), key=rt.tag)
        for index, pinned in enumerate(pinned_runtimes()):
            label = f"pinned ({pinned.commit})"
            table.add_row(label, pinned.backend, pinned.origin, pinned.path, key=f"{PINNED_KEY}{index}")

    def selected_tag(self) -> str | None:
        """The installed runtime under the cursor; None on a pinned row or an empty table."""
        table = self.query_one("#runtimes-table", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return None if key is None or key.startswith(PINNED_KEY) else key

    # -- the latest release ------------------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="runtime-latest")
    def _read_latest(self) -> None:
        from clover_local.runtimes.releases import fetch_release

        try:
            release = fetch_release("latest")
        except CloverError as exc:
            self.post_message(RuntimesScreen.LatestRead(None, str(exc)))
        else:
            self.post_message(RuntimesScreen.LatestRead(release, None))

    def on_runtimes_screen_latest_read(self, message: LatestRead) -> None:
        self.latest, self.latest_error = message.release, message.error
        self._show_latest()

    def _show_latest(self) -> None:
        line = self.query_one("#runtimes-latest", Static)
        button = self.query_one("#runtime-install", Button)
        release = self.latest
        if release is None:
            line.update(f"The latest release is unknown: {self.latest_error or 'not read yet.'}")
            line.set_class(self.latest_error is not None, "warning")
            button.disabled = True
            return
        line.remove_class("warning")
        published = f", published {release.published[:10]}" if release.published else ""
        installed = any(rt.tag == release.tag for rt in installed_runtimes())
        state = "installed" if installed else "not installed: i installs it"
        line.update(f"Latest release: llama.cpp {release.tag}{published}, {state}.")
        button.label = f"Install {release.tag}"
        button.disabled = installed or self.busy

    # -- installing --------------------------------------------------------------------------------------

    def action_install(self) -> None:
        if self.latest is not None and not self.busy:
            self._start_install(self.latest.tag, from_source=False)

    def _start_install(self, tag: str, *, from_source: bool) -> None:
        self._cancel = threading.Event()
        self._set_busy(True)
        self.installing = True
        self.source_offer = None
        self.query_one("#runtime-build", Button).add_class("-hidden")
        self._say_error(None)
        steps = self.query_one("#runtime-steps", Log)
        steps.clear()
        steps.display = True
        progress = self.query_one("#runtime-progress", ProgressBar)
        progress.display = True
        progress.update(total=100, progress=0)
        self.query_one("#runtime-status", Static).update(f"Installing llama.cpp {tag}…")
        self._install(tag, from_source, self._cancel)

    @work(thread=True, exclusive=True, group="runtime-work")
    def _install(self, tag: str, from_source: bool, cancel: threading.Event) -> None:
        from clover_local.runtimes.install import install

        def progress(p: DownloadProgress) -> None:
            self.post_message(RuntimesScreen.Progressed(p))

        def notify(text: str) -> None:
            self.post_message(RuntimesScreen.Stepped(text))

        try:
            runtime = install(
                tag,
                from_source=from_source,
                build_if_no_archive=False,
                cancel=cancel,
                progress=progress,
                notify=notify,
            )
        except InstallCancelled as exc:
            self.post_message(RuntimesScreen.Ended(error=str(exc), cancelled=True))
        except NoArchiveError as exc:
            self.post_message(RuntimesScreen.Ended(error=str(exc), no_archive=exc.tag))
        except CloverError as exc:
            self.post_message(RuntimesScreen.Ended(error=str(exc)))
        except OSError as exc:  # the disk, not the release: a full disk or a folder that cannot be written
            self.post_message(RuntimesScreen.Ended(error=f"The install could not write its files: {exc}"))
        else:
            self.post_message(RuntimesScreen.Ended(runtime))

    def on_runtimes_screen_progressed(self, message: Progressed) -> None:
        p = message.progress
        self.query_one("#runtime-progress", ProgressBar).update(total=max(p.total, 1), progress=p.done)
        self.query_one("#runtime-status", Static).update(describe_progress(p))

    def on_runtimes_screen_stepped(self, message: Stepped) -> None:
        self.query_one("#runtime-steps", Log).write_line(message.text)

    # -- removing ----------------------------------------------------------------------------------------

    def action_remove(self) -> None:
        if self.busy:
            return
        tag = self.selected_tag()
        runtime = next((rt for rt in installed_runtimes() if rt.tag == tag), None)
        if runtime is None:
            self._say_error(
                "Choose an installed runtime in the list; the pinned llama.cpp is not removed here."
            )
            return

        def answered(remove: bool | None) -> None:
            if remove:
                self._set_busy(True)
                self.query_one("#runtime-status", Static).update(f"Removing {runtime.label}…")
                self._remove(runtime.tag)

        self.app.push_screen(ConfirmRemove(runtime), answered)

    @work(thread=True, exclusive=True, group="runtime-work")
    def _remove(self, tag: str) -> None:
        from clover_local.runtimes.install import remove

        try:
            folder = remove(tag)
        except CloverError as exc:
            self.post_message(RuntimesScreen.Ended(error=str(exc)))
        except OSError as exc:
            self.post_message(RuntimesScreen.Ended(error=f"Could not remove llama.cpp {tag}: {exc}"))
        else:
            self.post_message(RuntimesScreen.Ended(removed=f"Removed llama.cpp {tag} ({folder})."))

    # -- either ended ------------------------------------------------------------------------------------

    def on_runtimes_screen_ended(self, message: Ended) -> None:
        self._set_busy(False)
        self.installing = False
        self.ended += 1
        self.query_one("#runtime-progress", ProgressBar).display = message.runtime is not None
        status = self.query_one("#runtime-status", Static)
        if message.runtime is not None:
            self.installed_now = message.runtime
            # the steps above end with "Installed ... in ...": this line says what it means
            status.update(
                f"Ready: a model that needs llama.cpp {message.runtime.tag} runs on it from now on. Esc goes back."
            )
        elif message.removed is not None:
            status.update(message.removed)
        elif message.cancelled:
            status.update("Cancelled: nothing was installed; what was downloaded is kept for the next try.")
        else:
            status.update("")
            self._say_error(message.error or "The install failed.")
        if message.no_archive is not None:
            self.source_offer = message.no_archive
            build = self.query_one("#runtime-build", Button)
            build.label = f"Build {message.no_archive} from source"
            build.remove_class("-hidden")
        self._fill_table()
        self._show_latest()

    def _set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.query_one("#runtime-remove", Button).disabled = busy
        self.query_one("#runtime-install", Button).disabled = busy or self.latest is None

    def _say_error(self, text: str | None) -> None:
        error = self.query_one("#runtime-error", Static)
        error.update(text or "")
        error.set_class(text is not None, "error")

    # -- buttons and keys --------------------------------------------------------------------------------

    def action_build(self) -> None:
        """The "Build from source" button, offered when no prebuilt archive fits this machine."""
        if self.source_offer is not None and not self.busy:
            self._start_install(self.source_offer, from_source=True)

    def action_refresh(self) -> None:
        self._fill_table()
        self._read_latest()

    def action_back(self) -> None:
        """``Esc``: cancel the install that is running (it stops at the next block or step), else go back."""
        if self.installing:
            self._cancel.set()
            self.query_one("#runtime-status", Static).update("Cancelling…")
        elif not self.busy:  # a removal runs to its end (one rename, then a delete out of sight)
            self.dismiss(self.installed_now)
