"""The chat list says what went wrong when a rename or delete fails, even while chats remain to list (the hint
on how to use the list used to overwrite the error whenever there were chats)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from helpers_tui import ScreenHost
from textual.widgets import Input, Static
from waiting import wait_until

from clover_local import chat_store
from clover_local.chat_store import ChatStore
from clover_local.engine.types import ChatMessage
from clover_local.tui.screens.chat_list import ChatList


class DiskFullStore(ChatStore):
    """The real store, whose writes fail as on a full disk."""

    def rename(self, chat_id: int, title: str) -> None:
        raise chat_store._store_error(self.path, sqlite3.OperationalError("database or disk is full"))


def test_a_failed_rename_shows_its_error_while_the_chats_stay_listed(tmp_path: Path) -> None:
    store = DiskFullStore(tmp_path / "chats.sqlite3")
    chat = store.start("smollm2-135m", "")
    store.put(chat, 0, ChatMessage("user", "Tell me about owls."))

    async def run() -> None:
        screen = ChatList(store)
        host = ScreenHost(lambda: screen)
        async with host.run_test(size=(100, 24)) as pilot:
            await wait_until(lambda: screen.listings == 1, "the list", pilot=pilot)
            note = screen.query_one("#chats-note", Static)
            assert "Enter opens" in str(note.render())
            await pilot.press("f2")
            screen.query_one("#chats-search", Input).value = "Owls"
            await pilot.press("enter")
            await wait_until(lambda: screen.listings == 2, "the list after the rename", pilot=pilot)
            shown = str(note.render())
            assert "disk is full" in shown and "Enter opens" not in shown, shown
            assert [c.title for c in screen.chats] == ["Tell me about owls."]

    asyncio.run(run())
