"""The chat shows a diffusion reply being refined in place: in a real terminal (tmux), every byte the app
writes is recorded (``pipe-pane``), so the test sees the mask glyphs of the live view and then the settled
reply, however fast the steps run. Needs ``tmux``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_tui_tmux import STATUS_DONE, Tmux

from clover_local import user_prefs
from clover_local.engine.types import MASK_GLYPH
from clover_local.testing.models import tiny_model

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)"
    ),
]


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux(f"clover-diffusion-{os.getpid()}")
    try:
        yield t
    finally:
        subprocess.run([*t.base, "kill-server"], capture_output=True, check=False)


def _chat_with_dream(tmux: Tmux, tmp_path: Path, live: bool) -> tuple[str, str]:
    """Chat once with the tiny Dream model; the final screen and everything the app wrote."""
    model = tiny_model("dream")
    chosen = user_prefs.ModelSettings(temperature=0.0, max_tokens=64, ctx=1024, diffusion_live=live)
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings(model.name, chosen))
    exe = Path(sys.executable).with_name("clover-local")
    tmux.run("new-session", "-d", "-s", "app", "-x", "100", "-y", "30", f"{exe} chat --model {model}")
    log = tmp_path / "pane.log"
    tmux.run("pipe-pane", "-o", "-t", "app", f"cat >> {log}")
    tmux.wait_for(lambda s: "ready · tok/s -" in s and "Message" in s, "the chat screen")
    tmux.run("send-keys", "-t", "app", "-l", "The capital of France is")
    tmux.run("send-keys", "-t", "app", "Enter")
    screen = tmux.wait_for(lambda s: STATUS_DONE.search(s) is not None, "the reply to finish")
    tmux.run("send-keys", "-t", "app", "C-q")
    deadline = time.monotonic() + 30
    while subprocess.run([*tmux.base, "has-session", "-t", "app"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "Ctrl+Q quits the app"
        time.sleep(0.2)
    return screen, log.read_text(encoding="utf-8", errors="replace")


def test_chat_shows_masks_then_text(tmux: Tmux, tmp_path: Path) -> None:
    screen, recorded = _chat_with_dream(tmux, tmp_path, live=True)
    assert MASK_GLYPH in recorded, "the live view painted masked positions"
    assert "diffusion step" in recorded
    lines = screen.splitlines()
    model_top = next(i for i, line in enumerate(lines) if "─ Model ─" in line)
    body = [line.strip(" │") for line in lines[model_top + 1 :] if line.strip().startswith("│")]
    assert any(part.strip() for part in body), f"the settled reply is on screen:\n{screen}"
    assert MASK_GLYPH not in screen, "no masks once the reply has settled"


def test_live_view_can_be_turned_off(tmux: Tmux, tmp_path: Path) -> None:
    screen, recorded = _chat_with_dream(tmux, tmp_path, live=False)
    assert MASK_GLYPH not in recorded
    assert STATUS_DONE.search(screen)
