"""A llama-server child that stops unasked is started again, and the engine, ``serve`` and the chat go on
(issue 39), on both routes of a real child: the pinned build (SmolLM2 135M) and the test runtime that knows
``clover_moe`` (the tiny Clover-shaped model), the path every Clover user takes.

Nothing races the child: it is killed from the thread reading its stream, right after a token arrived and hundreds
before the reply could end; a restart is held in its back-off (a long one, cut short by ``restart_now``) while the
test looks at ``/health`` and sends a request, so "restarting" is seen however fast or slow the machine is."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Any

import openai
import pytest
from helpers_runner import HOLD, kill_child, launch_request, no_log_lines, open_supervised
from waiting import wait_until

from clover_local.engine.types import Finished, GenerationRequest, TextDelta
from clover_local.errors import RunnerDied, RunnerUnavailable
from clover_local.launch import LaunchRequest
from clover_local.llamacpp.restart_policy import RestartPolicy
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.serve.api import ApiConfig
from clover_local.serve.runner import BackgroundServer

pytestmark = pytest.mark.slow

COUNTING = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
LONG = 300
"""Tokens a reply may run to: the child is killed after its first, so it is always mid-reply."""


@pytest.fixture(params=["pinned", "runtime"])
def route(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, tmp_path: Path
) -> LaunchRequest:
    return launch_request(request.param, monkeypatch, smollm2_path, tmp_path)


def _counting(max_tokens: int = LONG) -> GenerationRequest:
    return GenerationRequest(prompt=COUNTING, max_tokens=max_tokens, temperature=0)


def test_killed_mid_reply_the_request_gets_one_error_and_the_next_is_answered(route: LaunchRequest) -> None:
    engine = open_supervised(route)
    try:
        first_pid = engine.process.pid if engine.process else None
        texts: list[str] = []
        with pytest.raises(RunnerDied) as died:
            for event in engine.generate(_counting()):
                if isinstance(event, TextDelta):
                    texts.append(event.text)
                    if len(texts) == 1:
                        kill_child(engine)
                assert not isinstance(event, Finished), "a reply whose runner died must not finish"
        no_log_lines(str(died.value))
        assert "exit code -9" in str(died.value)
        assert "started again" in str(died.value)
        wait_until(lambda: engine.health().state == "ready" and engine.health().restarts == 1, "the restart")
        assert engine.process is not None and engine.process.pid != first_pid
        replies = [e for e in engine.generate(_counting(8)) if isinstance(e, Finished)]
        assert replies and replies[0].stats.completion_tokens > 0
        states = [h.state for h in engine.supervisor.history] if engine.supervisor else []
        assert states == ["restarting", "ready"]
    finally:
        engine.close()
    assert engine.process is not None and not engine.process.running


def _get(base: str, path: str) -> tuple[int, dict[str, str], Any]:
    host, port = base.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), json.loads(resp.read() or b"null")
    finally:
        conn.close()


def _stream_until_killed(base: str, engine: LlamaServerEngine) -> list[dict[str, Any]]:
    """A streamed chat completion whose runner is killed after its first content chunk: every event it got."""
    host, port = base.removeprefix("http://").split(":")
    body = {
        "model": "model",
        "messages": [{"role": "user", "content": "Count from 1 to 300, separated by commas."}],
        "max_tokens": LONG,
        "temperature": 0,
        "stream": True,
    }
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    events: list[dict[str, Any]] = []
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        killed = False
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                events.append({"done": True})
                continue
            event = json.loads(line[6:])
            events.append(event)
            delta = (event.get("choices") or [{}])[0].get("delta") or {}
            if delta.get("content") and not killed:
                kill_child(engine)
                killed = True
    finally:
        conn.close()
    return events


def test_serve_answers_503_while_it_restarts_then_answers(route: LaunchRequest) -> None:
    engine = open_supervised(route, HOLD)
    try:
        with BackgroundServer(engine, ApiConfig("model")) as server:
            events = _stream_until_killed(server.url, engine)
            errors = [e for e in events if "error" in e]
            assert len(errors) == 1, events
            finishes = [e for e in events if (e.get("choices") or [{}])[0].get("finish_reason")]
            assert not finishes, "no half-written success: the stream ends with the error"
            assert events[-1] == {"done": True}
            no_log_lines(errors[0]["error"]["message"])
            assert errors[0]["error"]["code"] == "model_unavailable"

            wait_until(lambda: engine.health().state == "restarting", "the supervisor to notice")
            status, headers, health = _get(server.url, "/health")
            assert (status, health["status"]) == (503, "loading"), health
            assert int(headers["retry-after"]) >= 1
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as refused:
                client.completions.create(model="model", prompt=COUNTING, max_tokens=4)
            assert refused.value.status_code == 503
            assert int(refused.value.response.headers["retry-after"]) >= 1
            no_log_lines(refused.value.response.json()["error"]["message"])

            assert engine.supervisor is not None
            engine.supervisor.restart_now()
            wait_until(lambda: _get(server.url, "/health")[0] == 200, "/health to say ok again")
            status, _headers, health = _get(server.url, "/health")
            assert (health["status"], health["restarts"]) == ("ok", 1)
            reply = client.completions.create(model="model", prompt=COUNTING, max_tokens=8, temperature=0)
            assert reply.choices[0].text.strip()
    finally:
        engine.close()


def test_a_child_that_keeps_dying_is_given_up_with_the_reason(route: LaunchRequest) -> None:
    """The model file gone, every restart dies at once: after the policy's limit no restart is tried, and the
    reason (not the log) is what ``/health`` and a request say."""
    engine = open_supervised(route, RestartPolicy(backoff_s=(0.1,), max_stops=2, window_s=600.0))
    try:
        with BackgroundServer(engine, ApiConfig("model")) as server:
            assert route.model is not None
            Path(route.model).unlink()
            kill_child(engine)
            wait_until(lambda: engine.health().state == "failed", "the supervisor to give up")
            health = engine.health()
            assert "3 times" in health.why, health.why
            assert engine.process is not None and not engine.process.running
            status, _headers, body = _get(server.url, "/health")
            assert (status, body["status"]) == (503, "error")
            no_log_lines(body["error"])
            with pytest.raises(RunnerUnavailable):
                engine.count_tokens("hello")
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
            with pytest.raises(openai.APIStatusError) as refused:
                client.completions.create(model="model", prompt="hi", max_tokens=4)
            assert refused.value.status_code == 503
            assert "retry-after" not in refused.value.response.headers  # waiting does not cure it
            no_log_lines(refused.value.response.json()["error"]["message"])
    finally:
        engine.close()


OOM_WRAPPER = """#!/bin/sh
# llama-server, except that a context above 4096 tokens fails to allocate its KV cache as llama.cpp says it does
# when memory runs out (the lines are llama.cpp's own), so the out-of-memory path runs on any machine.
ctx=0
prev=""
for arg in "$@"; do
  if [ "$prev" = "-c" ] || [ "$prev" = "--ctx-size" ]; then ctx="$arg"; fi
  prev="$arg"
