"""A model whose architecture only an installed runtime knows, end to end through a real llama-server: the test
runtime (``scripts/make_test_runtime.py``: the pinned llama.cpp with its qwen35moe row named ``clover_moe``,
installed as ``b99999``) runs the tiny clover_moe GGUF in ``clover-local run``, in ``clover-local serve`` asked
by the official openai client, and in the chat in a real terminal (tmux); and the way a person gets it: that
runtime's files packed as a release archive, served by the releases stand-in as release ``b99999``, installed with
``clover-local runtime install b99999`` and then run. The pinned llama.cpp cannot load that file; only the
runtime can, so a reply proves the runtime ran it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import openai
import psutil
import pytest
from helpers_runtimes import host_asset, releases
from releases_server import ReleasesServer
from waiting import wait_until

from clover_local.arch_support import check_architecture
from clover_local.cli import main
from clover_local.llamacpp.server import free_port
from clover_local.testing.models import CLOVER_ARCH, tiny_clover_model
from clover_local.testing.runtime import TEST_TAG, built_runtime, runtimes_folder

RUNTIMES = runtimes_folder()  # read before the per-test user directories are set
BUILT = built_runtime(RUNTIMES)
KEY = "e2e-key"
__all__ = ["releases"]  # the fixture

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


def test_installed_from_the_releases_stand_in_then_run(releases: ReleasesServer, tmp_path: Path) -> None:
    """What a person does: ``runtime install`` the release that knows the model (here the test runtime's files
    packed as upstream packs a release, its llama-arch.cpp as the release's raw source, its digest published),
    then ``run`` the model; the plan names the runtime just installed and its llama-server writes the reply."""
    assert BUILT is not None
    archive = tmp_path / host_asset(TEST_TAG)
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(BUILT.server, arcname=f"llama-{TEST_TAG}/llama-server")
    releases.add_release(TEST_TAG)
    releases.add_asset(TEST_TAG, archive.name, archive)
    releases.add_raw(TEST_TAG, "src/llama-arch.cpp", (BUILT.root / "llama-arch.cpp").read_bytes())
    releases.add_raw(TEST_TAG, "common/arg.cpp", (BUILT.root / "arg.cpp").read_bytes())
    installed = tmp_path / "runtimes"
    env = {**os.environ, "CLOVER_RUNTIMES_DIR": str(installed)}
    assert (
        env["CLOVER_LLAMACPP_RELEASES"] == releases.api_url and env["CLOVER_LLAMACPP_RAW"] == releases.raw_url
    )
    clover = [sys.executable, "-m", "clover_local"]

    done = subprocess.run(
        [*clover, "runtime", "install", TEST_TAG], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert releases.downloads(archive.name), "the archive came from the stand-in"
    manifest = json.loads((installed / TEST_TAG / "runtime.json").read_text())
    assert (
        manifest["origin"] == "archive"
        and manifest["sha256"] == releases.releases[TEST_TAG].assets[archive.name].sha256
    )

    model = str(tiny_clover_model())
    plan = subprocess.run(
        [*clover, "plan", "--model", model, "--json"], env=env, capture_output=True, text=True, timeout=300
    )
    assert plan.returncode == 0, plan.stderr
    arch = json.loads(plan.stdout)["architecture"]
    assert (arch["supported"], arch["runtime"]) == (True, TEST_TAG)
    assert Path(arch["server_path"]).is_relative_to(installed.resolve()), arch["server_path"]

    argv = ["run", "--model", model, "--prompt", "Hello there", "--max-tokens", "8", "--ctx", "512"]
    ran = subprocess.run(
        [*clover, *argv, "--temperature", "0", "--json"], env=env, capture_output=True, text=True, timeout=600
    )
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["text"].strip(), "the installed runtime's llama-server wrote a reply"
    assert f"llama.cpp {TEST_TAG}" in ran.stderr and "Engine: llama-server" in ran.stderr


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
