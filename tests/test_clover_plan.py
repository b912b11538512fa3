"""Clover's plan before any runtime is installed (issue 40): budgeted for the runner that will run it (an
upstream llama-server, release b12060 or newer, as the preset says), offline too, with ``plan``, ``plan --json``,
``command`` and the app's plan screen showing the same flags and naming the release and its install command.

No runtime is installed (``CLOVER_RUNTIMES_DIR`` is an empty folder) and nothing is asked: ``--offline`` and
``HF_HUB_OFFLINE``, and the releases base is a closed port (``conftest``)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from clover_local.cli import main

PRESET = "clover-35b-a3b"
RELEASE = "b12060"
NEEDS = f"needs llama.cpp {RELEASE} or newer: install it with `clover-local runtime install {RELEASE}`"
MACHINES = (
    "ram=24G,cpu=8",  # a desktop without a GPU: Q4_K_M does not fit well
    "ram=16G,gpu=nvidia:8G,cpu=8",  # a laptop with an 8 GB card: nor here
    "gpu=nvidia:24G,ram=32G,cpu=8",  # a 24 GB card: the budgets of the two engines differ here
)


@pytest.fixture
def no_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "runtimes"
    folder.mkdir()
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(folder))
    return folder


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


def _without_model(argv: list[str]) -> list[str]:
    """llama-server's flags without the binary and the model (``-hf REPO:QUANT`` or ``-m PATH``)."""
    out = argv[1:] if argv and not argv[0].startswith("-") else list(argv)
    for flag in ("-hf", "-m"):
        if flag in out:
            at = out.index(flag)
            del out[at : at + 2]
    return out


@pytest.mark.parametrize("machine", MACHINES)
async def test_plan_command_json_and_the_app_agree_offline_with_no_runtime(
    no_runtime: Path, offline: None, machine: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from textual.widgets import Static
    from waiting import wait_until

    from clover_local.detect import parse_simulate
    from clover_local.tui.app import CloverApp, StartOptions
    from clover_local.tui.screens.plan import PlanScreen

    asked = ["--preset", PRESET, "--offline", "--simulate", machine]
    assert main(["plan", *asked, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["engine"] == "llama-server"  # the runner that will run it, not the embedded engine
    assert planned["architecture"]["install"] == RELEASE
    assert planned["architecture"]["install_command"] == f"clover-local runtime install {RELEASE}"
    assert planned["architecture"]["runs_with"] == NEEDS
    flags = planned["llama_server_args"]
    assert flags[flags.index("--spec-type") + 1] == "ngram-mod"  # llama-server's drafter: planned, not off
    assert not any("Speculation off" in r for r in planned["reasons"])

    assert main(["plan", *asked]) == 0
    text = capsys.readouterr().out
    assert f"Runs with: {NEEDS}" in text
    shown = text.split("Command (`clover-local command`):\n", 1)[1].splitlines()[0].strip()

    assert main(["command", *asked, "--json"]) == 0
    command = json.loads(capsys.readouterr().out)
    assert (
        command["needs"] == NEEDS and command["install_command"] == f"clover-local runtime install {RELEASE}"
    )
    assert main(["command", *asked]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == f"# {NEEDS}" and printed[-1] == command["command"] == shown

    assert _without_model(command["argv"]) == _without_model(shlex.split(shown)) == flags

    app = CloverApp(StartOptions(preset=PRESET), machine=parse_simulate(machine))
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert isinstance(screen, PlanScreen)
        await wait_until(lambda: screen.launch is not None, "the plan", pilot=pilot)
        assert screen.launch is not None
        assert screen.launch.runner.kind == "llama-server" and screen.launch.plan.engine == "llama-server"
        assert _without_model(screen.launch.settings.argv()) == flags
        assert NEEDS in str(screen.query_one("#plan-summary", Static).render())
        assert f"Install llama.cpp {RELEASE}" in str(screen.query_one("#plan-install").render())
