"""A llama-server child's slots kept across a relaunch: each slot's state (its tokens, KV cells and recurrent
state) saved to a file before the child stops and restored into the new one, so a conversation in progress is
not read again (``POST /slots/ID?action=save|restore``, enabled by ``--slot-save-path``; upstream
``tools/server/server-context.cpp``, ``llama_state_seq_save_file``). The files hold prompts' state: they live in
a folder only this user can read (:func:`private_slot_dir`) and are deleted once restored."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from clover_local.errors import ServerError
from clover_local.llamacpp import http_client

log = logging.getLogger("clover_local.runner")
SAVE_TIMEOUT_S = 120.0
"""A slot of a long conversation on a large model writes some hundreds of MB."""


@dataclass(frozen=True)
class SavedSlot:
    slot: int
    filename: str
    tokens: int


def private_slot_dir() -> str:
    """A new folder for one child's slot files, readable by this user only (removed by :func:`remove_slot_dir`)."""
    return tempfile.mkdtemp(prefix="clover-slots-")  # mode 0700


def remove_slot_dir(directory: str | None) -> None:
    if directory:
        shutil.rmtree(directory, ignore_errors=True)


def save_slots(base_url: str, api_key: str | None, directory: str | None, slots: int) -> list[SavedSlot]:
    """Save every slot that holds tokens; the ones saved (none where the child cannot save, or a save fails:
    then the conversation is read again, as after any start)."""
    if directory is None:
        return []
    saved: list[SavedSlot] = []
    for slot in range(slots):
        filename = f"slot-{slot}.bin"
        tokens = _slot_action(base_url, api_key, slot, "save", filename)
        if tokens:
            saved.append(SavedSlot(slot, filename, tokens))
    return saved


def restore_slots(base_url: str, api_key: str | None, saved: list[SavedSlot]) -> None:
    """Restore what :func:`save_slots` saved into the new child."""
    for entry in saved:
        _slot_action(base_url, api_key, entry.slot, "restore", entry.filename)


def _slot_action(base_url: str, api_key: str | None, slot: int, action: str, filename: str) -> int | None:
    """``POST /slots/ID?action=save|restore`` of one slot's file; the tokens saved or restored, None (logged)
    when it failed."""
    try:
        resp = http_client.request(
            base_url,
            "POST",
            f"/slots/{slot}?action={action}",
            {"filename": filename},
            api_key=api_key,
            timeout_s=SAVE_TIMEOUT_S,
        )
    except ServerError as exc:
        log.warning("could not %s llama-server's slot %d: %s", action, slot, exc.what)
        return None
    data = resp.json()
    field = {"save": "n_saved", "restore": "n_restored"}[action]
    tokens = data.get(field) if resp.status == 200 and isinstance(data, dict) else None
    if isinstance(tokens, int):
        return tokens
    log.warning("llama-server did not %s slot %d (HTTP %d): %s", action, slot, resp.status, data)
    return None


def forget_slots(directory: str | None, saved: list[SavedSlot]) -> None:
    """Delete the slot files once restored (or given up)."""
    if directory is None:
        return
    for entry in saved:
        path = Path(directory) / entry.filename
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not delete %s: %s", path, exc)
