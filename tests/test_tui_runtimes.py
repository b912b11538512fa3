"""The app's runtimes screen (F3), the real app through Pilot against the releases stand-in: it lists the pinned
llama.cpp and what is installed, offers the latest release and installs it (a real llama-server, packed as
upstream packs a release, under the archive name this machine picks), Esc cancels an install and leaves nothing
installed, offline and unreachable are said in a line, a wrong digest and a release with no archive for this
machine are messages (the second with a source build offered), and a removal asks first."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers_runtimes import (
    PINNED_BIN,
    host_asset,
    pinned_runtime_archive,
    publish,
    releases,
    script_runtime,
    tar_gz,
)
from releases_server import ReleasesServer
from textual.pilot import Pilot
from textual.widgets import Button, DataTable, Log, Static
from waiting import wait_until

from clover_local import settings
from clover_local.detect import parse_simulate
from clover_local.runtimes.assets import Target
from clover_local.runtimes.install import downloads_dir, install
from clover_local.runtimes.installed import installed_runtimes
from clover_local.tui.app import CloverApp, StartOptions
from clover_local.tui.screens.plan import PlanScreen
from clover_local.tui.screens.runtimes import ConfirmRemove, RuntimesScreen

__all__ = ["releases"]  # the fixture


@pytest.fixture(scope="session")
def real_archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return pinned_runtime_archive(tmp_path_factory.mktemp("real-runtime"), "b9100")


def _app() -> CloverApp:
    return CloverApp(StartOptions(preset="gemma3-270m"), machine=parse_simulate("ram=16G,cpu=4"))


async def _open(app: CloverApp, pilot: Pilot[None]) -> RuntimesScreen:
    await wait_until(lambda: isinstance(app.screen, PlanScreen), "the plan screen", pilot=pilot)
    await pilot.press("f3")
    await wait_until(lambda: isinstance(app.screen, RuntimesScreen), "the runtimes screen", pilot=pilot)
    screen = app.screen
    assert isinstance(screen, RuntimesScreen)
    await wait_until(
        lambda: screen.latest is not None or screen.latest_error is not None,
        "the latest release read",
        pilot=pilot,
    )
    return screen


def _text(screen: RuntimesScreen, selector: str) -> str:
    return str(screen.query_one(selector, Static).render())


def _rows(screen: RuntimesScreen) -> list[str]:
    return [str(key.value) for key in screen.query_one("#runtimes-table", DataTable).rows]


@pytest.mark.slow
async def test_the_latest_release_installs_from_the_screen(
    releases: ReleasesServer, real_archive: Path
) -> None:
    publish(releases, "b9100", real_archive, name=host_asset("b9100"))
    if (PINNED_BIN / "llama-arch.cpp").is_file():  # the pinned build's own table, as the release's source
        releases.add_raw("b9100", "src/llama-arch.cpp", (PINNED_BIN / "llama-arch.cpp").read_bytes())
    app = _app()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await _open(app, pilot)
        assert screen.latest is not None and screen.latest.tag == "b9100"
        assert "llama.cpp b9100" in _text(screen, "#runtimes-latest")
        assert "not installed" in _text(screen, "#runtimes-latest")
        assert _rows(screen)[0] == "pinned-0", "nothing installed: the pinned llama.cpp only"
        table = screen.query_one("#runtimes-table", DataTable)
        assert table.get_row("pinned-0")[1:3] == ["embedded", "llama-cpp-python"]
        await pilot.press("i")
        await wait_until(lambda: screen.ended == 1, "the install to end", pilot=pilot)
        assert _text(screen, "#runtime-error") == ""
        installed = installed_runtimes()
        assert [rt.tag for rt in installed] == ["b9100"] and screen.installed_now == installed[0]
        assert _rows(screen)[0] == "b9100"
        assert table.get_row("b9100") == ["b9100", installed[0].backend, "archive", str(installed[0].root)]
        assert "Ready: a model that needs llama.cpp b9100 runs on it" in _text(screen, "#runtime-status")
        steps = "\n".join(screen.query_one("#runtime-steps", Log).lines)
        assert "Downloading" in steps and "Unpacking" in steps and "architectures" in steps
        assert ", installed." in _text(screen, "#runtimes-latest")
        assert screen.query_one("#runtime-install", Button).disabled
        await pilot.press("escape")
        await wait_until(lambda: isinstance(app.screen, PlanScreen), "back to the plan", pilot=pilot)


async def test_esc_cancels_an_install_and_leaves_nothing(releases: ReleasesServer) -> None:
    name = publish(
        releases, "b9001", tar_gz(script_runtime("b9001", padding=600_000)), name=host_asset("b9001")
    )
    releases.knobs("b9001", name).hold_at = 200_000
    app = _app()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await _open(app, pilot)
        await pilot.press("i")
        await wait_until(lambda: releases.held_streams == 1, "the transfer held at 200 kB", pilot=pilot)
        # Every byte sent is on disk, so the install waits for the next ones: Esc is seen as "Cancelling" until
        # they come (pressed while some still sat in the socket buffer, it met them at once and ended first).
        part = downloads_dir("b9001") / (name + ".part")
        await wait_until(
            lambda: part.exists() and part.stat().st_size >= 200_000, "the 200 kB sent on disk", pilot=pilot
        )
        await pilot.press("escape")
        assert "Cancelling" in _text(screen, "#runtime-status")
        releases.knobs("b9001", name).hold_at = None  # the next bytes arrive and meet the cancel
        await wait_until(lambda: screen.ended == 1, "the install to stop", pilot=pilot)
        assert app.screen is screen, "Esc during an install cancels it, and stays"
        assert "Cancelled: nothing was installed" in _text(screen, "#runtime-status")
        assert installed_runtimes() == ()
        base = settings.runtimes_dir()
        assert not (base / "b9001").exists() and not list(base.glob(".partial-*"))
        assert all(row.startswith("pinned-") for row in _rows(screen))
        assert not screen.query_one("#runtime-install", Button).disabled, "it can be installed again"


@pytest.mark.parametrize("how", ["offline", "unreachable"])
async def test_offline_or_unreachable_is_a_line(
    how: str, releases: ReleasesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    if how == "offline":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    else:
        releases.stop()
    app = _app()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await _open(app, pilot)
        line = _text(screen, "#runtimes-latest")
        assert (
            line.startswith("The latest release is unknown: ") and "find the latest llama.cpp release" in line
        )
        assert ("offline mode is on" if how == "offline" else "unreachable") in line
        assert "Traceback" not in line
        assert screen.query_one("#runtime-install", Button).disabled
        await pilot.press("i")  # nothing to install: nothing happens
        assert not screen.busy
        assert "pinned-0" in _rows(screen), "what is installed is listed offline"


async def test_a_wrong_digest_is_a_message(releases: ReleasesServer) -> None:
    name = publish(releases, "b9001", tar_gz(script_runtime("b9001")), name=host_asset("b9001"))
    releases.knobs("b9001", name).wrong_digest = True
    app = _app()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await _open(app, pilot)
        await pilot.press("i")
        await wait_until(lambda: screen.ended == 1, "the install to fail", pilot=pilot)
        error = _text(screen, "#runtime-error")
        assert "arrived corrupt" in error and "nothing was installed" in error
        assert screen.query_one("#runtime-error", Static).has_class("error")
        assert installed_runtimes() == ()


async def test_no_archive_for_this_machine_offers_a_source_build(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")), name="llama-b9001-bin-ubuntu-s390x.tar.gz")
    app = _app()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await _open(app, pilot)
        await pilot.press("i")
        await wait_until(lambda: screen.ended == 1, "the install to stop", pilot=pilot)
        assert "no prebuilt archive" in _text(screen, "#runtime-error")
        assert screen.source_offer == "b9001"
        build = screen.query_one("#runtime-build", Button)
        assert not build.has_class("-hidden") and "from source" in str(build.label)
        assert not any("/tarball/" in r.path for r in releases.requests), "nothing built before asking"
        build.press()  # as a click does (a click's coordinates can land before the button is laid out)
        await wait_until(lambda: screen.ended == 2, "the source build to stop", pilot=pilot)
        # The stand-in has no source tarball for this tag: the source build's download says so.
        assert any("/tarball/b9001" in r.path for r in releases.requests)
        assert "404" in _text(screen, "#runtime-error")
        assert installed_runtimes() == ()


async def test_remove_asks_then_removes(releases: ReleasesServer) -> None:
    publish(releases, "b9001", tar_gz(script_runtime("b9001")))
    runtime = install("b9001", target=Target("linux", "x64", ("cpu",)))
    app = _app()
    async with app.run_test(size=(100, 32)) as pilot:
        screen = await _open(app, pilot)
        assert _rows(screen)[0] == "b9001" and screen.selected_tag() == "b9001"
        assert ", installed." in _text(screen, "#runtimes-latest")
        await pilot.press("x")
        await wait_until(lambda: isinstance(app.screen, ConfirmRemove), "the question", pilot=pilot)
        await pilot.press("n")
        await wait_until(lambda: app.screen is screen, "back without removing", pilot=pilot)
        assert installed_runtimes() == (runtime,)
        await pilot.press("x")
        await wait_until(lambda: isinstance(app.screen, ConfirmRemove), "the question again", pilot=pilot)
        await pilot.press("y")
        await wait_until(
            lambda: "Removed llama.cpp b9001" in _text(screen, "#runtime-status"), "the removal", pilot=pilot
        )
        assert installed_runtimes() == () and "b9001" not in _rows(screen) and not screen.busy
        assert not runtime.root.exists()
        screen.query_one("#runtimes-table", DataTable).move_cursor(row=0)
        await pilot.press("x")  # a pinned row: not removed here
        assert "pinned llama.cpp is not removed here" in _text(screen, "#runtime-error")


async def test_a_tag_given_is_installed_as_the_screen_opens(releases: ReleasesServer) -> None:
    """What the plan screen's offer uses: the screen opens installing the tag named, and returns the runtime."""
    from helpers_tui import ScreenHost
    from textual.screen import Screen

    publish(releases, "b9001", tar_gz(script_runtime("b9001")), name=host_asset("b9001"), latest=False)
    publish(releases, "b9002", tar_gz(script_runtime("b9002")), name=host_asset("b9002"))
    results: list[object] = []
    screen = RuntimesScreen(install="b9001")
    app = ScreenHost(Screen)
    async with app.run_test(size=(100, 32)) as pilot:
        app.push_screen(screen, results.append)
        await wait_until(lambda: screen.ended == 1, "the install of b9001", pilot=pilot)
        await wait_until(lambda: screen.latest is not None, "the latest release read", pilot=pilot)
        assert [rt.tag for rt in installed_runtimes()] == ["b9001"]
        assert "llama.cpp b9002" in _text(screen, "#runtimes-latest"), "the latest is still offered"
        await pilot.press("escape")
        await wait_until(lambda: results != [], "the screen's result", pilot=pilot)
    assert results == [installed_runtimes()[0]]
