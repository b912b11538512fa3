"""A model whose architecture only an installed runtime knows, end to end through a real llama-server: the test
runtime (``scripts/make_test_runtime.py``: the pinned llama.cpp with its qwen35moe row named ``clover_moe``,
installed as ``b99999``) runs the tiny clover_moe GGUF in ``clover-local run``, in ``clover-local serve`` asked
by the official openai client, and in the chat in a real terminal (tmux). The pinned llama.cpp cannot load that
file; only the runtime can, so a reply proves the runtime ran it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import psutil
import pytest
from waiting import wait_until

from clover_local.arch_support import check_architecture
from clover_local.cli import main
from clover_local.llamacpp.server import free_port
from clover_local.testing.models import CLOVER_ARCH, tiny_clover_model
from clover_local.testing.runtime import TEST_TAG, built_runtime, runtimes_folder

RUNTIMES = runtimes_folder()  # read before the per-test user directories are set
BUILT = built_runtime(RUNTIMES)
KEY = "e2e-key"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(BUILT is None, reason="the test runtime is not built (scripts/make_test_runtime.py)"),
]


@pytest.fixture(autouse=True)
def with_test_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(RUNTIMES))


def test_the_check_picks_the_installed_runtime() -> None:
    check = check_architecture(CLOVER_ARCH)
    assert BUILT is not None
    assert (check.supported, check.runner, check.runtime) == (True, "llama-server", TEST_TAG)
    assert check.server_path == str(BUILT.server)
    pinned = check_architecture("qwen35moe")  # the runtime no longer knows it; the embedded engine does
    assert (pinned.supported, pinned.runner, pinned.runtime) == (True, "llama.cpp", None)


def test_run_answers_one_prompt_through_the_runtime(capsys: pytest.CaptureFixture[str]) -> None:
    model = str(tiny_clover_model())
    argv = ["run", "--model", model, "--prompt", "Hello there", "--max-tokens", "8", "--ctx", "512", "--json"]
    assert main([*argv, "--temperature", "0"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["text"].strip(), "the runtime's llama-server wrote a reply"
    assert f"llama.cpp {TEST_TAG}" in err and "Engine: llama-server" in err


def test_serve_answers_the_openai_client_through_the_runtime() -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "clover_local", "serve", "--model", str(tiny_clover_model()), "--ctx", "512"]
    proc = subprocess.Popen(
        [*cmd, "--port", str(port), "--api-key", KEY],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ),
    )
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY, max_retries=0, timeout=60)

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"serve exited with {proc.returncode}:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            client.models.list()
            return True
        except openai.APIConnectionError:
            return False

    try:
        wait_until(ready, what="clover-local serve to answer")
        served = client.models.list().data[0].id
        reply = client.chat.completions.create(
            model=served, messages=[{"role": "user", "content": "Hello"}], max_tokens=8, temperature=0
        )
        assert reply.choices[0].message.content and reply.usage is not None
        assert reply.usage.completion_tokens > 0
        assert BUILT is not None
        children = [p.cmdline() for p in psutil.Process(proc.pid).children(recursive=True)]
        assert any(c and c[0] == str(BUILT.server) for c in children), children  # the runtime's own binary
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install -y tmux)")
def test_the_chat_in_a_terminal_runs_it() -> None:
    from test_tui_tmux import Tmux

    from clover_local import user_prefs
    from clover_local.presets import load_preset

    model = tiny_clover_model()
    short = user_prefs.ModelSettings.from_preset(load_preset("clover-35b-a3b"))
    short = user_prefs.ModelSettings(**{**short.__dict__, "max_tokens": 8, "ctx": 512})
    user_prefs.save_prefs(user_prefs.Prefs().with_model_settings(model.name, short))
    tmux = Tmux(f"clover-e2e-{os.getpid()}")
    # This checkout's clover-local (python -m, run from the repository root), with this test's environment.
    env = [f"{k}={v}" for k, v in os.environ.items() if k.startswith(("CLOVER_", "HF_"))]
    root = Path(__file__).resolve().parent.parent
    try:
        tmux.run(
            "new-session", "-d", "-s", "app", "-x", "100", "-y", "30",
            "-c", str(root), *[arg for pair in env for arg in ("-e", pair)],
            f"{sys.executable} -m clover_local chat --model {model}",
        )  # fmt: skip
        tmux.wait_for(lambda s: "ready · tok/s -" in s and "Message" in s, "the chat screen", 300)
        tmux.run("send-keys", "-t", "app", "-l", "Hello there")
        tmux.run("send-keys", "-t", "app", "Enter")
        text = tmux.wait_for(lambda s: "ready · tok/s" in s and "ready · tok/s -" not in s, "the reply", 300)
        lines = text.splitlines()
        top = next(i for i, line in enumerate(lines) if "─ Model ─" in line)
        body = [line.strip(" │") for line in lines[top + 1 :] if line.strip().startswith("│")]
        assert any(part.strip() for part in body), f"the reply is on screen:\n{text}"
        tmux.run("send-keys", "-t", "app", "C-q")
        deadline = time.monotonic() + 30
        while subprocess.run([*tmux.base, "has-session", "-t", "app"], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "Ctrl+Q quits the app"
            time.sleep(0.2)
    finally:
        subprocess.run([*tmux.base, "kill-server"], capture_output=True, check=False)
