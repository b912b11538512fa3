"""The real llama-server built by scripts/build-llama-server: the plan's argv is accepted by it, it starts,
answers /health and serves completions through LlamaServerEngine, stops cleanly, and dies with its parent.

Skipped when no binary is found, except in CI, where a missing binary fails (CI builds it first)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers_serve import llama_server_path
from waiting import wait_until

from clover_local.detect import parse_simulate
from clover_local.engine.types import ChatMessage, Finished, GenerationRequest, TextDelta
from clover_local.errors import ServerError
from clover_local.llamacpp.binary import ServerBinary, capabilities
from clover_local.llamacpp.server import LlamaServerProcess, plan_server_argv, start_llama_server
from clover_local.llamacpp.server_args import adapt_args, split_flags
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.plan.llama_args import llama_server_args
from clover_local.plan.planner import make_plan
from clover_local.plan.types import Plan, Wishes
from clover_local.presets import load_preset
from clover_local.testing.models import gemma_path

pytestmark = pytest.mark.slow

COPY_PROMPT = (
    "Original file:\n```python\ndef area(width, height):\n    return width * height\n```\n"
    "The same file after renaming area to surface:\n```python\n"
)


@pytest.fixture(scope="module")
def binary() -> ServerBinary:
    return ServerBinary(llama_server_path(), "test")


def _gemma_plan(ctx: int = 2048, speculative: bool | None = None) -> Plan:
    preset = load_preset("gemma3-270m")
    machine = parse_simulate("ram=16G,cpu=2")
    return make_plan(machine, preset, None, Wishes(ctx=ctx, speculative=speculative), str(gemma_path()))


@pytest.fixture(scope="module")
def server(binary: ServerBinary) -> Iterator[LlamaServerProcess]:
    lines: list[str] = []
    process = start_llama_server(plan_server_argv(_gemma_plan()), binary=binary, on_log=lines.append)
    process.test_log = lines  # type: ignore[attr-defined]
    yield process
    process.stop()


def test_capabilities_come_from_the_binary(binary: ServerBinary) -> None:
    caps = capabilities(binary.path)
    for flag in ("-m", "--ctx-size", "-ngl", "--n-cpu-moe", "--spec-type", "--chat-template", "--api-key"):
        assert caps.supports(flag), flag
    assert "ngram-mod" in caps.spec("--spec-type").choices  # type: ignore[union-attr]
    assert caps.backends[-1] == "cpu"
    assert caps.version != "unknown"
    assert capabilities(binary.path) is caps  # cached per path + mtime


@pytest.mark.parametrize(
    "simulate",
    [
        "ram=16G,cpu=2",
        "ram=64G,cpu=16,gpu=nvidia:24G",
        "ram=32G,cpu=8,gpu=nvidia:8G",
        "ram=128G,cpu=16,gpu=nvidia:24G,gpu=nvidia:24G",
        "unified=36G",
    ],
)
@pytest.mark.parametrize("preset_name", ["clover-35b-a3b", "gemma3-270m"])
def test_every_planned_flag_is_in_help(binary: ServerBinary, simulate: str, preset_name: str) -> None:
    """Plans for CPU-only, GPU with expert offload, two GPUs and Apple machines: each flag and each
    enumerated value must be one this llama-server accepts, so nothing is dropped or translated."""
    caps = capabilities(binary.path)
    plan = make_plan(parse_simulate(simulate), load_preset(preset_name), None, Wishes(), "/models/m.gguf")
    argv = llama_server_args(plan)
    for flag, value in split_flags(argv):
        spec = caps.spec(flag)
        assert spec is not None, f"{flag} not in llama-server --help"
        assert spec.takes_value == (value is not None), flag
        if spec.choices and value is not None:
            assert value in spec.choices, f"{flag} {value}"
    assert adapt_args(argv, caps).warnings == ()


def test_plan_argv_starts_and_serves(server: LlamaServerProcess) -> None:
    assert server.warnings == ()
    assert server.running
    from clover_local.llamacpp import http_client

    assert http_client.request(server.url, "GET", "/health").status == 200
    engine = LlamaServerEngine(server, model_name="gemma3-270m", owns_process=False)
    assert engine.n_ctx == 2048
    assert engine.count_tokens("Hello world") >= 2
    events = list(engine.generate(GenerationRequest(prompt=COPY_PROMPT, max_tokens=24, temperature=0.0)))
    text = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert "(width, height):\n    return width * height" in text
    stats = events[-1].stats  # type: ignore[union-attr]
    assert isinstance(events[-1], Finished)
    assert 0 < stats.completion_tokens <= 24
    assert stats.decode_tokens_per_s > 0 and stats.prompt_tokens > 10
    assert stats.drafted_tokens > 0 and stats.draft_acceptance is not None  # the plan's --spec-type ngram-mod
    log = "\n".join(server.test_log)  # type: ignore[attr-defined]
    assert "server is listening" in log or "listening" in server.log_tail(200)


def test_cache_prompt_false_evaluates_the_prompt_from_scratch(server: LlamaServerProcess) -> None:
    """A request with ``cache_prompt`` false reuses nothing of llama-server's cache; the next one reuses the
    prompt again."""
    engine = LlamaServerEngine(server, owns_process=False)
    request = GenerationRequest(prompt=COPY_PROMPT + "# reset\n", max_tokens=4, temperature=0.0)

    def cached(cache_prompt: bool = True) -> int:
        events = list(engine.generate(dataclasses.replace(request, cache_prompt=cache_prompt)))
        assert isinstance(events[-1], Finished)
        return events[-1].stats.cached_tokens

    cached()
    assert cached() > 10  # the same prompt again: its prefix is reused
    assert cached(cache_prompt=False) == 0
    assert cached() > 10
    assert cached(cache_prompt=False) == 0


def test_chat_uses_the_gemma_template(server: LlamaServerProcess) -> None:
    engine = LlamaServerEngine(server, owns_process=False)
    request = GenerationRequest(messages=(ChatMessage("user", "Say yes."),), max_tokens=8, temperature=0.0)
    events = list(engine.generate(request))
    assert isinstance(events[-1], Finished)
    assert events[-1].stats.prompt_tokens > 5
    assert "".join(e.text for e in events if isinstance(e, TextDelta))


def test_cancel_stops_the_stream_and_the_server_keeps_going(server: LlamaServerProcess) -> None:
    engine = LlamaServerEngine(server, owns_process=False)
    cancel = threading.Event()
    n = 0
    last = None
    for event in engine.generate(GenerationRequest(prompt="1, 2, 3, 4,", max_tokens=500), cancel):
        if isinstance(event, TextDelta):
            n += 1
            if n == 3:
                cancel.set()
        else:
            last = event
    assert last is not None and last.stats.finish_reason == "cancelled"
    assert n < 50
    again = list(engine.generate(GenerationRequest(prompt="The sky is", max_tokens=3)))
    assert isinstance(again[-1], Finished) and again[-1].stats.completion_tokens > 0


def test_bad_flag_fails_with_the_log_tail(binary: ServerBinary) -> None:
    with pytest.raises(ServerError) as err:
        start_llama_server(["-m", str(gemma_path()), "--no-such-flag"], binary=binary, adapt=False)
    assert "--no-such-flag" in str(err.value)


def test_stop_ends_the_process(binary: ServerBinary) -> None:
    process = start_llama_server(["-m", str(gemma_path()), "-c", "512", "-np", "1"], binary=binary)
    pid = process.pid
    assert pid is not None and process.running
    process.stop()
    assert not process.running
    assert not _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is dead for our purpose.
    status = Path(f"/proc/{pid}/status")
    return not (status.exists() and "zombie" in status.read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_llama_server_dies_with_a_killed_parent(binary: ServerBinary, tmp_path: Path) -> None:
    """The parent starts llama-server from a short-lived worker thread (as the TUI does), then is SIGKILLed:
    no atexit runs, and the server must still go away."""
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import sys, threading, time
            from clover_local.llamacpp.binary import ServerBinary
            from clover_local.llamacpp.server import start_llama_server
            box = []
            def work():
                box.append(start_llama_server(
                    ["-m", {str(gemma_path())!r}, "-c", "512", "-np", "1"],
                    binary=ServerBinary(__import__("pathlib").Path({str(binary.path)!r}), "test")))
            t = threading.Thread(target=work); t.start(); t.join()
            time.sleep(1.0)  # the worker thread is gone; the server must still be alive
            print(box[0].pid, box[0].running, flush=True)
            time.sleep(600)
            """
        )
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        pid_text, running = line.split()
        child = int(pid_text)
        assert running == "True" and _alive(child)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    wait_until(lambda: not _alive(child), limit_s=30, what="llama-server to die with its parent")


