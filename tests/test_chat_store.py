"""The chat store (SQLite, written as each message completes), slash commands and the context check, without a
model: pure functions and the store's file."""

from __future__ import annotations

import sqlite3
import threading

import pytest
from helpers_tui import StillEngine

from clover_local import chat_store
from clover_local.engine.types import TEMPLATE_TOKENS_PER_MESSAGE, ChatMessage
from clover_local.errors import CloverError, UsageError
from clover_local.tui import context_fit, slash


def test_messages_are_kept_in_order_and_a_put_replaces_what_follows() -> None:
    store = chat_store.ChatStore()
    chat = store.start("gemma3-270m", "Be brief.", "2026-01-01T00:00:00+00:00")
    store.put(chat, 0, ChatMessage("user", "one\ntwo"))
    store.put(chat, 1, ChatMessage("assistant", "first reply"))
    store.put(chat, 1, ChatMessage("assistant", "regenerated"))  # the regenerated reply replaces it
    conv = store.load(chat)
    assert conv.messages == (ChatMessage("user", "one\ntwo"), ChatMessage("assistant", "regenerated"))
    assert (conv.system_prompt, conv.model, conv.title) == ("Be brief.", "gemma3-270m", "one two")
    store.truncate(chat, 1)  # a failed turn, an edited message
    assert store.load(chat).messages == (ChatMessage("user", "one\ntwo"),)
    store.put(chat, 1, ChatMessage("system", "never stored"))
    assert len(store.load(chat).messages) == 1, "only the person's and the model's turns"


def test_listing_search_rename_delete_and_private_file() -> None:
    store = chat_store.ChatStore()
    owls = store.start("m", "")
    store.put(owls, 0, ChatMessage("user", "Tell me about owls"))
    boats = store.start("m", "")
    store.put(boats, 0, ChatMessage("user", "Boats?"))
    store.put(boats, 1, ChatMessage("assistant", "They float, 100% of the time_ish."))
    store.start("m", "")  # empty: never listed
    assert {c.title for c in store.list()} == {"Tell me about owls", "Boats?"}
    assert [c.title for c in store.list("FLOAT")] == ["Boats?"], "messages are searched, case-insensitively"
    assert [c.title for c in store.list("100%")] == ["Boats?"] and store.list("0%x") == [], "% is literal"
    assert store.list("e_a") == [], "_ is literal (it would match the e a of me about)"
    store.rename(owls, "  Owls,\n renamed ")
    assert "Owls, renamed" in {c.title for c in store.list()}
    store.delete(owls)
    assert [c.title for c in store.list()] == ["Boats?"]
    with pytest.raises(CloverError, match="deleted"):
        store.load(owls)
    assert store.path.stat().st_mode & 0o777 == 0o600
    assert store.path.parent.stat().st_mode & 0o777 == 0o700


def test_the_journal_writes_in_order_and_starts_a_chat_with_its_first_message() -> None:
    errors: list[CloverError] = []
    journal = chat_store.ChatJournal(chat_store.ChatStore(), errors.append)
    journal.begin("m", "sys")
    journal.flush()
    assert journal.chat_id is None and chat_store.ChatStore().list() == [], "nothing for an empty chat"
    for i in range(20):
        journal.put(i, ChatMessage("user" if i % 2 == 0 else "assistant", f"message {i}"))
    journal.truncate(19)
    journal.flush()
    chat_id = journal.chat_id
    assert chat_id is not None
    messages = chat_store.ChatStore().load(chat_id).messages
    assert [m.content for m in messages] == [f"message {i}" for i in range(19)]
    journal.close()
    journal.put(19, ChatMessage("user", "after close"))  # a closed journal drops writes, never raises
    assert errors == []


def test_a_store_that_cannot_be_written_is_a_clover_error(tmp_path) -> None:  # type: ignore[no-untyped-def]
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    errors: list[CloverError] = []
    done = threading.Event()

    def failed(exc: CloverError) -> None:
        errors.append(exc)
        done.set()

    journal = chat_store.ChatJournal(chat_store.ChatStore(blocked / "chats.sqlite3"), failed)
    journal.put(0, ChatMessage("user", "hello"))
    journal.flush()
    assert errors and "Could not write your chats" in errors[0].what and errors[0].fix
    journal.close()


def test_a_crash_between_messages_keeps_every_committed_one() -> None:
    store = chat_store.ChatStore()
    chat = store.start("m", "")
    store.put(chat, 0, ChatMessage("user", "kept"))
    # Another connection (as a new process would) sees it at once: each message is its own commit.
    with sqlite3.connect(store.path) as other:
        assert other.execute("SELECT content FROM messages").fetchall() == [("kept",)]


def test_slash_commands() -> None:
    assert slash.parse("hello /new") is None and slash.parse("//etc/hosts") is None
    assert slash.message_text("//etc/hosts") == "/etc/hosts"
    assert slash.parse("/NEW") == slash.Command("/new")
    assert slash.parse("/system Be brief.") == slash.Command("/system", "Be brief.")
    assert slash.parse("/set temperature 0.7") == slash.Command(
        "/set", "temperature 0.7", setting="temperature", value=0.7
    )
    assert slash.parse("/set top_k 5").value == 5  # type: ignore[union-attr]
    with pytest.raises(UsageError, match="not a command"):
        slash.parse("/frobnicate")
    with pytest.raises(UsageError, match="needs a setting"):
        slash.parse("/set colour red")
    with pytest.raises(UsageError, match="not a whole number"):
        slash.parse("/set top_k lots")


def test_the_context_check_counts_and_drops_whole_turns() -> None:
    engine = StillEngine()  # 1024 tokens; a word is a token
    system = (ChatMessage("system", "s"),)
    turns = [
        ChatMessage("user", "a " * 300),
        ChatMessage("assistant", "b " * 300),
        ChatMessage("user", "c " * 300),
    ]
    fit = context_fit.fit(engine, system, turns, 128, drop=False)
    assert not fit.fits and fit.prompt_tokens == 1 + 900 + 4 * TEMPLATE_TOKENS_PER_MESSAGE
    assert fit.reply_room == 128
    dropped = context_fit.fit(engine, system, turns, 128, drop=True)
    assert dropped.fits and dropped.dropped == 2, "the oldest turn (message and reply) left out whole"
    alone = context_fit.fit(engine, system, [ChatMessage("user", "x " * 2000)], 128, drop=True)
    assert not alone.fits and alone.dropped == 0
    assert context_fit.reply_room(1024, 4096) == 128 and context_fit.reply_room(1024, 16) == 16
