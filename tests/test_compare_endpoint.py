"""An OpenAI-compatible endpoint as a contender: a real ``clover-local serve`` of the same SmolLM2 GGUF (its key
given to ``compare`` by an environment variable, and found nowhere in the output, the report or the picture),
measured while no local model is loaded, with nearly the same passes as the local SmolLM2; the real upstream
llama-server serving Gemma beside the local SmolLM2; and a stand-in HTTP server for what a hostile endpoint
does (a reply without end, the key echoed back, the key refused)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from helpers_compare import TASKS, Recorder, write_tasks
from helpers_serve import llama_server_path
from waiting import wait_until

from clover_local.compare.contenders import parse_contenders
from clover_local.compare.endpoint import EndpointEngine
from clover_local.compare.options import CompareOptions
from clover_local.compare.runner import run_compare, run_task
from clover_local.compare.saferegex import SafeRegex
from clover_local.compare.tasks import load_tasks
from clover_local.errors import ServerError
from clover_local.llamacpp.server import free_port

CLI = [sys.executable, "-m", "clover_local"]
SECRET = "sk-compare-test-7f3a9c1e5b"
OPTIONS = CompareOptions(max_tokens=24, ctx=1024, key_env="CMP_TEST_KEY")
GREEDY_PASS_GAP = 1
"""The same GGUF locally and behind ``serve``, greedy, may differ by this many of the tasks' passes: the two
evaluate the prompt in other batches (the server's chat route, another thread count), so a near-tie can flip."""


def _models(base: str) -> list[str]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", int(base.rsplit(":", 1)[1]), timeout=5)
    try:
        conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {SECRET}"})
        return [m["id"] for m in json.loads(conn.getresponse().read())["data"]]
    finally:
        conn.close()


@pytest.fixture(scope="module")
def served(smollm2_path: Path) -> Iterator[tuple[str, str]]:
    """``clover-local serve`` of the SmolLM2 GGUF, requiring the key (given to it by CLOVER_API_KEY)."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *CLI,
            "serve",
            "--model",
            str(smollm2_path),
            "--engine",
            "embedded",
            "--ctx",
            "1024",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "CLOVER_API_KEY": SECRET},
    )
    base = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        if proc.poll() is not None:
            pytest.fail(f"serve exited: {proc.stdout.read() if proc.stdout else ''}")
        try:
            return bool(_models(base))
        except OSError:
            return False

    wait_until(ready, what="clover-local serve to answer")
    yield base, _models(base)[0]
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_the_same_gguf_local_and_behind_serve_nearly_agree(
    served: tuple[str, str], smollm2_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, model = served
    monkeypatch.setenv("CMP_TEST_KEY", SECRET)
    tasks = load_tasks(str(write_tasks(tmp_path)))
    endpoint = f"{base}/v1#{model}"
    contenders = parse_contenders([str(smollm2_path), endpoint])
    recorder = Recorder()
    report = run_compare(contenders, tasks, OPTIONS, opener=recorder)
    # The endpoint answered only after the local model was closed, and before nothing else was loaded.
    kinds = [(e[0], e[1]) for e in recorder.events]
    first_endpoint_ask = next(i for i, e in enumerate(recorder.events) if e[0] == "ask" and e[1] == endpoint)
    assert kinds.index(("close", str(smollm2_path))) < kinds.index(("opening", endpoint)) < first_endpoint_ask
    assert recorder.most_open == 1
    local, remote = report.contenders
    assert remote.error is None and remote.total == local.total == len(TASKS)
    assert abs(local.passed - remote.passed) <= GREEDY_PASS_GAP, (local.passes(), remote.passes())
    assert {t.id: t.passed for t in remote.tasks}["capital"]
    assert remote.peak_ram_bytes is None  # an endpoint's memory is not ours to measure
    assert all(t.ttft_s is not None and t.latency_s for t in remote.tasks)


@pytest.mark.slow
def test_the_key_is_nowhere_in_the_output_the_report_or_the_picture(
    served: tuple[str, str], tmp_path: Path
) -> None:
    base, model = served
    tasks = write_tasks(tmp_path, TASKS[:2])
    out = tmp_path / "report.json"
    argv = [*CLI, "compare", f"{base}/v1#{model}", "--tasks", str(tasks), "--max-tokens", "16",
            "--key-env", "CMP_TEST_KEY", "--json", str(out)]  # fmt: skip
    assert SECRET not in " ".join(argv)
    env = {**os.environ, "CMP_TEST_KEY": SECRET}
    result = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stderr
    assert "2/2" in result.stdout or "1/2" in result.stdout
    for text in (result.stdout, result.stderr, out.read_text(), out.with_suffix(".svg").read_text()):
        assert SECRET not in text
    assert json.loads(out.read_text())["options"]["key_env"] == "CMP_TEST_KEY"  # its name, never its value

    # Without the key the endpoint refuses: one clear error for the contender, still no key printed.
    wrong = {**os.environ, "CMP_TEST_KEY": "not-the-key"}
    refused = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=wrong)
    assert "refused the key (HTTP 401)" in refused.stdout + refused.stderr
    unset = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert unset.returncode == 2 and "CMP_TEST_KEY: that environment variable is not set" in unset.stderr


@pytest.mark.slow
def test_smollm2_beside_an_upstream_llama_server_serving_gemma(
    smollm2_path: Path, gemma_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.llamacpp.server import start_llama_server

    binary = ServerBinary(llama_server_path(), "test")
    launch = decide_launch(
        LaunchRequest(None, str(gemma_path), ctx=1024, engine="llama-server", llama_server=str(binary.path))
    )
    server = start_llama_server(launch.settings.argv(), binary=binary, api_key=SECRET)
    monkeypatch.setenv("CMP_TEST_KEY", SECRET)
    try:
        contenders = parse_contenders([str(smollm2_path), f"{server.url}/v1#gemma"])
        tasks = load_tasks(str(write_tasks(tmp_path, TASKS[:2])))
        report = run_compare(contenders, tasks, OPTIONS)
    finally:
        server.stop()
    local, upstream = report.contenders
    assert local.error is None and upstream.error is None and upstream.total == 2
    assert all(t.latency_s for t in upstream.tasks) and SECRET not in json.dumps(report.to_json())


# -- a hostile endpoint (a real HTTP server that misbehaves) ---------------------------------------------------


class _Hostile(BaseHTTPRequestHandler):
    mode = "endless"

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(401 if self.mode == "refuse" else 200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b'{"data": [{"id": "m"}]}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.mode == "echo":
            said = json.dumps({"error": {"message": f"bad key {self.headers.get('Authorization')}"}})
            self.send_response(500)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(said.encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        chunk = b'data: {"choices": [{"delta": {"content": "' + b"x" * 1000 + b'"}}]}\n\n'
        try:
            while True:  # a reply without end
                self.wfile.write(chunk)
        except OSError:
            return


@pytest.fixture
def hostile() -> Iterator[tuple[str, type[_Hostile]]]:
    handler = type("Handler", (_Hostile,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1", handler
    server.shutdown()
    server.server_close()


def test_a_reply_without_end_is_cut_at_the_cap_and_fails_its_task(
    hostile: tuple[str, type[_Hostile]],
) -> None:
    base, _handler = hostile
    engine = EndpointEngine(base, "m", SECRET, max_reply_bytes=64 * 1024)
    task = load_tasks("builtin").tasks[0]
    with SafeRegex() as regex:
        result = run_task(engine, task, 0, CompareOptions(), regex)
    assert not result.passed and result.error and "went past 65536 bytes" in result.error


def test_the_key_echoed_back_is_cut_out_and_a_refused_key_is_one_clear_error(
    hostile: tuple[str, type[_Hostile]],
) -> None:
    base, handler = hostile
    handler.mode = "echo"
    engine = EndpointEngine(base, "m", SECRET)
    task = load_tasks("builtin").tasks[0]
    with SafeRegex() as regex:
        result = run_task(engine, task, 0, CompareOptions(), regex)
    assert (
        result.error and "HTTP 500" in result.error and "***" in result.error and SECRET not in result.error
    )
    handler.mode = "refuse"
    with pytest.raises(ServerError, match="refused the key") as caught:
        engine.probe()
    assert SECRET not in str(caught.value)


def test_a_key_given_where_its_variable_name_goes_is_refused_and_not_echoed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from clover_local.cli import main

    for given in ("sk-live-4f9a2b7c", "sk_live_4f9a2b7c"):
        code = main(["compare", "smollm2-135m", "http://127.0.0.1:9/v1#m", "--key-env", given])
        err = capsys.readouterr().err
        assert code == 2 and given not in err and "--key-env" in err
