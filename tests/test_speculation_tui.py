"""The TUI's speculation setting: the settings dialog offers the modes, saves the one picked with the model's
settings, and the launch plan uses it (``LaunchRequest(spec=settings.spec_mode)``)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from helpers_tui import ScreenHost
from textual.widgets import Select
from waiting import wait_until

from clover_local.detect import parse_simulate
from clover_local.errors import UsageError
from clover_local.plan.speculation import SPEC_MODES
from clover_local.plan.types import Plan
from clover_local.presets import load_preset
from clover_local.testing.models import tiny_mtp_model
from clover_local.tui.screens.modals import SettingsScreen
from clover_local.user_prefs import ModelSettings


def test_settings_dialog_saves_the_speculation_mode() -> None:
    results: list[ModelSettings | None] = []

    async def run() -> None:
        screen = SettingsScreen(ModelSettings())
        host = ScreenHost(lambda: screen)
        async with host.run_test(size=(80, 24)) as pilot:
            await wait_until(lambda: host.screen is screen, "settings dialog", pilot=pilot)
            select = screen.query_one("#set-spec_mode", Select)
            assert [value for _, value in select._options] == list(SPEC_MODES)
            assert select.value == "auto"
            select.value = "off"
            results.append(screen.read_form())
            select.value = "mtp"
            results.append(screen.read_form())

    asyncio.run(run())
    off, mtp = results
    assert off is not None and off.spec_mode == "off"
    assert mtp is not None and mtp.spec_mode == "mtp"


def test_launch_plan_follows_the_setting() -> None:
    model, _ = tiny_mtp_model("embedded")
    preset = load_preset("clover-35b-a3b")
    machine = parse_simulate("gpu=nvidia:8G,ram=16G")

    def plan(settings: ModelSettings) -> Plan:
        from clover_local.launch import LaunchRequest, decide_launch

        request = LaunchRequest(preset, str(model), ctx=settings.ctx, spec=settings.spec_mode)
        return decide_launch(request, machine=machine).plan

    auto = plan(ModelSettings())
    assert auto.speculative.mode == "mtp" and auto.speculative.enabled  # every expert on the GPU: the head
    ngram = plan(ModelSettings(spec_mode="ngram"))
    assert ngram.speculative.mode == "ngram" and ngram.speculative.enabled
    off = plan(ModelSettings(spec_mode="off"))
    assert off.speculative.mode == "off" and not off.speculative.enabled


def test_one_knob_in_prefs_and_the_older_second_one_read_as_off(tmp_path: Path) -> None:
    """Speculation is one setting (``spec_mode``): prefs written with the older ``speculative: false`` open
    as ``off``, the older key is not written again, and a mode that is not one of ``--spec``'s is refused."""
    import json

    from clover_local import user_prefs

    path = tmp_path / "prefs.json"
    path.write_text(json.dumps({"models": {"a": {"speculative": False}, "b": {"speculative": True}}}))
    prefs = user_prefs.load_prefs(path)
    assert prefs.models["a"].spec_mode == "off" and prefs.models["b"].spec_mode == "auto"
    user_prefs.save_prefs(prefs, path)
    saved = json.loads(path.read_text())["models"]
    assert "speculative" not in saved["a"] and saved["a"]["spec_mode"] == "off"
    with pytest.raises(UsageError, match="spec_mode"):
        ModelSettings(spec_mode="fast").validated()  # type: ignore[arg-type]
