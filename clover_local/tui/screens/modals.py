"""Modal screens: chat settings, the saved-conversation picker, and help (every key binding)."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Grid, Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Select, Static, Switch
from textual.widgets.option_list import Option

from clover_local import conversations
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

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="settings.cancel")]

    def __init__(self, current: ModelSettings, loaded_ctx: int) -> None:
        super().__init__()
        self.current = current
        self.loaded_ctx = loaded_ctx

    def compose(self) -> ComposeResult:
        with Vertical(id="settings-box", classes="dialog"):
            yield Static("Settings for this model", classes="dialog-title")
            with Grid(id="settings-grid"):
                for name, label, _ in _NUMBER_FIELDS:
                    yield Label(label)
                    yield Input(str(getattr(self.current, name)), id=f"set-{name}")
                yield Label("Speculative decoding")
                mode = self.current.spec_mode if self.current.speculative else "off"
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
            yield Static("", id="settings-error", markup=False)
            with Horizontal(classes="dialog-buttons"):
                yield Button("Save", variant="primary", id="settings-save")
                yield Button("Cancel", id="settings-cancel")

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "settings-save":
            self.action_save()
        else:
            self.dismiss(None)

    def on_input_submitted(self) -> None:
        self.action_save()

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
        mode = str(self.query_one("#set-spec_mode", Select).value)
        values["spec_mode"] = mode
        values["speculative"] = mode != "off"
        values["diffusion_live"] = self.query_one("#set-diffusion_live", Switch).value
        values["system_prompt"] = self.query_one("#set-system_prompt", Input).value
        return replace(self.current, **values).validated()  # type: ignore[arg-type]

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConversationPicker(ModalScreen[conversations.Conversation | None]):
    """Pick a saved conversation to continue."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel", id="picker.cancel")]

    def __init__(self, saved: list[conversations.SavedConversation]) -> None:
        super().__init__()
        self.saved = saved

    def compose(self) -> ComposeResult:
        with Vertical(id="picker-box", classes="dialog"):
            yield Static("Open a saved conversation", classes="dialog-title")
            if not self.saved:
                yield Static("No saved conversations yet (Ctrl+S saves one).")
            options = [
                Option(f"{s.created[:16].replace('T', ' ')}  {s.title}  ({s.n_messages} messages)", id=str(i))
                for i, s in enumerate(self.saved)
            ]
            yield OptionList(*options, id="picker-list")

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        entry = self.saved[int(event.option.id or 0)]
        try:
            self.dismiss(conversations.load(entry.path))
        except CloverError as exc:
            self.notify(str(exc), severity="error")

    def action_cancel(self) -> None:
        self.dismiss(None)


HELP_TEXT = """\
[b]Chat[/b]
  Enter        send (while a reply streams, the message waits its turn)
  Esc          stop the reply
  Ctrl+R       regenerate the last reply
  Ctrl+G       edit the last message and send it again
  Ctrl+Y       copy the last reply to the clipboard
  Ctrl+S       save the conversation      Ctrl+O  open a saved one
  Ctrl+N       new conversation           F2      settings (saved per model)
  Click "Thinking" to see the model's reasoning.

[b]Plan[/b]
  Change quant or context: the plan updates at once.
  Enter a path to use a GGUF you already have.

[b]Everywhere[/b]
  F1  this help      Ctrl+P  commands (theme: light or dark)      Ctrl+Q  quit
"""


class HelpScreen(ModalScreen[None]):
    """Every key binding, in words."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,f1,q", "close", "Close", id="help.close")]

    def compose(self) -> ComposeResult:
        with Vertical(id="help-box", classes="dialog"):
            yield Static("Keys", classes="dialog-title")
            yield Static(HELP_TEXT, id="help-text")
            yield Button("Close", id="help-close")

    def on_button_pressed(self) -> None:
        self.dismiss(None)

    def action_close(self) -> None:
        self.dismiss(None)
