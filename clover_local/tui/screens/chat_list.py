"""Your chats: every conversation kept as it went, newest first, to open, rename, delete or search.

Reads and writes go through :class:`~clover_local.chat_store.ChatStore` in thread workers. Dismisses with
``(chat id, conversation)`` to open, or None.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Footer, Input, OptionList, Static
from textual.widgets.option_list import Option

from clover_local.chat_store import ChatStore, StoredChat
from clover_local.conversations import Conversation
from clover_local.errors import CloverError


def chat_line(chat: StoredChat, current: int | None = None) -> str:
    when = chat.updated[:16].replace("T", " ")
    mark = " (open)" if chat.id == current else ""
    return f"{when}  {chat.title}{mark}  · {chat.n_messages} messages · {chat.model}"


class ChatList(ModalScreen[tuple[int, Conversation] | None]):
    """Pick a chat to continue; type to search; F2 renames, Delete deletes (asks once more)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "cancel", "Close", id="chats.cancel"),
        Binding("f2", "rename", "Rename", id="chats.rename"),
        Binding("delete,ctrl+d", "delete", "Delete", id="chats.delete"),
    ]

    @dataclass
    class Listed(Message, bubble=False):
        chats: list[StoredChat]
        error: str | None

    @dataclass
    class Loaded(Message, bubble=False):
        chat_id: int
        conversation: Conversation | None
        error: str | None

    def __init__(self, store: ChatStore, *, current: int | None = None) -> None:
        super().__init__()
        self.store = store
        self.current = current
        self.chats: list[StoredChat] = []
        self.renaming: int | None = None
        self.confirm_delete: int | None = None
        self.listings = 0
        """Listings shown so far (tests wait on it)."""

    def compose(self) -> ComposeResult:
        with Vertical(id="chats-box", classes="dialog"):
            yield Static("Your chats", classes="dialog-title")
            yield Input(placeholder="Search titles and messages", id="chats-search")
            yield OptionList(id="chats-list")
            yield Static("", id="chats-note", classes="muted", markup=False)
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        self._list("")
        self.query_one("#chats-search", Input).focus()

    @work(thread=True, exclusive=True, group="chats-list")
    def _list(self, search: str) -> None:
        try:
            self.post_message(ChatList.Listed(self.store.list(search), None))
        except CloverError as exc:
            self.post_message(ChatList.Listed([], str(exc)))

    def on_chat_list_listed(self, message: Listed) -> None:
        self.chats = message.chats
        options = self.query_one("#chats-list", OptionList)
        options.clear_options()
        options.add_options(Option(chat_line(c, self.current), id=str(c.id)) for c in self.chats)
        hint = (
            "Enter opens · F2 renames · Tab to the list, then Delete deletes · type to search"
            if self.chats
            else "No chats yet: every chat is kept here as it goes."
        )
        self.query_one("#chats-note", Static).update(message.error or hint)
        if self.chats:
            options.highlighted = 0
        self.listings += 1

    def on_input_changed(self, event: Input.Changed) -> None:
        if self.renaming is None:
            self._list(event.value)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if self.renaming is not None:
            chat_id, self.renaming = self.renaming, None
            title = event.value.strip()
            with event.input.prevent(Input.Changed):
                event.input.value = ""
            event.input.placeholder = "Search titles and messages"
            if title:
                self._write(lambda: self.store.rename(chat_id, title))
            return
        if self.chats:
            options = self.query_one("#chats-list", OptionList)
            self._open(self.chats[options.highlighted or 0].id)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self._open(int(event.option.id or 0))

    def _selected(self) -> StoredChat | None:
        index = self.query_one("#chats-list", OptionList).highlighted
        return self.chats[index] if index is not None and index < len(self.chats) else None

    def action_rename(self) -> None:
        chat = self._selected()
        if chat is None:
            return
        self.renaming = chat.id
        box = self.query_one("#chats-search", Input)
        box.placeholder = f"New title for {chat.title!r} (Enter saves, Esc cancels)"
        with box.prevent(Input.Changed):
            box.value = chat.title
        box.focus()

    def action_delete(self) -> None:
        chat = self._selected()
        if chat is None:
            return
        if self.confirm_delete != chat.id:
            self.confirm_delete = chat.id
            self.query_one("#chats-note", Static).update(f"Delete {chat.title!r}? Press Delete again.")
            return
        self.confirm_delete = None
        self._write(lambda: self.store.delete(chat.id))

    def _write(self, change: Callable[[], None]) -> None:
        self._change(change, self.query_one("#chats-search", Input).value if self.renaming is None else "")

    @work(thread=True, group="chats-change")
    def _change(self, change: Callable[[], None], search: str) -> None:
        """A rename or delete, then the list again."""
        try:
            change()
            self.post_message(ChatList.Listed(self.store.list(search), None))
        except CloverError as exc:
            self.post_message(ChatList.Listed(self.chats, str(exc)))

    @work(thread=True, exclusive=True, group="chats-open")
    def _open(self, chat_id: int) -> None:
        try:
            self.post_message(ChatList.Loaded(chat_id, self.store.load(chat_id), None))
        except CloverError as exc:
            self.post_message(ChatList.Loaded(chat_id, None, str(exc)))

    def on_chat_list_loaded(self, message: Loaded) -> None:
        if message.conversation is None:
            self.notify(message.error or "The chat could not be read.", severity="error")
            return
        self.dismiss((message.chat_id, message.conversation))

    def action_cancel(self) -> None:
        if self.renaming is not None:
            self.renaming = None
            box = self.query_one("#chats-search", Input)
            box.value, box.placeholder = "", "Search titles and messages"  # the whole list again
            return
        self.dismiss(None)
