"""The plan and download screens, and the whole first-run flow: plan -> download from the fake Hub -> launch ->
chat with the real Gemma 3 270M; the next start goes straight to chat."""

from __future__ import annotations

import shlex
from dataclasses import replace
from pathlib import Path

import pytest
from helpers_tui import ScreenHost
from hub_server import HubServer
from textual.screen import Screen
from textual.widgets import Button, Input, Select, Static
from waiting import wait_until

from clover_local import settings, user_prefs
from clover_local.detect import parse_simulate
from clover_local.launch import LaunchRequest, decide_launch
from clover_local.presets import load_preset
from clover_local.testing.models import gemma_path, tiny_model
from clover_local.tui.app import CloverApp, StartOptions
from clover_local.tui.screens.chat import ChatScreen
from clover_local.tui.screens.download import DownloadScreen
from clover_local.tui.screens.launch import LaunchScreen
from clover_local.tui.screens.plan import PlanScreen
from clover_local.tui.widgets.memory import MemoryView
from clover_local.tui.widgets.message_box import MessageBox
from clover_local.tui.widgets.messages import ReplyView

REPO = "test-org/gemma-3-270m-GGUF"
FILE = "gemma-3-270m-Q4_K_M.gguf"
GPU_MACHINE = "ram=64G,gpu=nvidia:24G,cpu=16"


def _hub_preset_file() -> None:
    """A user preset like the shipped Gemma one, but fetched from the (fake) Hub instead of PyPI."""
    shipped = load_preset("gemma3-270m").source
    assert shipped is not None
    text = shipped.read_text(encoding="utf-8")
    text = text.replace('name = "gemma3-270m"', 'name = "gemma-hub"').replace(
        'repo = "ggml-org/gemma-3-270m-GGUF"', f'repo = "{REPO}"'
    )
    text = "\n".join(line for line in text.splitlines() if not line.startswith("python_package"))
    folder = settings.user_presets_dir()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gemma-hub.toml").write_text(text, encoding="utf-8")


async def test_plan_updates_live_when_quant_and_context_change() -> None:
    app = CloverApp(StartOptions(preset="clover-35b-a3b"), machine=parse_simulate(GPU_MACHINE))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.plan is not None, "the first plan", pilot=pilot)
        first = screen.plan
        assert first is not None
        assert len(screen.query(MemoryView)) == 2, "one bar for the GPU, one for RAM"
        assert first.alternatives, "the recommendation lists the other quant and why not"
        alternatives = str(screen.query_one("#plan-alternatives", Static).render())
        assert first.alternatives[0].why_not in alternatives
        assert "GPU0" in str(screen.query_one("#machine-panel", Static).render())
        other = "Q8_0" if first.quant == "Q4_K_M" else "Q4_K_M"
        screen.query_one("#quant", Select).value = other
        await wait_until(
            lambda: screen.plan is not None and screen.plan.quant == other, "the re-plan", pilot=pilot
        )
        assert other in str(screen.query_one("#plan-summary", Static).render())
        screen.query_one("#ctx", Select).value = 8192
        await wait_until(
            lambda: screen.plan is not None and screen.plan.ctx == 8192, "the re-plan for ctx", pilot=pilot
        )
        assert screen.plan is not None and screen.plan.quant == other
        assert "8,192" in str(screen.query_one("#plan-summary", Static).render())


async def test_plan_with_a_local_gguf_uses_its_header() -> None:
    path = tiny_model("llama")
    app = CloverApp(StartOptions(preset="gemma3-270m"), machine=parse_simulate("ram=16G,cpu=4"))
    async with app.run_test(size=(80, 24)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.plan is not None, "the first plan", pilot=pilot)
        box = screen.query_one("#local-path", Input)
        box.value = "/nowhere/model.gguf"
        box.focus()
        await pilot.press("enter")
        assert screen.model_path is None
        box.value = str(path)
        await pilot.press("enter")
        await wait_until(lambda: screen.model_path == str(path.resolve()), "the local file", pilot=pilot)
        assert screen.plan is not None and screen.plan.estimated is False, "exact sizes from the GGUF header"
        assert screen.plan.file_bytes <= path.stat().st_size
        assert not screen.query_one("#plan-run-local", Button).disabled


