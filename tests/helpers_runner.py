"""Shared pieces of the runner-restart tests (issue 39): a llama-server launch on each route a person's model
takes (the pinned build, and the test runtime that knows ``clover_moe``), opened as ``open_launch`` opens it with
a chosen restart policy, and the child killed as the OOM killer or a driver reset would."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
from helpers_serve import llama_server_path

from clover_local.launch import LaunchRequest, decide_launch
from clover_local.llamacpp.restart_policy import RestartPolicy
from clover_local.llamacpp.server import start_llama_server
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.testing.models import tiny_clover_model
from clover_local.testing.runtime import built_runtime, runtimes_folder

RUNTIMES = runtimes_folder()  # read before the per-test user directories are set
BUILT = built_runtime(RUNTIMES)
HOLD = RestartPolicy(backoff_s=(600.0,), max_stops=3)
"""A back-off no test waits out: the restart is held until the test calls ``restart_now``."""
LOG_MARKERS = ("llama_", "load_tensors", "main:", "srv ", "slot ", "print_info", "build:")
"""Words only llama-server's log lines hold: none may reach an API body or an error a client gets."""


def launch_request(
    kind: str, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, tmp: Path
) -> LaunchRequest:
    """The launch a person's ``serve`` makes on this route, from a copy of the model (a test may remove it)."""
    if kind == "pinned":
        model = tmp / "smollm2.gguf"
        shutil.copyfile(smollm2_path, model)
        return LaunchRequest(
            "smollm2-135m",
            str(model),
            ctx=1024,
            engine="llama-server",
            llama_server=str(llama_server_path()),
            describe=False,
            spec="off",
        )
    if BUILT is None:
        pytest.skip("the test runtime is not built (scripts/make_test_runtime.py)")
    monkeypatch.setenv("CLOVER_RUNTIMES_DIR", str(RUNTIMES))
    model = tmp / "tiny-hybrid-moe.gguf"
    shutil.copyfile(tiny_clover_model(), model)
    return LaunchRequest(None, str(model), ctx=512, describe=False, spec="off")


def open_supervised(request: LaunchRequest, policy: RestartPolicy | None = None) -> LlamaServerEngine:
    """The launch opened as ``open_launch`` opens a llama-server one, with ``policy`` for its restarts (None:
    the product's)."""
    launch = decide_launch(request)
    assert launch.runner.kind == "llama-server"
    process = start_llama_server(launch.argv, binary=launch.runner.binary, adapt=launch.server_argv is None)
    kwargs: dict[str, Any] = {} if policy is None else {"restarts": policy}
    return LlamaServerEngine(process, model_name="model", slots=1, **kwargs)


def kill_child(engine: LlamaServerEngine) -> int:
    """SIGKILL the engine's llama-server (nothing it can catch or clean up after); its pid."""
    process = engine.process
    assert process is not None and process.pid is not None
    pid = process.pid
    os.kill(pid, signal.SIGKILL)
    return pid


def no_log_lines(text: str) -> None:
    """``text`` is one sentence, with nothing of llama-server's log in it."""
    assert "\n" not in text.strip(), f"one sentence, not the child's log: {text!r}"
    assert not any(marker in text for marker in LOG_MARKERS), text
