"""Helpers for the TUI tests: wait for a condition instead of sleeping, and a host app for one screen."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from textual.app import App
from textual.pilot import Pilot
from textual.screen import Screen

from clover_local.tui.app import CloverApp


async def wait_until(pilot: Pilot, predicate: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
    """Let the app run until ``predicate()`` holds. ``limit_s`` only keeps a broken test from hanging."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        await pilot.pause(0.02)


class ScreenHost(App[None]):
    """The app's stylesheet around one screen built by ``make_screen`` (a screen under test)."""

    CSS_PATH = CloverApp.CSS_PATH

    def __init__(self, make_screen: Callable[[], Screen[object]]) -> None:
        super().__init__()
        self._make_screen = make_screen

    def on_mount(self) -> None:
        self.push_screen(self._make_screen())
