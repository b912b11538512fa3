"""The four faults found beside the runner's supervision (issue 39), each on the first path a newcomer takes: the
app must never refuse its own plan after a download, the saved context is used on the next start, and the chat's
context counter is right after a stopped reply."""

from __future__ import annotations

from pathlib import Path

import pytest
from hub_server import HubServer

from clover_local.launch import LaunchRequest, decide_launch, with_model_file
from clover_local.model_files import local_header
from clover_local.testing.models import tiny_clover_model

CLOVER = "clover-35b-a3b"
REPO = "Diffuspace/Clover-35B-A3B-Preview-GGUF"
FILE = "Clover-35B-A3B-Preview-Q4_K_M.gguf"


def test_a_plan_shown_before_the_download_opens_after_it(hub_server: HubServer, tmp_path: Path) -> None:
    """The Clover preset plans 16,384 tokens by default; a file whose header says it was trained for fewer is
    planned at most that before the download (its header read on the Hub), and the same launch, run from the
    downloaded file, is planned again from the file, never refused as if the person had typed the context."""
    model = tiny_clover_model()
    trained = local_header(model).architecture.n_ctx_train
    assert 256 <= trained < 16_384, "the tiny model is trained for less than the preset's default"
    hub_server.add_file(REPO, FILE, model)
    shown = decide_launch(LaunchRequest(CLOVER, simulate="ram=32G,cpu=4", force=True))
    assert shown.plan.ctx <= trained, "the plan shown reads the header's training context"
    downloaded = tmp_path / FILE
    downloaded.write_bytes(model.read_bytes())
    opened = with_model_file(shown, str(downloaded))
    assert opened.plan.ctx <= trained
    assert opened.plan.model_path == str(downloaded)


def test_a_context_above_the_files_is_refused_only_when_asked_for(tmp_path: Path) -> None:
    model = tiny_clover_model()
    trained = local_header(model).architecture.n_ctx_train
    shown = decide_launch(LaunchRequest(CLOVER, simulate="ram=32G,cpu=4", force=True, offline=True))
    opened = with_model_file(shown, str(model))  # the preset's default context, not one the person chose
    assert opened.plan.ctx <= trained
    from clover_local.errors import UsageError

    with pytest.raises(UsageError) as refused:
        decide_launch(
            LaunchRequest(CLOVER, str(model), ctx=trained * 2, simulate="ram=32G,cpu=4", force=True)
        )
    assert "--ctx" in str(refused.value)


def test_the_next_start_uses_the_context_the_first_run_loaded(smollm2_path: Path) -> None:
    """``prefs.json`` remembers the first run's model and the context it loaded with; nothing saved for the
    model itself: the next start opens it with that context, not the preset's default."""
    from clover_local import user_prefs
    from clover_local.presets import load_preset
    from clover_local.tui.app import CloverApp

    preset = load_preset("smollm2-135m")
    assert preset.ctx_default != 1536
    first = user_prefs.FirstRun(preset=preset.name, ctx=1536, model_path=str(smollm2_path))
    user_prefs.save_prefs(user_prefs.Prefs().with_first_run(first))
    app = CloverApp()
    assert app._settings_for(preset.name, preset, None).ctx == 1536
    saved = user_prefs.ModelSettings(**{**user_prefs.ModelSettings.from_preset(preset).__dict__, "ctx": 1024})
    user_prefs.save_prefs(user_prefs.load_prefs().with_model_settings(preset.name, saved))
    app = CloverApp()
    assert app._settings_for(preset.name, preset, None).ctx == 1024, "what the person saved comes first"


def test_a_saved_context_the_file_does_not_take_is_planned_down_and_said(smollm2_path: Path) -> None:
    from clover_local import user_prefs
    from clover_local.presets import load_preset
    from clover_local.tui import services

    preset = load_preset("smollm2-135m")
    trained = local_header(smollm2_path).architecture.n_ctx_train
    settings = user_prefs.ModelSettings(
        **{**user_prefs.ModelSettings.from_preset(preset).__dict__, "ctx": trained * 4}
    )
    launch = services.launch_for(preset, str(smollm2_path), settings)
    assert launch.plan.ctx == trained
    said = launch.notices[0].text
    assert launch.notices[0].code == "context-limited"
    assert f"{trained * 4:,}" in said and f"{trained:,}" in said and "--ctx" not in said
