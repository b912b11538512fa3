"""Saved chat conversations: one JSON file each in ``settings.conversations_dir()``.

Chats are personal: every file is written private (0600, through a temporary name of its own) in a 0700
folder, as ``chat_store`` keeps its database.

Pure Python (no Textual), so the chat screen, tests and any future command share one format. A file that
cannot be read is reported as a :class:`CloverError` naming the file, never a traceback.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from clover_local import settings
from clover_local.engine.types import ChatMessage
from clover_local.errors import CloverError
from clover_local.user_files import make_private_dir, write_atomically

FORMAT_VERSION = 1
_ROLES = ("system", "user", "assistant")
_SLUG_RE = re.compile(r"[^a-z0-9]+")


@dataclass(frozen=True)
class Conversation:
    """A chat as saved: the system prompt, the turns, and which model it was held with."""

    title: str
    messages: tuple[ChatMessage, ...]
    """User and assistant turns in order (the system prompt is kept apart)."""
    system_prompt: str = ""
    model: str = ""
    created: str = field(default_factory=lambda: now())
    """ISO 8601 time the conversation was first saved."""

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FORMAT_VERSION,
            "title": self.title,
            "model": self.model,
            "created": self.created,
            "system_prompt": self.system_prompt,
            "messages": [{"role": m.role, "content": m.content} for m in self.messages],
        }


@dataclass(frozen=True)
class SavedConversation:
    """A listing entry: enough to show and pick a conversation without reading every file."""

    path: Path
    title: str
    created: str
    n_messages: int


def now() -> str:
    """This moment in UTC, to the second, as conversations and the chats file stamp it (ISO 8601)."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def title_from(messages: tuple[ChatMessage, ...] | list[ChatMessage], limit: int = 60) -> str:
    """A short title: the first user message, on one line."""
    for m in messages:
        if m.role == "user" and m.content.strip():
            text = " ".join(m.content.split())
            return text if len(text) <= limit else text[: limit - 1] + "…"
    return "Untitled conversation"


def save(conversation: Conversation, folder: Path | None = None) -> Path:
    """Write the conversation as JSON and return its path. Same created time and title overwrite in place."""
    folder = folder or settings.conversations_dir()
    try:
        make_private_dir(folder, close=True)  # its file names carry the chats' titles
        stamp = re.sub(r"[^0-9]", "", conversation.created)[:14]
        slug = _SLUG_RE.sub("-", conversation.title.lower()).strip("-")[:40] or "conversation"
        path = folder / f"{stamp}-{slug}.json"
        text = json.dumps(conversation.to_json(), indent=2, ensure_ascii=False)
        write_atomically(path, text.encode("utf-8"), private=True)
    except OSError as exc:
        raise CloverError(
            f"Could not save the conversation in {folder}: {exc.strerror or exc}.",
            "Check that the folder is writable, or set CLOVER_DATA_DIR to another folder.",
        ) from None
    return path


def load(path: Path) -> Conversation:
    """Read one saved conversation; a damaged file raises a CloverError that names it."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CloverError(f"No saved conversation at {path}.") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CloverError(
            f"The conversation file {path} cannot be read: {exc}.",
            "It may be damaged; move it out of the conversations folder.",
        ) from None
    return _parse(raw, path)


def _parse(raw: object, path: Path) -> Conversation:
    def bad(why: str) -> CloverError:
        return CloverError(f"The conversation file {path} is not in clover-local's format: {why}.")

    if not isinstance(raw, dict):
        raise bad("the top level is not an object")
    items = raw.get("messages")
    if not isinstance(items, list):
        raise bad("'messages' is missing or not a list")
    messages: list[ChatMessage] = []
    for i, item in enumerate(items):
        if (
            not isinstance(item, dict)
            or item.get("role") not in _ROLES
            or not isinstance(item.get("content"), str)
        ):
            raise bad(f"message {i} needs a role ({', '.join(_ROLES)}) and text content")
        messages.append(ChatMessage(role=item["role"], content=item["content"]))
    text_fields = {k: raw.get(k, "") for k in ("title", "model", "created", "system_prompt")}
    for key, value in text_fields.items():
        if not isinstance(value, str):
            raise bad(f"'{key}' must be text")
    return Conversation(
        title=text_fields["title"] or title_from(messages),
        messages=tuple(messages),
        system_prompt=text_fields["system_prompt"],
        model=text_fields["model"],
        created=text_fields["created"] or now(),
    )


def list_saved(folder: Path | None = None) -> list[SavedConversation]:
    """Saved conversations, newest first. Files that cannot be read are skipped (load() reports them)."""
    folder = folder or settings.conversations_dir()
    if not folder.is_dir():
        return []
    out: list[SavedConversation] = []
    for path in folder.glob("*.json"):
        try:
            conv = load(path)
        except CloverError:
            continue
        out.append(SavedConversation(path, conv.title, conv.created, len(conv.messages)))
    out.sort(key=lambda s: (s.created, s.path.name), reverse=True)
    return out


def to_markdown(conversation: Conversation) -> str:
    """The conversation as a Markdown document: a heading, the system prompt, then each turn."""
    lines = [f"# {conversation.title}", ""]
    meta = [f"Model: {conversation.model}" if conversation.model else "", f"Started: {conversation.created}"]
    lines += [" · ".join(m for m in meta if m), ""]
    if conversation.system_prompt.strip():
        lines += ["## System", "", conversation.system_prompt.strip(), ""]
    for m in conversation.messages:
        lines += ["## You" if m.role == "user" else "## Model", "", m.content.strip(), ""]
    return "\n".join(lines)


def export(conversation: Conversation, folder: Path | None = None) -> tuple[Path, Path]:
    """Write the conversation as JSON (:func:`save`) and as Markdown next to it; both paths."""
    json_path = save(conversation, folder)
    md_path = json_path.with_suffix(".md")
    try:
        write_atomically(md_path, to_markdown(conversation).encode("utf-8"), private=True)
    except OSError as exc:
        raise CloverError(
            f"Could not write {md_path}: {exc.strerror or exc}.",
            "Check that the folder is writable, or set CLOVER_DATA_DIR to another folder.",
        ) from None
    return json_path, md_path
