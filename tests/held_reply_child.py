"""Run ``clover-local ARGS`` in this process with its first reply held still going (a test tool).

    python tests/held_reply_child.py RELEASE_FILE ARGS...

The engine it opens (``launch.open_launch``, as the app and every command open one) hands on the first event
of its first reply that shows something (a diffusion step or a piece of text), then waits until RELEASE_FILE
exists or the reply is cancelled. A test in a real terminal can then read what the app shows mid-reply
however fast the machine makes the reply, and let it go on. Later replies are not held.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from clover_local import launch
from clover_local.cli import main
from clover_local.engine.types import GenerationEvent, GenerationRequest, Refining, TextDelta

HOLD_LIMIT_S = 120.0
"""Only so that a broken test ends: the reply then goes on by itself, and the test sees it was never held."""


def _hold_first_reply(engine: Any, release: Path) -> None:
    real_generate = engine.generate
    held = threading.Event()

    def generate(
        request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        for event in real_generate(request, cancel):
            yield event
            if not held.is_set() and isinstance(event, Refining | TextDelta):
                held.set()
                deadline = time.monotonic() + HOLD_LIMIT_S
                while not release.exists() and not (cancel is not None and cancel.is_set()):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.02)

    engine.generate = generate


def _open_held(release: Path) -> Any:
    real_open = launch.open_launch

    def open_launch(*args: Any, **kwargs: Any) -> Any:
        opened = real_open(*args, **kwargs)
        _hold_first_reply(opened.engine, release)
        return opened

    return open_launch


if __name__ == "__main__":
    launch.open_launch = _open_held(Path(sys.argv[1]))  # type: ignore[assignment]
    sys.exit(main(sys.argv[2:]))
