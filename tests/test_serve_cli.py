"""``clover-local serve`` as a user runs it (a real process), for both engines, driven by the official openai
client: a chat completion, a streamed one, the API key refused and accepted; Ctrl-C stops it and its
llama-server. And ``clover-local doctor``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import openai
import psutil
import pytest
from helpers_serve import llama_server_path
from waiting import wait_until

from clover_local.llamacpp.server import free_port

pytestmark = pytest.mark.slow

KEY = "cli-key"
CLI = [sys.executable, "-m", "clover_local"]


def _start_serve(engine: str, extra_env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            *CLI,
            "serve",
            "--preset",
            "gemma3-270m",
            "--ctx",
            "1024",
            "--engine",
            engine,
            "--port",
            str(port),
            "--api-key",
            KEY,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, **extra_env},
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            pytest.fail(f"serve exited with {proc.returncode}:\n{out}")
        try:
            openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=2).models.list()
            return True
        except openai.APIConnectionError:
            return False

    wait_until(ready, what="clover-local serve to answer")
    return proc, base


@pytest.fixture(params=["embedded", "llama-server"], scope="module")
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, subprocess.Popen[str], str]]:
    env: dict[str, str] = {}
    if request.param == "llama-server":
        env["CLOVER_LLAMA_SERVER"] = str(llama_server_path())
    proc, base = _start_serve(request.param, env)
    yield request.param, proc, base
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_openai_client_chat_stream_and_key(served: tuple[str, subprocess.Popen[str], str]) -> None:
    _engine, _proc, base = served
    client = openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=120)
    reply = client.chat.completions.create(  # greedy, asked for (the preset samples): the replies are read
        model="gemma3-270m",
        messages=[{"role": "user", "content": "Write one word."}],
        max_tokens=8,
        temperature=0,
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.completion_tokens > 0
    chunks = list(
        client.chat.completions.create(
            model="gemma3-270m",
            messages=[{"role": "user", "content": "Count to five."}],
            max_tokens=12,
            temperature=0,
            stream=True,
        )
    )
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    refused = openai.OpenAI(base_url=base + "/v1", api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        refused.chat.completions.create(model="gemma3-270m", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="other", messages=[{"role": "user", "content": "x"}])


def test_ctrl_c_stops_serve_and_its_llama_server(served: tuple[str, subprocess.Popen[str], str]) -> None:
    engine, proc, _ = served
    children = psutil.Process(proc.pid).children(recursive=True)
    if engine == "llama-server":
        assert any("llama-server" in c.name() for c in children)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert f"note: Engine: {engine} (" in out
    assert "serving gemma3-270m on http://127.0.0.1:" in out
    for child in children:
        wait_until(lambda c=child: not _running(c), limit_s=30, what=f"child {child.pid} to stop")


def _running(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_serve_refuses_bad_input_without_a_traceback(tmp_path: Path) -> None:
    empty = tmp_path / "key"
    empty.write_text("# only a comment\n")
    result = subprocess.run(
        [*CLI, "serve", "--preset", "gemma3-270m", "--api-key-file", str(empty)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "holds no key" in result.stderr and "Traceback" not in result.stderr
    result = subprocess.run(
        [*CLI, "serve", "--model", str(tmp_path / "missing.gguf"), "--engine", "embedded"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0 and "Traceback" not in result.stderr


def test_doctor_reports_both_engines() -> None:
    env = {**os.environ}
    try:
        env["CLOVER_LLAMA_SERVER"] = str(llama_server_path())
        have_server = True
    except pytest.skip.Exception:
        have_server = False
    result = subprocess.run([*CLI, "doctor", "--json"], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["llama_cpp_python"]["version"] == "0.3.36"
    assert "cpu" in report["llama_cpp_python"]["backends"]
    server = report["llama_server"]
    assert server["found"] is have_server
    if have_server:
        assert server["backends"][-1] == "cpu" and server["speculative"] is True
    else:
        assert "clover-local runtime install" in server["fix"]
    assert isinstance(report["runtimes"], list)


def test_doctor_without_a_server_says_what_to_do(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CLOVER_LLAMA_SERVER"}
    env["PATH"] = "/usr/bin:/bin"
    env["CLOVER_RUNTIMES_DIR"] = str(tmp_path / "no-runtimes")
    result = subprocess.run([*CLI, "doctor"], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0
    assert "clover-local runtime install" in result.stdout, result.stdout
    assert "scripts/" not in result.stdout, "a checkout's scripts are not what an installed clover-local has"


def test_doctor_reports_the_installed_runtimes_and_what_each_loads(tmp_path: Path) -> None:
    """Issue 49: with runtime b12060 installed (and no other llama-server) doctor said "llama-server not found";
    it names each runtime, its llama-server, and the architectures it loads beyond the pinned llama.cpp."""
    from helpers_runtimes import arch_cpp

    from clover_local.runtimes.installed import write_manifest
    from clover_local.testing.models import CLOVER_ARCH

    folder = tmp_path / "runtimes" / "b12060"
    (folder / "bin").mkdir(parents=True)
    server = folder / "bin" / "llama-server"
    server.write_text('#!/bin/sh\necho "version: 12060 (abcdef123)"\n')
    server.chmod(0o755)
    (folder / "llama-arch.cpp").write_text(arch_cpp(CLOVER_ARCH))
    manifest = {"tag": "b12060", "backend": "cpu", "origin": "archive", "server": "bin/llama-server"}
    write_manifest(folder, {**manifest, "installed": "now"})
    env = {k: v for k, v in os.environ.items() if k != "CLOVER_LLAMA_SERVER"}
    env.update(PATH="/usr/bin:/bin", CLOVER_RUNTIMES_DIR=str(tmp_path / "runtimes"))
    text = subprocess.run([*CLI, "doctor"], capture_output=True, text=True, timeout=120, env=env)
    assert text.returncode == 0, text.stderr
    assert "not found" not in text.stdout, text.stdout
    assert f"b12060    cpu, archive: {server}" in text.stdout, text.stdout
    assert f"beyond the pinned llama.cpp: {CLOVER_ARCH}" in text.stdout, text.stdout
    listed = subprocess.run([*CLI, "doctor", "--json"], capture_output=True, text=True, timeout=120, env=env)
    (runtime,) = json.loads(listed.stdout)["runtimes"]
    assert runtime["tag"] == "b12060" and runtime["beyond_pinned"] == [CLOVER_ARCH]
    assert runtime["architectures"] > 100 and runtime["server"] == str(server)


def test_doctor_says_whether_a_models_template_calls_tools(gemma_path: Path) -> None:
    """``doctor --model``: Gemma's built-in template has no tool syntax (the generic format); Qwen3's does."""
    from clover_local.commands.doctor import chat_report
    from clover_local.detect import parse_simulate
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.testing.models import TinySpec, tiny_model_from_spec
    from clover_local.testing.vocab import QWEN3_TOOLS_TEMPLATE

    machine = parse_simulate("ram=16G,cpu=2")
    gemma = chat_report(decide_launch(LaunchRequest(None, str(gemma_path), ctx=1024), machine=machine))
    assert (gemma["template"], gemma["kind"], gemma["tool_calls"]) == ("gemma", "builtin", "generic")
    qwen = tiny_model_from_spec(TinySpec(kind="llama", chat_template=QWEN3_TOOLS_TEMPLATE, tool_caller=True))
    native = chat_report(decide_launch(LaunchRequest(None, str(qwen), ctx=1024), machine=machine))
    assert (native["kind"], native["tool_calls"]) == ("jinja", "native") and "hermes" in native[
        "tool_calls_detail"
    ]
