"""Damaged user files (settings, presets): kept, set aside, and reported, never fatal.

A file the person or another program wrote can hold anything. When one cannot be used, it is renamed
beside itself (``prefs.json`` -> ``prefs.json.damaged``, numbered when that exists), so nothing is lost
and the next save does not overwrite it, and a sentence naming both files is queued. The CLI prints the
queued notices on stderr; the app shows them as notifications. Pure Python, no Textual.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
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


def write_atomically(path: Path, data: bytes, *, private: bool = False) -> None:
    """Write ``data`` to ``path`` in one step (a reader sees the old file or the new one, never half of it),
    through a temporary file of its own beside it, so two writers never share (and tear) one.

    ``private``: for what holds secrets or the person's data (settings, keys, tokens): the file is 0600 and
    a folder created for it 0700, so no other user of the machine can read it."""
    folder = path.parent
    if private:
        make_private_dir(folder)
    else:
        folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)  # created 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        if not private:
            _chmod_as_new_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def make_private_dir(folder: Path, *, close: bool = False) -> None:
    """Create ``folder`` (and missing parents) readable by its owner only (0700); an existing folder is
    left as the person set it, unless ``close``: then one that others may read (an older version made it
    0755) is made 0700."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    for p in reversed(missing):
        with contextlib.suppress(FileExistsError):
            p.mkdir(mode=0o700)
    for p in missing:
        with contextlib.suppress(OSError):
            os.chmod(p, 0o700)  # mkdir's mode passes through the umask; 0700 is what was asked
    if close and folder.stat().st_mode & 0o077:
        folder.chmod(0o700)


def _chmod_as_new_file(tmp: str) -> None:
    """mkstemp makes 0600; a file that is not private gets the mode a new file gets (0666 less the umask)."""
    umask = current_umask()
    with contextlib.suppress(OSError):
        os.chmod(tmp, 0o666 & ~(0o022 if umask is None else umask))


def current_umask() -> int | None:
    """The process's umask, read without changing it (``os.umask`` sets it, racing other
    threads); None where the OS does not say."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return None
