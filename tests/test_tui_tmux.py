"""End to end in a real terminal: tmux runs ``clover-local chat --model <Gemma 3 270M>``, a message is typed,
and the reply and the status line are read back with ``capture-pane``. Needs the ``tmux`` binary (CI installs
it: ``apt-get install -y tmux``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from clover_local import user_prefs
from clover_local.presets import load_preset
from clover_local.testing.models import gemma_path

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)"
    ),
]

REPO_ROOT = Path(__file__).resolve().parent.parent
STATUS_DONE = re.compile(r"ready · tok/s (\d+\.\d) · TTFT (\d+\.\d\d)s · ctx (\d+)/(\d+) · draft")


class Tmux:
    """One private tmux server (its own socket), so tests never touch a person's sessions."""

    def __init__(self, name: str) -> None:
        self.base = ["tmux", "-L", name, "-f", os.devnull]
        self.target = "app"
        """The session :meth:`screen` reads."""

    def run(self, *args: str) -> str:
        return subprocess.run([*self.base, *args], check=True, capture_output=True, text=True).stdout

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", self.target)

    def wait_for(self, predicate: Callable[[str], bool], what: str, limit_s: float = 180.0) -> str:
        """Poll the pane until ``predicate(text)``; the limit only keeps a broken run from hanging."""
        deadline = time.monotonic() + limit_s
        while True:
            text = self.screen()
            if predicate(text):
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}; the screen shows:\n{text}")
            time.sleep(0.2)


@pytest.fixture
def tmux() -> Iterator[Tmux]:
    t = Tmux(f"clover-test-{os.getpid()}")
    try:
        yield t
    finally:
        subprocess.run([*t.base, "kill-server"], capture_output=True, check=False)