async def test_download_shows_progress_pauses_and_resumes(hub_server: HubServer) -> None:
    data = tiny_model("qwen3moe").read_bytes()
    hub_server.add_file(REPO, FILE, data)
    hub_server.knobs(REPO, FILE).hold_at = len(data) // 3  # still downloading when "p" comes, at any speed
    preset = replace(load_preset("gemma3-270m"), repo=REPO, python_package=None)
    request = LaunchRequest(preset, quant="Q4_K_M", ctx=1024, describe=False)
    plan = decide_launch(request, machine=parse_simulate("ram=16G,cpu=4")).plan
    results: list[str | None] = []
    screen = DownloadScreen(preset, plan)
    app = ScreenHost(Screen)
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(screen, results.append)
        await wait_until(
            lambda: (
                hub_server.held_streams == 1
                and screen.last is not None
                and screen.last.phase == "downloading"
            ),
            "a third of the file sent, the transfer held there",
            pilot=pilot,
        )
        assert "Downloading" in str(screen.query_one("#download-status", Static).render())
        assert "Disk left" in str(screen.query_one("#disk-left", Static).render())
        await pilot.press("p")
        await wait_until(lambda: not screen.running, "the pause", pilot=pilot)
        assert "Paused" in str(screen.query_one("#download-status", Static).render())
        await wait_until(lambda: hub_server.streams_open == 0, "the cut stream to end", pilot=pilot)
        served = hub_server.bytes_served(REPO, FILE)
        assert served < len(data)
        hub_server.knobs(REPO, FILE).hold_at = None
        await pilot.press("p")
        await wait_until(lambda: bool(results), "the download to finish", pilot=pilot)
    assert hub_server.bytes_served(REPO, FILE) < len(data) + served, "the resume did not start over"
    assert results[0] is not None and Path(results[0]).read_bytes() == data
    assert screen.last is not None and screen.last.phase == "done" and screen.last.done == len(data)


async def test_first_run_flow_downloads_launches_chats_and_is_remembered(hub_server: HubServer) -> None:
    hub_server.add_file(REPO, FILE, gemma_path())
    _hub_preset_file()
    short = replace(
        user_prefs.ModelSettings.from_preset(load_preset("gemma-hub")), max_tokens=16, temperature=0.0
    )
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings("gemma-hub", short))
    app = CloverApp(StartOptions(preset="gemma-hub", simulate="ram=16G,cpu=2"))
    async with app.run_test(size=(80, 24)) as pilot:
        plan_screen = app.screen
        assert isinstance(plan_screen, PlanScreen)
        await wait_until(lambda: plan_screen.plan is not None, "the plan", pilot=pilot)
        await pilot.press("d")
        await wait_until(lambda: isinstance(app.screen, LaunchScreen), "download, then launch", pilot=pilot)
        launch = app.screen
        assert isinstance(launch, LaunchScreen)
        assert launch.shown is not None and launch.shown is plan_screen.launch, "the launch the plan showed"
        await wait_until(lambda: launch.loaded is not None, "the model to load", pilot=pilot)
        loaded = launch.loaded.launch
        # Run from the downloaded file: the same runner, machine and context as shown.
        assert (loaded.runner, loaded.machine) == (launch.shown.runner, launch.shown.machine)
        assert loaded.plan.ctx == launch.shown.plan.ctx and loaded.plan.quant == launch.shown.plan.quant
        argv = shlex.split(launch.command)
        assert argv[0] == "llama-server" and "-c" in argv
        assert argv[argv.index("-m") + 1] == str(launch.model_path), "the command runs the downloaded file"
        assert str(launch.query_one("#launch-placement", Static).render()).strip()
        await pilot.press("enter")
        await wait_until(lambda: isinstance(app.screen, ChatScreen), "the chat", pilot=pilot)
        chat = app.screen
        assert isinstance(chat, ChatScreen)
        chat.query_one("#prompt", MessageBox).text = "The three primary colours are"
        await pilot.press("enter")
        await wait_until(lambda: chat.replies_done == 1, "the reply", pilot=pilot)
        assert chat.query(ReplyView).last().answer.strip()
    first = user_prefs.load_prefs().first_run
    assert first.preset == "gemma-hub" and first.complete and Path(first.model_path).name == FILE

    again = CloverApp()
    async with again.run_test(size=(80, 24)) as pilot:
        await wait_until(lambda: isinstance(again.screen, ChatScreen), "straight to chat", pilot=pilot)


