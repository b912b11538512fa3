"""Modal screens: chat settings, a full context's choices, and help (every key binding and command)."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Select, Static, Switch

from clover_local.errors import CloverError
from clover_local.plan.speculation import SPEC_MODES
from clover_local.user_prefs import ModelSettings

SPEC_MODE_LABELS = {
    "auto": "auto (decided by the plan)",
    "mtp": "MTP head of the model",
    "dflash": "DFlash sidecar (llama-server)",
    "dspark": "DSpark sidecar (llama-server)",
    "eagle3": "EAGLE-3 sidecar (llama-server)",
    "ngram": "n-gram lookup",
    "off": "off",
}
_NUMBER_FIELDS: tuple[tuple[str, str, type], ...] = (
    ("temperature", "Temperature", float),
    ("top_p", "Top-p", float),
    ("top_k", "Top-k (0 = off)", int),
    ("max_tokens", "Max reply tokens", int),
    ("ctx", "Context (tokens)", int),
)


class SettingsScreen(ModalScreen[ModelSettings | None]):
    """Sampling, context, speculative decoding and the system prompt, saved per model."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss", "Cancel", id="settings.cancel")]

    def __init__(self, current: ModelSettings) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-box", classes="dialog"):
            yield Static("Settings for this model", classes="dialog-title")
            with Grid(id="settings-grid"):
                for name, label, _ in _NUMBER_FIELDS:
                    yield Label(label)
                    yield Input(str(getattr(self.current, name)), id=f"set-{name}")
                yield Label("Speculative decoding")
                mode = self.current.spec_mode
                yield Select(
                    [(SPEC_MODE_LABELS.get(m, m), m) for m in SPEC_MODES],
                    value=mode if mode in SPEC_MODES else "auto",
                    allow_blank=False,
                    id="set-spec_mode",
                )
                yield Label("Live diffusion view")
                yield Switch(self.current.diffusion_live, id="set-diffusion_live")
                yield Label("System prompt")
                yield Input(self.current.system_prompt, placeholder="(none)", id="set-system_prompt")
            yield Static(sampling_hint(self.current), id="settings-hint", classes="muted", markup=False)
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="settings-save", action="screen.save")
                yield Button("Cancel", id="settings-cancel", action="screen.dismiss")

    def on_input_submitted(self) -> None:
        self.action_save()

    def on_input_changed(self) -> None:
        try:
            hint = sampling_hint(self.read_form())
        except CloverError:
            return
        self.query_one("#settings-hint", Static).update(hint)

    def action_save(self) -> None:
        try:
            self.dismiss(self.read_form())
        except CloverError as exc:
            self.query_one("#settings-error", Static).update(str(exc))

    def read_form(self) -> ModelSettings:
        values: dict[str, object] = {}
        for name, label, kind in _NUMBER_FIELDS:
            text = self.query_one(f"#set-{name}", Input).value.strip()
            try:
                values[name] = kind(text)
            except ValueError:
                noun = "a whole number" if kind is int else "a number"
                raise CloverError(f"{label}: {text!r} is not {noun}.") from None
        values["spec_mode"] = str(self.query_one("#set-spec_mode", Select).value)
        values["diffusion_live"] = self.query_one("#set-diffusion_live", Switch).value
        values["system_prompt"] = self.query_one("#set-system_prompt", Input).value
        return replace(self.current, **values).validated()  # type: ignore[arg-type]


def sampling_hint(settings: ModelSettings) -> str:
    """A word when one sampling setting makes another irrelevant (greedy decoding ignores temperature)."""
    if settings.top_k == 1:
        return "Top-k 1 always takes the likeliest token: temperature and top-p change nothing (greedy)."
    if settings.temperature == 0:
        return "Temperature 0 always takes the likeliest token: top-k and top-p change nothing (greedy)."
    return ""


class ContextFullScreen(ModalScreen[tuple[str, bool] | None]):
    """The context is full: leave out the oldest turns, or a new chat carrying a summary (remembered if asked).
    Dismisses with ``("drop" | "summary", remember)`` or None (the message stays in the box)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("d", "choose('drop')", "Drop oldest", id="full.drop"),
        Binding("s", "choose('summary')", "New chat + summary", id="full.summary"),
        Binding("escape", "dismiss", "Cancel", id="full.cancel"),
    ]

    def __init__(self, n_ctx: int) -> None:
        super().__init__()
        self.n_ctx = n_ctx

    def compose(self) -> ComposeResult:
        with Vertical(id="full-box", classes="dialog"):
            yield Static("The context is full", classes="dialog-title")
            yield Static(
                f"This chat no longer fits the model's context of {self.n_ctx} tokens, so your message was "
                "not sent (it is back in the message box). The system prompt is always kept.",
                markup=False,
            )
            yield Checkbox("Remember this choice", id="full-remember")
            with Horizontal(classes="dialog-buttons"):
                yield Button(
                    "Drop oldest turns (d)", variant="primary", id="full-drop", action="screen.choose('drop')"
                )
                yield Button("New chat + summary (s)", id="full-summary", action="screen.choose('summary')")
                yield Button("Cancel", id="full-cancel", action="screen.dismiss")

    def action_choose(self, how: str) -> None:
        self.dismiss((how, self.query_one("#full-remember", Checkbox).value))


HELP_TEXT = """\
[b]Chat[/b]
  Enter        send (while a reply streams, it waits its turn)
  Ctrl+J       new line (also Alt+Enter); a paste keeps every line
  Esc, Ctrl+C  stop the reply (Ctrl+C when nothing runs: quit)
  PgUp/PgDn    scroll the chat          Tab  complete a /command
  Ctrl+R       a new reply in place of the last (a new seed)
  Ctrl+G       edit the last message and send it again
  Ctrl+Y       copy the last reply to the clipboard
  Ctrl+N       new chat (the last one is kept)
  Ctrl+O       your chats: open, rename, delete, search
  Ctrl+S       export as Markdown and JSON (kept as they go)
  Ctrl+L       switch model             F2  settings (per model)
  Click "Thinking" to see the model's reasoning.
  The runner (llama-server) stopped? It is started again: the
  status line says "restarting", then "ready"; send again then.
  Given up? The status line says why; Ctrl+L loads it again,
  keeping this chat and the text in the box.

[b]Commands[/b]
  /new /clear /chats /model /save /help
  /system TEXT       /set temperature 0.7 (top_p, top_k, max_tokens)
  //text sends a message that starts with /

[b]Plan[/b]
  Change quant or context: the plan updates at once.
  Enter a path to use a GGUF you already have.
  m  chat with the demo model     o  the models already on disk

[b]Everywhere[/b]
  F1  this help    Ctrl+P  commands (theme: light or dark)    Ctrl+Q  quit
  F3  llama.cpp runtimes: list, install the latest release, remove
  F4  compare models on the same tasks: accuracy and latency
"""


class HelpScreen(ModalScreen[None]):
    """Every key binding, in words."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,f1,q", "dismiss", "Close", id="help.close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="dialog"):
            yield Static("Keys (scroll for more)", classes="dialog-title")
            with VerticalScroll(id="help-scroll"):
                yield Static(HELP_TEXT, id="help-text")
            yield Button("Close", id="help-close", action="screen.dismiss")