def test_chat_in_a_real_terminal(tmux: Tmux) -> None:
    model = gemma_path()
    # A short reply keeps the test quick on a busy CPU; chat --model keys settings by the file's name.
    short = user_prefs.ModelSettings.from_preset(load_preset("gemma3-270m"))
    short = user_prefs.ModelSettings(**{**short.__dict__, "max_tokens": 12, "ctx": 1024})
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings(model.name, short))
    exe = f"{sys.executable} -m clover_local"  # this checkout's code, wherever the venv's install points
    tmux.run(
        "new-session",
        "-d",
        "-c",
        str(REPO_ROOT),
        "-s",
        "app",
        "-x",
        "80",
        "-y",
        "24",
        f"{exe} chat --model {model}",
    )

    tmux.wait_for(lambda s: "ready · tok/s -" in s and "Message" in s, "the chat screen")
    tmux.run("send-keys", "-t", "app", "-l", "The capital of France is")
    tmux.run("send-keys", "-t", "app", "Enter")
    text = tmux.wait_for(lambda s: STATUS_DONE.search(s) is not None, "the reply to finish")

    status = STATUS_DONE.search(text)
    assert status is not None
    tokens_per_s, _ttft, used, size = status.groups()
    assert float(tokens_per_s) > 0 and int(size) == 1024 and 0 < int(used) <= 1024
    lines = text.splitlines()
    you = next(i for i, line in enumerate(lines) if "─ You ─" in line)
    assert "The capital of France is" in lines[you + 1]
    model_top = next(i for i, line in enumerate(lines) if "─ Model ─" in line)
    body = [line.strip(" │") for line in lines[model_top + 1 :] if line.strip().startswith("│")]
    assert any(part.strip() for part in body), f"the reply is on screen:\n{text}"

    tmux.run("send-keys", "-t", "app", "C-q")
    deadline = time.monotonic() + 30
    while subprocess.run([*tmux.base, "has-session", "-t", "app"], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "Ctrl+Q quits the app"
        time.sleep(0.2)


def _pane_gone(tmux: Tmux, session: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while subprocess.run([*tmux.base, "has-session", "-t", session], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, f"the {session} session should have ended"
        time.sleep(0.2)


def test_a_paste_ctrl_c_and_a_kill_lose_nothing(tmux: Tmux) -> None:
    """Three pasted lines arrive as three lines; Ctrl+C stops a reply and the app stays; a kill -9 mid-reply
    loses only that reply, and the next start lists the chat (issue 32)."""
    from clover_local import chat_store

    model = gemma_path()
    short = user_prefs.ModelSettings.from_preset(load_preset("gemma3-270m"))
    short = user_prefs.ModelSettings(**{**short.__dict__, "max_tokens": 12, "ctx": 1024})
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings(model.name, short))
    exe = f"{sys.executable} -m clover_local"  # this checkout's code, wherever the venv's install points
    tmux.run(
        "new-session",
        "-d",
        "-c",
        str(REPO_ROOT),
        "-s",
        "app",
        "-x",
        "100",
        "-y",
        "30",
        f"{exe} chat --model {model}",
    )
    tmux.wait_for(lambda s: "ready · tok/s -" in s and "Message" in s, "the chat screen")

    tmux.run("set-buffer", "-b", "clip", "--", "first line of paste\nsecond line\nthird line")
    tmux.run("paste-buffer", "-p", "-d", "-b", "clip", "-t", "app")  # bracketed, as a terminal pastes
    tmux.wait_for(lambda s: "third line" in s, "the whole paste in the box")
    tmux.run("send-keys", "-t", "app", "Enter")
    text = tmux.wait_for(lambda s: STATUS_DONE.search(s) is not None, "the reply to the paste")
    lines = text.splitlines()
    you = next(i for i, line in enumerate(lines) if "─ You ─" in line)
    assert [lines[you + k].strip(" │") for k in (1, 2, 3)] == [
        "first line of paste",
        "second line",
        "third line",
    ]

    tmux.run("send-keys", "-t", "app", "-l", "/set max_tokens 600")
    tmux.run("send-keys", "-t", "app", "Enter")
    tmux.run("send-keys", "-t", "app", "-l", "Count from one to three hundred, one number per line.")
    tmux.run("send-keys", "-t", "app", "Enter")
    tmux.wait_for(lambda s: "generating…" in s, "the long reply")
    tmux.run("send-keys", "-t", "app", "C-c")
    text = tmux.wait_for(lambda s: "stopped" in s and "ready · tok/s" in s, "Ctrl+C to stop the reply")
    assert "Do you want to quit" not in text

    tmux.run("send-keys", "-t", "app", "-l", "Now count backwards from three hundred.")
    tmux.run("send-keys", "-t", "app", "Enter")
    tmux.wait_for(lambda s: "generating…" in s, "the reply to be killed")
    pane_pid = int(tmux.run("display-message", "-p", "-t", "app", "#{pane_pid}").strip())
    os.killpg(pane_pid, 9)  # the app dies mid-reply, as in a crash
    _pane_gone(tmux, "app")

    kept = chat_store.ChatStore().list()
    assert len(kept) == 1
    messages = chat_store.ChatStore().load(kept[0].id).messages
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant", "user"], (
        "only the reply lost"
    )
    assert messages[0].content == "first line of paste\nsecond line\nthird line"
    assert messages[-1].content == "Now count backwards from three hundred."

    tmux.run(
        "new-session",
        "-d",
        "-c",
        str(REPO_ROOT),
        "-s",
        "again",
        "-x",
        "100",
        "-y",
        "30",
        f"{exe} chat --model {model}",
    )
    tmux.target = "again"
    tmux.wait_for(lambda s: "ready · tok/s -" in s, "the chat after the kill")
    tmux.run("send-keys", "-t", "again", "C-o")
    tmux.wait_for(lambda s: "Your chats" in s and "first line of paste second line" in s, "the chat, listed")
    tmux.run("send-keys", "-t", "again", "Escape")
    tmux.wait_for(lambda s: "Your chats" not in s, "the list closed")
    tmux.run("send-keys", "-t", "again", "C-c")  # idle: Ctrl+C quits, as in a shell
    _pane_gone(tmux, "again")