async def test_plan_screen_replaces_estimates_with_the_hubs_gguf_header(hub_server: HubServer) -> None:
    """On the real machine the plan shows at once from the preset's estimates, then from the exact tensor
    sizes of the GGUF header, read on the (fake) Hub with range requests in the detection worker."""
    hub_server.add_file(REPO, FILE, gemma_path())
    _hub_preset_file()
    app = CloverApp(StartOptions(preset="gemma-hub"))
    async with app.run_test(size=(120, 40)) as pilot:
        plan_screen = app.screen
        assert isinstance(plan_screen, PlanScreen)
        await wait_until(
            lambda: plan_screen.plan is not None and not plan_screen.plan.estimated,
            "exact sizes",
            60,
            pilot=pilot,
        )
        plan = plan_screen.plan
        assert plan is not None
        assert plan.file_bytes == gemma_path().stat().st_size
        assert any("GGUF header" in text for _, text in plan.size_sources)
        reasons = str(plan_screen.query_one("#plan-more-reasons", Static).render())  # folded: not deciding
        assert "Sizes of Q4_K_M" in reasons
    # Only the header travelled, not the 253 MB file.
    assert 0 < hub_server.bytes_served(REPO, FILE) < gemma_path().stat().st_size // 10


@pytest.fixture(autouse=True)
def _slow_marker(request: pytest.FixtureRequest) -> None:
    request.node.add_marker(pytest.mark.slow)


async def test_download_error_is_shown_in_words(hub_server: HubServer) -> None:
    preset = replace(load_preset("gemma3-270m"), repo="test-org/no-such-repo", python_package=None)
    request = LaunchRequest(preset, quant="Q4_K_M", ctx=1024, describe=False)
    plan = decide_launch(request, machine=parse_simulate("ram=16G,cpu=4")).plan
    screen = DownloadScreen(preset, plan)
    app = ScreenHost(Screen)
    async with app.run_test(size=(80, 24)) as pilot:
        app.push_screen(screen)
        await pilot.pause()
        error = screen.query_one("#download-error", Static)
        await wait_until(
            lambda: not screen.running and bool(str(error.render()).strip()), "the failure", pilot=pilot
        )
        text = str(error.render())
        assert "test-org/no-such-repo" in text and "Traceback" not in text
        assert error.has_class("error")
        assert str(screen.query_one("#download-pause", Button).label) == "Resume"


async def test_theme_choice_is_remembered() -> None:
    machine = parse_simulate("ram=16G,cpu=4")
    app = CloverApp(StartOptions(preset="gemma3-270m"), machine=machine)
    async with app.run_test(size=(80, 24)) as pilot:
        app.theme = "textual-light"
        await wait_until(
            lambda: user_prefs.load_prefs().theme == "textual-light", "the theme to be saved", pilot=pilot
        )
    again = CloverApp(StartOptions(preset="gemma3-270m"), machine=machine)
    async with again.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert again.theme == "textual-light"


def test_chat_preset_resolves_the_packaged_test_model() -> None:
    from clover_local.commands.chat import _resolve_model

    resolved = _resolve_model(None, "gemma3-270m")
    assert resolved is not None, "the test model ships as a Python package: no download needed"
    assert Path(resolved).read_bytes() == gemma_path().read_bytes(), "the same GGUF the package assembles"
    assert _resolve_model(None, "clover-35b-a3b") is None, "not downloaded yet: the app opens on the plan"


async def test_a_file_that_cannot_load_is_explained_and_esc_goes_back(tmp_path: Path) -> None:
    broken = tmp_path / "broken-Q4_K_M.gguf"
    broken.write_bytes(b"GGUF" + b"\x00" * 64)
    app = CloverApp(StartOptions(preset="gemma3-270m", model_path=str(broken), simulate="ram=16G,cpu=4"))
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_until(
            lambda: isinstance(app.screen, LaunchScreen) and app.screen.failed, "the failure", pilot=pilot
        )
        launch = app.screen
        assert "Could not load" in str(launch.query_one("#launch-title", Static).render())
        assert launch.check_action("chat", ()) is False, "the footer offers no Chat after a failed load"
        assert launch.check_action("back", ()) is True
        reason = str(launch.query_one("#launch-placement", Static).render())
        assert reason.strip() and "Traceback" not in reason
        await pilot.press("escape")
        await wait_until(lambda: isinstance(app.screen, PlanScreen), "back to the plan", pilot=pilot)


async def test_the_plan_of_a_model_already_on_disk_offers_to_run_it_not_to_download_it() -> None:
    """Issue 49: ``chat`` on a model whose file is on disk offered "Download and run"."""
    from textual.widgets import Button

    from clover_local.tui.screens.plan import PlanScreen

    app = CloverApp(StartOptions(preset="smollm2-135m"))  # this machine, detected: its files are looked at
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(
            lambda: screen.models is not None and screen.plan is not None, "the plan", pilot=pilot
        )
        button = screen.query_one("#plan-download", Button)
        await wait_until(lambda: str(button.label) == "Run (on disk)", "the button to say so", pilot=pilot)
        assert not button.disabled
