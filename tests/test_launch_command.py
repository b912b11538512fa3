"""The app's launch screen shows the llama-server command equivalent to what it loads; that command names the
model file (``-m``) and starts the real built llama-server exactly as printed."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest
from helpers_serve import llama_server_path
from helpers_tui import ScreenHost
from waiting import wait_until

from clover_local import user_prefs
from clover_local.detect import parse_simulate
from clover_local.launch import LaunchRequest, decide_launch
from clover_local.llamacpp import http_client
from clover_local.llamacpp.server import free_port
from clover_local.presets import load_preset
from clover_local.tui.screens.launch import LaunchScreen

pytestmark = pytest.mark.slow


async def _launch_command(model: Path) -> str:
    """The command the launch screen shows for ``model`` (a file given directly: it plans for this machine)."""
    preset = load_preset("gemma3-270m")
    settings = user_prefs.ModelSettings(ctx=1024)
    screen = LaunchScreen(str(model), preset, settings)
    app = ScreenHost(lambda: screen)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(lambda: screen.loaded is not None or screen.failed, "the load", pilot=pilot)
        assert screen.loaded is not None, "the model loaded"
        screen.loaded.engine.close()
        return screen.command


async def test_the_plan_screens_launch_is_opened_as_shown(gemma_path: Path) -> None:
    """A launch the plan screen showed is the one the launch screen loads, not one decided again for the
    chat's saved settings (here another context) or for the machine as detected now."""
    preset = load_preset("gemma3-270m")
    request = LaunchRequest(preset, str(gemma_path), ctx=768, spec="off")
    shown = decide_launch(request, machine=parse_simulate("ram=16G,cpu=2"))
    assert shown.plan.model_path is not None
    screen = LaunchScreen(shown.plan.model_path, preset, user_prefs.ModelSettings(ctx=1024), shown)
    app = ScreenHost(lambda: screen)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(lambda: screen.loaded is not None or screen.failed, "the load", pilot=pilot)
        assert screen.loaded is not None, "the model loaded"
        screen.loaded.engine.close()
        assert screen.loaded.launch is shown
        assert screen.command == shown.command and "-c 768" in screen.command


async def test_the_launch_command_names_the_model_file(gemma_path: Path) -> None:
    argv = shlex.split(await _launch_command(gemma_path))
    assert argv[0] == "llama-server"
    assert argv[argv.index("-m") + 1] == str(gemma_path.resolve())
    assert argv[argv.index("-c") + 1] == "1024", "the person's context, as loaded"


async def test_the_launch_command_runs_as_printed(gemma_path: Path) -> None:
    binary = llama_server_path()
    command = await _launch_command(gemma_path)
    port = free_port()
    # As a person would paste it, with the built llama-server first on PATH; only where to listen is added.
    env = {**os.environ, "PATH": f"{binary.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    argv = [*shlex.split(command), "--host", "127.0.0.1", "--port", str(port)]
    with subprocess.Popen(
        argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:

            def healthy() -> bool:
                if proc.poll() is not None:
                    return True
                try:
                    return http_client.request(f"http://127.0.0.1:{port}", "GET", "/health").status == 200
                except Exception:
                    return False

            wait_until(healthy, "llama-server to answer /health")
            assert proc.poll() is None, f"llama-server exited: {proc.stderr.read() if proc.stderr else ''}"
            props = http_client.request(f"http://127.0.0.1:{port}", "GET", "/props").json()
            assert Path(props["model_path"]).resolve() == gemma_path.resolve()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