done
if [ "$ctx" -gt 4096 ]; then
  echo "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer of size 402653184"
  echo "llama_init_from_model: failed to initialize the context: failed to allocate buffer for kv cache"
  echo "srv    load_model: failed to load model"
  exit 1
fi
exec {real} "$@"
"""


def test_out_of_memory_at_load_is_planned_again_once_not_looped(smollm2_path: Path, tmp_path: Path) -> None:
    """llama-server's load runs out of memory at the planned context: the launch is planned again for less
    memory once (as the embedded engine's is), said in words, and that one runs; nothing retries the same argv."""
    from helpers_serve import llama_server_path

    from clover_local.launch import decide_launch, open_launch

    wrapper = tmp_path / "llama-server"
    wrapper.write_text(OOM_WRAPPER.format(real=llama_server_path()))
    wrapper.chmod(0o755)
    request = LaunchRequest(
        "smollm2-135m", str(smollm2_path), ctx=8192, engine="llama-server", llama_server=str(wrapper),
        describe=False, spec="off",
    )  # fmt: skip
    opened = open_launch(decide_launch(request))
    try:
        assert opened.plan.ctx == 4096
        assert opened.fallback_message is not None
        assert "ran out of memory" in opened.fallback_message and "8192 -> 4096" in opened.fallback_message
        replies = [e for e in opened.engine.generate(_counting(4)) if isinstance(e, Finished)]
        assert replies and replies[0].stats.completion_tokens > 0
    finally:
        opened.engine.close()


@pytest.mark.parametrize("keep_serving", [False, True], ids=["exits", "keep-serving"])
def test_serve_whose_runner_is_given_up_exits_with_the_reason(
    keep_serving: bool, smollm2_path: Path, tmp_path: Path
) -> None:
    """Issue 49: ``serve`` answered 503 for ever once its runner was given up, so systemd or Docker never started
    it again. A real ``clover-local serve`` whose llama-server keeps dying (its model file gone, then the child
    killed): it exits with status 1 and the reason; ``--keep-serving`` stays up and answers 503 with it."""
    import shutil
    import subprocess
    import sys

    import psutil
    from helpers_serve import llama_server_path

    from clover_local.llamacpp.server import free_port

    model = tmp_path / "smollm2.gguf"
    shutil.copyfile(smollm2_path, model)
    port = free_port()
    argv = [
        sys.executable, "-m", "clover_local", "serve", "--model", str(model), "--preset", "smollm2-135m",
        "--engine", "llama-server", "--llama-server", str(llama_server_path()), "--ctx", "1024",
        "--spec", "off", "--port", str(port), *(["--keep-serving"] if keep_serving else []),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:

        def answers() -> bool:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                return _get(url, "/health")[0] == 200
            except OSError:
                return False

        wait_until(answers, "serve to answer")
        (child,) = [p for p in psutil.Process(proc.pid).children() if "llama-server" in p.name()]
        model.unlink()  # every restart now dies at once: after the policy's limit it is given up
        child.kill()
        if keep_serving:

            def given_up() -> bool:
                body = _get(url, "/health")[2]
                return "times within" in str(body.get("error", ""))

            wait_until(given_up, "the runner given up, said by /health")
            status, _headers, body = _get(url, "/health")
            assert status == 503 and proc.poll() is None, "still serving"
            no_log_lines(body["error"])
            return
        _out, err = proc.communicate(timeout=240)
        assert proc.returncode == 1, err
        said = err[err.index("error: serve stopped") :]
        assert "runner was given up" in said and "times within" in said, said
        assert "--keep-serving" in said and "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
