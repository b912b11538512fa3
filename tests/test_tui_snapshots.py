"""Pictures of the main screens at 80x24 and 120x40 (pytest-textual-snapshot). Deterministic: a simulated
machine, a fixed conversation, an engine that never generates (no model is loaded). Update after a deliberate change with ``--snapshot-update``."""

from __future__ import annotations

import pytest
from helpers_runtimes import arch_cpp, releases
from helpers_tui import ScreenHost, StillEngine, steady_cursors
from releases_server import ReleasesServer
from textual.pilot import Pilot
from waiting import wait_until

from clover_local import conversations, user_prefs
from clover_local.detect import parse_simulate
from clover_local.engine.types import ChatMessage
from clover_local.testing.models import CLOVER_ARCH
from clover_local.tui.app import CloverApp, StartOptions
from clover_local.tui.screens.chat import ChatScreen
from clover_local.tui.screens.modals import HelpScreen, SettingsScreen
from clover_local.tui.screens.plan import PlanScreen

pytestmark = pytest.mark.slow
__all__ = ["releases"]  # the fixture
SIZES = [(80, 24), (120, 40)]

CONVERSATION = conversations.Conversation(
    title="Planets",
    messages=(
        ChatMessage("user", "Name the inner planets, briefly."),
        ChatMessage(
            "assistant",
            "<think>Four rocky planets, closest first.</think>The inner planets are:\n\n"
            "1. **Mercury**\n2. **Venus**\n3. **Earth**\n4. **Mars**\n\n```python\nprint('rocky')\n```",
        ),
        ChatMessage("user", "And the largest?"),
        ChatMessage("assistant", "**Jupiter**, more than twice the mass of all the others together."),
    ),
    created="2026-01-01T00:00:00+00:00",
)


def _plan_app() -> CloverApp:
    return CloverApp(
        StartOptions(preset="clover-35b-a3b"), machine=parse_simulate("ram=64G,gpu=nvidia:24G,cpu=16")
    )


async def _plan_ready(pilot: Pilot) -> None:
    await wait_until(
        lambda: isinstance(pilot.app.screen, PlanScreen) and pilot.app.screen.plan is not None,
        "plan",
        pilot=pilot,
    )
    steady_cursors(pilot.app)
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_plan_screen(snap_compare, size: tuple[int, int], releases: ReleasesServer) -> None:  # type: ignore[no-untyped-def]
    """The Clover plan on a fresh install: the latest release (the stand-in's b12060) knows clover_moe, so the
    plan names it and offers its install."""
    releases.add_release("b12060")
    releases.add_raw("b12060", "src/llama-arch.cpp", arch_cpp(CLOVER_ARCH))
    assert snap_compare(_plan_app(), terminal_size=size, run_before=_plan_ready)


def _chat_app() -> ScreenHost:
    settings = user_prefs.ModelSettings(max_tokens=16, ctx=1024)
    return ScreenHost(lambda: ChatScreen(StillEngine(), "gemma3-270m", settings))


async def _show_conversation(pilot: Pilot) -> None:
    screen = pilot.app.screen
    assert isinstance(screen, ChatScreen)
    await screen.show_conversation(CONVERSATION)
    steady_cursors(pilot.app)
    await pilot.pause()


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chat_screen(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    assert snap_compare(_chat_app(), terminal_size=size, run_before=_show_conversation)


def test_chat_screen_light_theme(snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def light(pilot: Pilot) -> None:
        pilot.app.theme = "textual-light"
        await _show_conversation(pilot)

    assert snap_compare(_chat_app(), terminal_size=(80, 24), run_before=light)


def test_settings_dialog(snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def open_settings(pilot: Pilot) -> None:
        await pilot.press("f2")
        await wait_until(lambda: isinstance(pilot.app.screen, SettingsScreen), "settings", pilot=pilot)
        steady_cursors(pilot.app)
        await pilot.pause()

    assert snap_compare(_chat_app(), terminal_size=(80, 24), run_before=open_settings)


def test_help_screen(snap_compare) -> None:  # type: ignore[no-untyped-def]
    async def open_help(pilot: Pilot) -> None:
        await _plan_ready(pilot)
        await pilot.press("f1")
        await wait_until(lambda: isinstance(pilot.app.screen, HelpScreen), "help", pilot=pilot)
        steady_cursors(pilot.app)
        await pilot.pause()

    assert snap_compare(_plan_app(), terminal_size=(80, 24), run_before=open_help)


@pytest.mark.parametrize("size", SIZES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_context_full_dialog(snap_compare, size: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    from clover_local.tui.screens.modals import ContextFullScreen

    async def full(pilot: Pilot) -> None:
        await _show_conversation(pilot)
        pilot.app.push_screen(ContextFullScreen(1024))
        await wait_until(lambda: isinstance(pilot.app.screen, ContextFullScreen), "the dialog", pilot=pilot)
        await pilot.pause()

    assert snap_compare(_chat_app(), terminal_size=size, run_before=full)
