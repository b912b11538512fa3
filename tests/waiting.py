"""The one way tests wait: for a condition, never for a fixed time (CI runs on a busy machine).

``wait_until(predicate, what)`` polls in the calling thread; with ``pilot=`` it returns a coroutine that lets the
Textual app run between polls (``await wait_until(..., pilot=pilot)``). ``limit_s`` only keeps a broken test
from hanging: it is generous, and never an assertion about speed. It stays below the per-test time limit
(``timeout`` in pyproject.toml, 300 s), so a test that gives up says what it was waiting for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, overload

import pytest
from textual.pilot import Pilot

POLL_S = 0.02
LIMIT_S = 240.0


@overload
def wait_until(
    predicate: Callable[[], object], what: str = ..., limit_s: float = ..., *, pilot: None = ...
) -> None: ...


@overload
def wait_until(
    predicate: Callable[[], object], what: str = ..., limit_s: float = ..., *, pilot: Pilot[Any]
) -> Coroutine[Any, Any, None]: ...


def wait_until(
    predicate: Callable[[], object],
    what: str = "the condition",
    limit_s: float = LIMIT_S,
    *,
    pilot: Pilot[Any] | None = None,
) -> Coroutine[Any, Any, None] | None:
    """Wait until ``predicate()`` is true; fail naming ``what`` if it never is within ``limit_s``."""
    if pilot is not None:
        return _wait_in_app(pilot, predicate, what, limit_s)
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for: {what}")
        time.sleep(POLL_S)
    return None


async def _wait_in_app(pilot: Pilot[Any], predicate: Callable[[], object], what: str, limit_s: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not predicate():
        if loop.time() > deadline:
            pytest.fail(f"gave up waiting for: {what}")
        await pilot.pause(POLL_S)
