"""Helpers for the TUI tests: wait for a condition instead of sleeping, and a host app for one screen."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import pytest
from textual.app import App
from textual.pilot import Pilot
from textual.screen import Screen

from clover_local import user_prefs
from clover_local.engine.types import ChatEngine
from clover_local.presets import load_preset
from clover_local.testing.models import gemma_path
from clover_local.tui import services
from clover_local.tui.app import CloverApp


async def wait_until(pilot: Pilot, predicate: Callable[[], bool], what: str, limit_s: float = 120.0) -> None:
    """Let the app run until ``predicate()`` holds. ``limit_s`` only keeps a broken test from hanging."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"gave up waiting for: {what}")
        await pilot.pause(0.02)


@pytest.fixture(scope="session")
def gemma_engine() -> Iterator[ChatEngine]:
    """The real Gemma 3 270M, loaded once per session with a small context (import this fixture to use it)."""
    preset = load_preset("gemma3-270m")
    loaded = services.load(
        str(gemma_path()), preset, user_prefs.ModelSettings(ctx=1024, speculative=True), None, lambda _: None
    )
    yield loaded.engine
    loaded.engine.close()


class ScreenHost(App[None]):
    """The app's stylesheet around one screen built by ``make_screen`` (a screen under test)."""

    CSS_PATH = CloverApp.CSS_PATH

    def __init__(self, make_screen: Callable[[], Screen[object]]) -> None:
        super().__init__()
        self._make_screen = make_screen

    def on_mount(self) -> None:
        self.push_screen(self._make_screen())