def test_llama_fit_params_next_to_the_plan(binary: ServerBinary) -> None:
    from clover_local.llamacpp.fit_params import compare, describe, run_fit_params

    fit_binary = binary.sibling("llama-fit-params")
    if fit_binary is None:
        pytest.skip("no llama-fit-params next to this llama-server")
    plan = _gemma_plan(ctx=2048)
    fit = run_fit_params(plan, fit_binary)
    assert fit.ctx == 2048  # the same context was asked for, and a CPU machine has room for it
    comparison = compare(plan, fit, load_preset("gemma3-270m").architecture.n_layers)
    assert comparison.rows[0] == ("context", "2048", "2048")
    assert comparison.differences == ()
    text = "\n".join(describe(comparison))
    assert "llama-fit-params said: -c 2048" in text


def test_build_script_is_idempotent(binary: ServerBinary) -> None:
    """Run again where it already installed this version and backend, the build script exits at once."""
    info_file = binary.path.parent / "build-info.json"
    if not info_file.exists():
        pytest.skip("this llama-server was not installed by scripts/build-llama-server")
    import json

    info = json.loads(info_file.read_text())
    data_dir = binary.path.parent.parent.parent  # <data>/llama.cpp/bin/llama-server
    script = Path(__file__).resolve().parent.parent / "scripts" / "build-llama-server"
    result = subprocess.run(
        [str(script), "--backend", info["backend"]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CLOVER_DATA_DIR": str(data_dir)},
    )
    assert result.returncode == 0, result.stderr
    assert "is already installed" in result.stdout
    assert info["llama_cpp_commit"].startswith("0c1e570") and info["version"] == "0.3.36"
