"""A real llama-server child started again mid-conversation with fewer threads when the load says so (issue 48),
on both routes a person's model takes: the pinned build (SmolLM2 135M) and the test runtime that knows
``clover_moe`` (the tiny Clover-shaped hybrid model, whose recurrent state is saved with the slot too).

The load is scripted (a lookout saying another program took every core but one), so the relaunch happens on any
machine, however busy; the test waits for it, then asks the next message: it is answered, and from the slot's
restored state (tokens already cached), where a child started bare would read the whole conversation again."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from helpers_runner import launch_request
from waiting import wait_until

from clover_local.engine.types import ChatMessage, Finished, GenerationRequest, GenerationStats, TextDelta
from clover_local.launch import LaunchRequest, decide_launch
from clover_local.llamacpp.load_follow import FollowLoad
from clover_local.llamacpp.load_rule import LoadLook
from clover_local.llamacpp.server import start_llama_server
from clover_local.llamacpp.server_args import threads_in, with_threads
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer

pytestmark = pytest.mark.slow


class Scripted:
    """The other programs' load, as a test says it is."""

    def __init__(self) -> None:
        self.others = 0.0

    def look(self) -> LoadLook:
        return LoadLook(time.monotonic(), self.others)


@pytest.fixture(params=["pinned", "runtime"])
def route(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, tmp_path: Path
) -> LaunchRequest:
    return launch_request(request.param, monkeypatch, smollm2_path, tmp_path)


def _ask(engine: LlamaServerEngine, messages: list[ChatMessage]) -> tuple[str, GenerationStats]:
    text, stats = "", None
    for event in engine.generate(GenerationRequest(messages=tuple(messages), max_tokens=16, temperature=0)):
        if isinstance(event, TextDelta):
            text += event.text
        elif isinstance(event, Finished):
            stats = event.stats
    assert stats is not None
    return text, stats


def test_a_busy_machine_relaunches_the_child_and_the_conversation_goes_on(route: LaunchRequest) -> None:
    launch = decide_launch(route)
    n_cpus = psutil.cpu_count(logical=True) or 1
    two = max(2, min(4, n_cpus))  # launched with more threads than the load will leave
    process = start_llama_server(
        with_threads(launch.argv, two),
        binary=launch.runner.binary,
        adapt=launch.server_argv is None,
        keep_slots=True,
    )
    assert process.slot_save_dir is not None, "this llama-server can save its slots (--slot-save-path)"
    load = Scripted()
    engine = LlamaServerEngine(
        process,
        model_name="model",
        slots=1,
        follow_load=FollowLoad(two, 50.0),
        load_lookout=load,
    )
    try:
        first_pid = process.pid
        messages = [ChatMessage("user", "Name a colour.")]
        reply, stats = _ask(engine, messages)
        assert stats.completion_tokens > 0
        health = engine.health()
        assert health.threads is not None and health.threads.threads == two and health.threads.note == ""

        load.others = n_cpus - 1.0  # another program takes every core but one
        wait_until(
            lambda: engine.health().threads is not None and engine.health().threads.threads == 1,  # type: ignore[union-attr]
            "the child started again with one thread",
        )
        assert process.pid != first_pid and threads_in(process.argv) == 1
        assert engine.health().state == "ready"
        assert engine.health().threads.note.startswith("another program is busy: 1 thread")  # type: ignore[union-attr]

        messages += [ChatMessage("assistant", reply), ChatMessage("user", "And another?")]
        _again, after = _ask(engine, messages)
        assert after.completion_tokens > 0, "the next message is answered"
        assert after.cached_tokens > 0, "the slot's state was restored: the conversation is not read again"
        assert not list(Path(process.slot_save_dir).iterdir()), "slot files are deleted once restored"

        with BackgroundServer(engine, ApiConfig("model")) as server:  # serve says it too
            health = json.loads(urllib.request.urlopen(f"{server.url}/health", timeout=30).read())
            assert health["status"] == "ok"
            assert health["threads"]["in_use"] == 1 and health["threads"]["planned"] == two
            assert health["threads"]["relaunches"] == 1
            assert health["threads"]["note"].startswith("another program is busy")
    finally:
        engine.close()
    assert not process.running
    assert process.slot_save_dir is None or not Path(process.slot_save_dir).exists()
