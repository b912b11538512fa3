"""Run ``clover-local ARGS`` in this process and SIGKILL it at one phase of a download (a test tool).

    python tests/download_fault_child.py PHASE ARGS...

The kill is real (no cleanup handlers, no ``finally``), so the cache is left exactly as a power cut or
the OOM killer would leave it. PHASE is one of :data:`PHASES`.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from clover_local.cli import main
from clover_local.fetch import cache, progress, transfer

PHASES = (
    "before-transfer",  # the partial is open, no byte asked for yet
    "mid-transfer",  # half the bytes are on disk
    "end-of-transfer",  # every byte is on disk, nothing verified yet
    "checking",  # re-reading a partial an earlier run left
    "verifying",  # comparing the sha256
    "rename",  # verified, just before the partial becomes the blob
    "link",  # the blob is in place, the snapshot link is not
)


def _die() -> None:
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _kill_before(owner: Any, name: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _die()
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def _kill_on_phase(phase: str) -> None:
    original = progress.ProgressTracker.start

    def start(self: progress.ProgressTracker, p: progress.Phase, index: int, already: int = 0) -> None:
        if p == phase:
            _die()
        original(self, p, index, already)

    progress.ProgressTracker.start = start  # type: ignore[method-assign]


def _kill_after_bytes(fraction: float) -> None:
    original = transfer._HashingWriter.write

    def write(self: transfer._HashingWriter, data: bytes) -> int:
        n = original(self, data)
        size = int(os.environ["FAULT_FILE_SIZE"])
        if self.tell() >= size * fraction:
            _die()
        return n

    transfer._HashingWriter.write = write  # type: ignore[method-assign]


def arm(phase: str) -> None:
    """Install the kill for ``phase``."""
    if phase == "before-transfer":
        _kill_before(transfer, "_transfer_once")
    elif phase == "mid-transfer":
        _kill_after_bytes(0.5)
    elif phase == "end-of-transfer":
        _kill_after_bytes(1.0)
    elif phase in ("checking", "verifying"):
        _kill_on_phase(phase)
    elif phase == "rename":
        _kill_before(cache, "move_into_place")
    elif phase == "link":
        _kill_before(cache, "link_snapshot")
    else:
        raise SystemExit(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")


if __name__ == "__main__":
    arm(sys.argv[1])
    sys.exit(main(sys.argv[2:]))
