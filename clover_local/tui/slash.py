"""Slash commands typed in the chat's message box (``/new``, ``/set temperature 0.7``...), as ``ollama run``
has them: parsed here into a :class:`Command`, carried out by the chat screen. Nothing here imports Textual."""

from __future__ import annotations

from dataclasses import dataclass

from clover_local.errors import UsageError

COMMANDS: dict[str, str] = {
    "/new": "start a new chat (this one is kept: Ctrl+O lists it)",
    "/clear": "clear the screen and the context: a new chat",
    "/chats": "list, search, rename or delete your chats (Ctrl+O)",
    "/model": "switch model: the models on disk, the presets, a file",
    "/system": "/system TEXT sets this chat's system prompt; /system alone shows it",
    "/set": "/set temperature 0.7 (also top_p, top_k, max_tokens): saved for this model",
    "/save": "export this chat as Markdown and JSON",
    "/help": "every key and command",
}
SETTABLE: dict[str, type] = {"temperature": float, "top_p": float, "top_k": int, "max_tokens": int}


@dataclass(frozen=True)
class Command:
    name: str
    """``/new``, ``/set``..."""
    argument: str = ""
    setting: str = ""
    """For ``/set``: which setting."""
    value: float | int = 0


def parse(text: str) -> Command | None:
    """The command ``text`` is, or None when it is a message (it does not start with ``/``, or starts with
    ``//``, which sends the rest as written). A ``/word`` that is no command is a UsageError listing them."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    name, _, argument = stripped.partition(" ")
    name = name.lower()
    argument = argument.strip()
    if name not in COMMANDS:
        raise UsageError(
            f"{name} is not a command.",
            f"Commands: {', '.join(COMMANDS)}. To send a message that starts with /, start it with //.",
        )
    if name != "/set":
        return Command(name, argument)
    setting, _, raw = argument.partition(" ")
    kind = SETTABLE.get(setting)
    if kind is None or not raw.strip():
        raise UsageError(
            f"/set needs a setting and a value, not {argument!r}.",
            f"For example /set temperature 0.7; settings: {', '.join(SETTABLE)}.",
        )
    try:
        value = kind(raw.strip())
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise UsageError(f"/set {setting}: {raw.strip()!r} is not {noun}.") from None
    return Command(name, argument, setting=setting, value=value)


def message_text(text: str) -> str:
    """What a message that is not a command sends: ``//x`` sends ``/x``."""
    stripped = text.strip()
    return stripped[1:] if stripped.startswith("//") else stripped
