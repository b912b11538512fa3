"""Pick a model: the demo model, the models already on disk, the presets, or one typed in any form every command
reads (a preset, a .gguf path, ``ORG/REPO[:QUANT]``, ``hf.co/ORG/REPO[:QUANT]``, ``hf:ORG/REPO[:QUANT]``).

Works offline: the disk is scanned in a worker, nothing is fetched. Each choice is opened with its own settings
(the App decides the launch). Dismisses with a :class:`~clover_local.tui.services.ModelChoice` or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Input, OptionList, Static
from textual.widgets.option_list import Option

from clover_local.detect.units import format_bytes
from clover_local.tui import services
from clover_local.tui.services import DiskModel, ModelChoice


class ModelPicker(ModalScreen[ModelChoice | None]):
    """The models on disk first (they open without the network), then the presets (not the test models'),
    then a path box."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "dismiss", "Cancel", id="models.cancel")]

    @dataclass
    class Found(Message, bubble=False):
        on_disk: list[DiskModel]
        presets: list[tuple[str, str]]

    def __init__(self) -> None:
        super().__init__()
        self.choices: dict[str, ModelChoice] = {}
        self.ready = False

    def compose(self) -> ComposeResult:
        with Vertical(id="models-box", classes="dialog"):
            yield Static("Choose a model", classes="dialog-title")
            yield Static("Looking for models on this machine…", id="models-note", classes="muted")
            yield OptionList(id="models-list")
            yield Input(
                placeholder="…or a .gguf path, ORG/REPO[:QUANT] or hf.co/ORG/REPO[:QUANT], then Enter",
                id="models-path",
            )

    def on_mount(self) -> None:
        self._find()
        self.query_one("#models-list", OptionList).focus()

    @work(thread=True, exclusive=True)
    def _find(self) -> None:
        on_disk = services.models_on_disk()
        presets = [(p.name, p.display_name) for p in services.picker_presets()]
        self.post_message(ModelPicker.Found(on_disk, presets))

    def on_model_picker_found(self, message: Found) -> None:
        options = self.query_one("#models-list", OptionList)
        options.clear_options()
        self.choices = {}
        for i, disk in enumerate(message.on_disk):
            key = f"disk-{i}"
            self.choices[key] = ModelChoice(path=disk.path)
            options.add_option(Option(f"On disk  {disk.label} ({format_bytes(disk.size_bytes)})", id=key))
        for name, display in message.presets:
            key = f"preset-{name}"
            self.choices[key] = ModelChoice(preset=name)
            options.add_option(Option(f"Preset   {display} ({name})", id=key))
        where = (
            f"{len(message.on_disk)} on disk (no network needed)" if message.on_disk else "none on disk yet"
        )
        self.query_one("#models-note", Static).update(f"Models: {where}; presets download when chosen.")
        if message.on_disk or message.presets:
            options.highlighted = 0
        self.ready = True

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        choice = self.choices.get(event.option.id or "")
        if choice is not None:
            self.dismiss(choice)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        from clover_local.errors import CloverError

        try:
            choice = services.choice_for_name(event.value)
        except CloverError as exc:
            self.query_one("#models-note", Static).update(Text(str(exc)))  # not markup: it holds [:QUANT]
            return
        self.dismiss(choice)
