"""The chat goes on when its runner dies (issue 39): llama-server killed mid-reply, the reply ends with one line
saying so, the status line says the runner is restarting and then ready, and the next message is answered in the
same conversation, without touching the model picker. And the context counter after a stopped reply holds the
whole conversation, not the stopped reply's pieces alone.

The reply is held after its first piece (``GatedEngine``) while the child is killed, so the kill always lands
mid-reply, however fast the machine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers_engine import GatedEngine
from helpers_runner import BUILT, RUNTIMES, kill_child, launch_request, open_supervised
from helpers_tui import ScreenHost
from textual.widgets import Static
from waiting import wait_until

from clover_local import user_prefs
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.presets import load_preset
from clover_local.testing.models import tiny_clover_model
from clover_local.tui.screens.chat import ChatScreen
from clover_local.tui.widgets.message_box import MessageBox
from clover_local.tui.widgets.messages import ReplyView

pytestmark = pytest.mark.slow


@pytest.fixture
def engine(
    monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, tmp_path: Path
) -> Iterator[LlamaServerEngine]:
    opened = open_supervised(launch_request("pinned", monkeypatch, smollm2_path, tmp_path))
    try:
        yield opened
    finally:
        opened.close()


def _host(engine: GatedEngine) -> ScreenHost:
    base = user_prefs.ModelSettings.from_preset(load_preset("smollm2-135m"))
    settings = user_prefs.ModelSettings(
        **{**base.__dict__, "max_tokens": 300, "ctx": 1024, "temperature": 0.0}
    )
    return ScreenHost(lambda: ChatScreen(engine, "smollm2-135m", settings))


async def _send(pilot, text: str) -> None:  # type: ignore[no-untyped-def]
    await pilot.click("#prompt")
    pilot.app.screen.query_one("#prompt", MessageBox).text = text
    await pilot.press("enter")


def _status(screen: ChatScreen) -> str:
    return str(screen.query_one("#status", Static).render())


async def test_the_chat_goes_on_after_its_runner_is_killed_mid_reply(engine: LlamaServerEngine) -> None:
    gate = GatedEngine(engine, holds=0)
    app = _host(gate)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "What is the capital of France? One word.")
        await wait_until(lambda: not screen.generating and len(screen.history) == 2, "turn one", pilot=pilot)

        gate.arm()  # the next reply waits after its first piece
        await _send(pilot, "Count from 1 to 200, separated by commas.")
        await wait_until(lambda: gate.held.is_set(), "the second reply's first piece", pilot=pilot)
        kill_child(engine)
        gate.release()
        await wait_until(lambda: not screen.generating, "the killed reply to end", pilot=pilot)
        failed = screen.query(ReplyView).last()
        shown = " ".join(str(w.render()) for w in failed.query(".error"))
        assert "llama-server stopped" in shown and "started again" in shown, shown
        assert "\n" not in shown.strip()
        assert len(screen.history) == 2, "the unanswered message left the conversation"
        assert screen.query_one("#prompt", MessageBox).text.startswith("Count"), "and went back to the box"

        await wait_until(
            lambda: engine.health().state == "ready" and _status(screen).startswith("ready"),
            "the runner back, said in the status line",
            pilot=pilot,
        )
        states = [h.state for h in engine.supervisor.history] if engine.supervisor else []
        assert states == ["restarting", "ready"]
        screen.query_one("#prompt", MessageBox).text = ""
        await _send(pilot, "And the capital of Italy? One word.")
        await wait_until(
            lambda: not screen.generating and len(screen.history) == 4, "turn three", pilot=pilot
        )
        assert screen.history[0].content.startswith("What is the capital of France")
        assert screen.history[3].role == "assistant" and screen.history[3].content.strip()
        assert screen.failed_turns == 1


async def test_the_context_counter_after_a_stopped_reply_counts_the_conversation(
    engine: LlamaServerEngine,
) -> None:
    gate = GatedEngine(engine, holds=0)
    app = _host(gate)
    async with app.run_test(size=(100, 30)) as pilot:
        screen = app.screen
        assert isinstance(screen, ChatScreen)
        await _send(pilot, "Write three sentences about the sea.")
        await wait_until(lambda: not screen.generating and len(screen.history) == 2, "turn one", pilot=pilot)
        first = screen.last_stats
        assert first is not None and first.prompt_tokens > 0
        held_before = first.prompt_tokens + first.completion_tokens

        gate.arm()
        await _send(pilot, "Count from 1 to 200, separated by commas.")
        await wait_until(lambda: gate.held.is_set(), "the second reply's first piece", pilot=pilot)
        await pilot.press("escape")
        await wait_until(lambda: not screen.generating, "the stop", pilot=pilot)
        stopped = screen.last_stats
        assert stopped is not None and stopped.finish_reason == "cancelled"
        assert stopped.prompt_tokens >= held_before, "the prompt held turn one and the new message"
        assert f"ctx {stopped.prompt_tokens + stopped.completion_tokens}/" in _status(screen)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
@pytest.mark.timeout(
    900
)  # three model loads and two replies in a real terminal: a busy machine takes minutes
def test_in_a_terminal_the_chat_of_a_clover_model_survives_its_runner(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The Clover path in a real terminal: ``chat --model`` on a ``clover_moe`` file runs the test runtime's
    llama-server. The child is frozen (SIGSTOP) before a message is sent, so the reply is surely under way when
    it is killed; the chat says so in one line, restarts it, and answers the next message."""
    from test_tui_tmux import Tmux

    if BUILT is None:
        pytest.skip("the test runtime is not built (scripts/make_test_runtime.py)")
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(RUNTIMES))
    model = tmp_path / "tiny-hybrid-moe.gguf"
    shutil.copyfile(tiny_clover_model(), model)
    short = user_prefs.ModelSettings(**{**user_prefs.ModelSettings().__dict__, "max_tokens": 8, "ctx": 512})
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings(model.name, short))
    tmux = Tmux(f"clover-runner-{os.getpid()}")
    env = [f"{k}={v}" for k, v in os.environ.items() if k.startswith(("CLOVER_", "HF_", "OMP_"))]
    root = Path(__file__).resolve().parent.parent

    def child() -> psutil.Process | None:
        found = [
            p for p in psutil.process_iter(["name", "cmdline"]) if str(model) in (p.info["cmdline"] or [])
        ]
        return next((p for p in found if "llama-server" in (p.info["name"] or "")), None)

    try:
        tmux.run(
            "new-session", "-d", "-s", "app", "-x", "110", "-y", "32",
            "-c", str(root), *[arg for pair in env for arg in ("-e", pair)],
            f"{sys.executable} -m clover_local chat --model {model}",
        )  # fmt: skip
        tmux.wait_for(lambda s: "ready · tok/s -" in s and "Message" in s, "the chat screen", 300)
        first = child()
        assert first is not None, "the chat runs the runtime's llama-server"
        first.send_signal(signal.SIGSTOP)
        tmux.run("send-keys", "-t", "app", "-l", "Hello there")
        tmux.run("send-keys", "-t", "app", "Enter")
        tmux.wait_for(lambda s: "generating" in s, "the reply under way")
        first.send_signal(signal.SIGKILL)
        text = tmux.wait_for(lambda s: "llama-server stopped" in s, "the failure, in the chat")
        assert "exit code -9" in text
        deadline = time.monotonic() + 300
        while (second := child()) is None or second.pid == first.pid:
            assert time.monotonic() < deadline, "a new llama-server was started"
            time.sleep(0.2)
        tmux.wait_for(lambda s: "ready · tok/s" in s and "restarting" not in s, "the runner back, said", 300)
        tmux.run("send-keys", "-t", "app", "C-u")  # the unanswered message went back to the box
        tmux.run("send-keys", "-t", "app", "-l", "Hello again")
        tmux.run("send-keys", "-t", "app", "Enter")
        text = tmux.wait_for(
            lambda s: "Hello again" in s and "generating" not in s and s.count("─ Model ─") >= 2,
            "the next reply",
            300,
        )
        assert "Hello again" in text
    finally:
        subprocess.run([*tmux.base, "kill-server"], capture_output=True, check=False)
