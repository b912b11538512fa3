"""The box a message is written in: Enter sends, Ctrl+J (or Alt+Enter, Shift+Enter) starts a new line, a paste
keeps every line, and Tab completes a slash command.

A TextArea, so a message can span lines and a 5 KB paste is read as lines, not one line scrolling sideways; it
grows with its text up to a few lines, then scrolls. A long paste says how long it is in the box's border.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from textual import events
from textual.binding import Binding, BindingType
from textual.message import Message
from textual.widgets import TextArea

LONG_PASTE_LINES = 8
"""A paste of more lines than this is named in the border (``pasted 120 lines``) and folded in the chat."""


class MessageBox(TextArea):
    """A multi-line message input."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("ctrl+j,alt+enter,shift+enter", "newline", "New line", key_display="^J", id="box.newline"),
        Binding("tab", "complete", "Complete", show=False, id="box.complete"),
    ]

    @dataclass
    class Submitted(Message):
        """Enter: the message as written (the box is empty again by then)."""

        box: MessageBox
        text: str

        @property
        def control(self) -> MessageBox:
            return self.box

    def __init__(self, *, commands: Sequence[str] = (), placeholder: str = "", id: str | None = None) -> None:
        super().__init__(
            soft_wrap=True, tab_behavior="focus", show_line_numbers=False, placeholder=placeholder, id=id
        )
        self.commands = tuple(commands)
        """Slash commands Tab completes (``/new``, ``/set``...)."""

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            text = self.text
            if text.strip():  # emptied now: keys typed after this Enter start the next message
                self.clear_text()
                self.post_message(MessageBox.Submitted(self, text))
            return
        await super()._on_key(event)

    async def _on_paste(self, event: events.Paste) -> None:
        text = event.text.replace("\r\n", "\n").replace("\r", "\n")
        if self.read_only:
            return
        event.stop()
        event.prevent_default()
        result = self.replace(text, *self.selection)
        self.move_cursor(result.end_location)
        self.focus()
        lines = text.count("\n") + 1
        if lines > LONG_PASTE_LINES:
            self.border_subtitle = f"pasted {lines} lines · {len(text.encode())} bytes · sent whole"

    def on_text_area_changed(self, event: TextArea.Changed) -> None:
        if not self.text:
            self.border_subtitle = ""

    def action_newline(self) -> None:
        self.replace("\n", *self.selection)

    def action_complete(self) -> None:
        """Complete a slash command at the start of the box; elsewhere Tab moves the focus on."""
        text = self.text
        if not text.startswith("/") or " " in text or "\n" in text:
            self.screen.focus_next()
            return
        matches = [c for c in self.commands if c.startswith(text)]
        if len(matches) == 1:
            self.text = matches[0] + " "
            self.move_cursor(self.document.end)
        elif matches:
            common = os.path.commonprefix(matches)  # noqa: RUF071 (characters, not path parts)
            if len(common) > len(text):
                self.text = common
                self.move_cursor(self.document.end)
            self.notify("  ".join(matches), timeout=4)
        else:
            self.notify(f"No command starts with {text} (/help lists them).", severity="warning", timeout=4)

    def clear_text(self) -> None:
        self.text = ""
        self.border_subtitle = ""

    def set_text(self, text: str) -> None:
        """Replace the text and put the cursor at its end (a message given back to edit)."""
        self.text = text
        self.move_cursor(self.document.end)
        self.focus()
