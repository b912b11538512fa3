"""The chat shows a diffusion reply being refined in place, in a real terminal (tmux). The reply is held after its
first step (``tests/held_reply_child.py``), so the masks of the live view are on the screen when the test reads
it, however fast the steps run; then it is let go, and the settled reply replaces them. With the live view off,
every byte the app writes is recorded (``pipe-pane``) and holds no mask. Needs ``tmux``."""

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


CHILD = Path(__file__).with_name("held_reply_child.py")


def _start_dream_chat(tmux: Tmux, tmp_path: Path, live: bool) -> tuple[Path, Path]:
    """The app chatting with the tiny Dream model, its first reply held after the first step; (the file that
    releases it, the log of everything the app wrote)."""
    model = tiny_model("dream")
    chosen = user_prefs.ModelSettings(temperature=0.0, max_tokens=64, ctx=1024, diffusion_live=live)
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings(model.name, chosen))
    release = tmp_path / "release"
    command = f"{sys.executable} {CHILD} {release} chat --model {model}"
    tmux.run("new-session", "-d", "-s", "app", "-x", "100", "-y", "30", command)
    log = tmp_path / "pane.log"
    tmux.run("pipe-pane", "-o", "-t", "app", f"cat >> {log}")
    tmux.wait_for(lambda s: "ready · tok/s -" in s and "Message" in s, "the chat screen")
    tmux.run("send-keys", "-t", "app", "-l", "The capital of France is")
    tmux.run("send-keys", "-t", "app", "Enter")
    return release, log


def _finish(tmux: Tmux, release: Path) -> str:
    """Let the held reply go on; the screen once it has settled (the app then quits)."""
    release.touch()
    screen = tmux.wait_for(lambda s: STATUS_DONE.search(s) is not None, "the reply to finish")
    tmux.run("send-keys", "-t", "app", "C-q")
    deadline = time.monotonic() + 30
    while subprocess.run([*tmux.base, "has-session", "-t", "app"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "Ctrl+Q quits the app"
        time.sleep(0.2)
    return screen


def test_chat_shows_masks_then_text(tmux: Tmux, tmp_path: Path) -> None:
    release, _ = _start_dream_chat(tmux, tmp_path, live=True)
    held = tmux.wait_for(
        lambda s: MASK_GLYPH in s, "the live view's masks, the reply held after its first step"
    )
    assert "diffusion step" in held
    screen = _finish(tmux, release)
    lines = screen.splitlines()
    model_top = next(i for i, line in enumerate(lines) if "─ Model ─" in line)
    body = [line.strip(" │") for line in lines[model_top + 1 :] if line.strip().startswith("│")]
    assert any(part.strip() for part in body), f"the settled reply is on screen:\n{screen}"
    assert MASK_GLYPH not in screen, "no masks once the reply has settled"


def test_live_view_can_be_turned_off(tmux: Tmux, tmp_path: Path) -> None:
    release, log = _start_dream_chat(tmux, tmp_path, live=False)
    tmux.wait_for(lambda s: "generating" in s, "the reply, held after its first step")
    screen = _finish(tmux, release)
    assert MASK_GLYPH not in log.read_text(encoding="utf-8", errors="replace")
    assert STATUS_DONE.search(screen)
