"""Damaged user files (settings, presets): kept, set aside, and reported, never fatal.

A file the person or another program wrote can hold anything. When one cannot be used, it is renamed
beside itself (``prefs.json`` -> ``prefs.json.damaged``, numbered when that exists), so nothing is lost
and the next save does not overwrite it, and a sentence naming both files is queued. The CLI prints the
queued notices on stderr; the app shows them as notifications. Pure Python, no Textual.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

DAMAGED_SUFFIX = ".damaged"

_notices: list[str] = []
_lock = threading.Lock()


def set_aside(path: Path, problem: str, consequence: str) -> str:
    """Rename a damaged ``path`` out of the way and queue (and return) a notice saying what happened:
    ``problem`` (what is wrong with it) and ``consequence`` (what clover-local does instead)."""
    target = _free_name(path)
    try:
        os.replace(path, target)
        kept = f"it was renamed to {target} (kept for you to look at or delete)"
    except OSError as exc:
        kept = f"it could not be renamed ({exc.strerror or exc}) and is left as it is"
    notice = f"{path} is damaged ({problem}): {kept}; {consequence}."
    with _lock:
        _notices.append(notice)
    return notice


def take_notices() -> list[str]:
    """The notices queued since the last call (each is shown once)."""
    with _lock:
        taken = list(_notices)
        _notices.clear()
    return taken


def _free_name(path: Path) -> Path:
    candidate = path.with_name(path.name + DAMAGED_SUFFIX)
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}{DAMAGED_SUFFIX}.{n}")
    return candidate
