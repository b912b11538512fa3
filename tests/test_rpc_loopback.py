"""The real RPC path on one machine: two ``rpc-server`` workers on 127.0.0.1 (CPU backend) built by
scripts/build-llama-server, read through the RPC protocol, started by ``clover-local worker``, and Gemma 3 270M
split across this machine and both workers by the plan. Only loopback addresses are used.

Skipped when the binaries are missing, except in CI, where that fails (CI builds them first)."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from waiting import wait_until

from clover_local import settings
from clover_local.detect import parse_simulate
from clover_local.engine.types import ChatMessage, Finished, GenerationRequest, TextDelta
from clover_local.errors import ServerError
from clover_local.gguf.header import read_local_header
from clover_local.llamacpp.binary import ServerBinary
from clover_local.llamacpp.rpc_server import WorkerProcess, start_worker
from clover_local.llamacpp.server import free_port, plan_server_argv, start_llama_server
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.plan import memory
from clover_local.plan.planner import make_plan
from clover_local.plan.types import Plan, Wishes
from clover_local.presets import load_preset
from clover_local.rpc.probe import probe_workers
from clover_local.rpc.protocol import probe_worker
from clover_local.testing.models import gemma_path
from tests.helpers_serve import llama_server_path

pytestmark = pytest.mark.slow

# Resolved at import, before the autouse fixture points CLOVER_DATA_DIR at a temporary folder.
_REAL_RPC = settings.llama_server_dir() / "rpc-server"
_ENV_RPC = os.environ.get("CLOVER_RPC_SERVER")
MIB = 1024**2
PROMPT = "List the planets of the solar system in order, one per line."
# Free memory described for the two workers so the plan splits Gemma three ways (found with the planner: the
# first 7 layers on this machine, 7 on the first worker, 4 and the output head on the second).
WORKER_MEMORY = ("1060M", "1730M")


def rpc_server_path() -> Path:
    for candidate in (_ENV_RPC, str(_REAL_RPC)):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    message = f"no rpc-server binary ({_REAL_RPC}); run scripts/build-llama-server"
    if os.environ.get("CI"):
        pytest.fail(message + " (CI must build it before the tests)")
    pytest.skip(message)


def _two_workers() -> list[WorkerProcess]:
    binary = rpc_server_path()
    out = []
    for _ in range(2):
        out.append(start_worker("127.0.0.1", free_port(), threads=1, binary=binary, ready_timeout_s=120))
    return out


@pytest.fixture(scope="module")
def workers() -> Iterator[list[WorkerProcess]]:
    started = _two_workers()
    yield started
    for w in started:
        w.stop()


@pytest.fixture(scope="module")
def binary() -> ServerBinary:
    return ServerBinary(llama_server_path(), "test")


def _local_plan() -> Plan:
    return make_plan(
        parse_simulate("ram=16G,cpu=2"),
        load_preset("gemma3-270m"),
        read_local_header(gemma_path()),
        Wishes(ctx=2048, speculative=False),
        str(gemma_path()),
    )


def _split_plan(workers: list[WorkerProcess]) -> Plan:
    (a, b), (wa, wb) = WORKER_MEMORY, workers
    spec = f"ram=16G,cpu=2,rpc=cpu:{a}@{wa.endpoint},rpc=cpu:{b}@{wb.endpoint},link=10Gbit/0.1ms"
    return make_plan(
        parse_simulate(spec),
        load_preset("gemma3-270m"),
        read_local_header(gemma_path()),
        Wishes(ctx=2048, speculative=False),
        str(gemma_path()),
    )


def _reply(engine: LlamaServerEngine, max_tokens: int = 48) -> tuple[str, Finished]:
    request = GenerationRequest(
        messages=(ChatMessage("user", PROMPT),), max_tokens=max_tokens, temperature=0.0, seed=1
    )
    parts, done = [], None
    for event in engine.generate(request):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, Finished):
            done = event
    assert done is not None
    return "".join(parts), done


def test_probe_reads_each_workers_devices_and_measures_the_link(workers: list[WorkerProcess]) -> None:
    report = probe_worker("127.0.0.1", workers[0].port)
    assert report.version[0] == 7
    assert len(report.devices) == 1
    device = report.devices[0]
    assert 0 < device.free_bytes <= device.total_bytes
    assert report.link is not None
    assert report.link.rtt_s > 0 and report.link.send_bytes_per_s > 0 and report.link.recv_bytes_per_s > 0
    pooled = probe_workers(",".join(f"cpu@{w.endpoint}" for w in workers))
    assert [d.label for w in pooled for d in w.devices] == [
        f"{workers[0].endpoint}/RPC0",
        f"{workers[1].endpoint}/RPC1",
    ]
    assert all(w.link.source.startswith("measured") for w in pooled)
    # What rpc-server printed when it started is what the protocol says (MiB, as it prints them).
    assert workers[0].devices and workers[0].devices[0].kind == "cpu"
    assert workers[0].devices[0].total_mib == device.total_bytes // MIB


def test_worker_command_prints_what_to_give_the_main_machine_and_stops_on_ctrl_c() -> None:
    port = free_port()
    env = {**os.environ, "CLOVER_RPC_SERVER": str(rpc_server_path())}
    # 127.0.0.2 is loopback too, but not the default: the security warning is printed.
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "clover_local",
            "worker",
            "--host",
            "127.0.0.2",
            "--port",
            str(port),
            "--threads",
            "1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == f"On the main machine: clover-local serve --rpc cpu@127.0.0.2:{port}"
        report = probe_worker("127.0.0.2", port, measure=False)
        assert report.devices
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "no authentication and no encryption" in err
    assert "worker stopped" in err

    def port_free() -> bool:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.2", port))
            except OSError:
                return False
            return True

    wait_until(port_free, what="the rpc-server child to be gone")


def test_worker_refuses_a_taken_port(workers: list[WorkerProcess]) -> None:
    with pytest.raises(ServerError, match=re.escape("Cannot listen on 127.0.0.1")):
        start_worker("127.0.0.1", workers[0].port, binary=rpc_server_path())


def test_split_over_two_workers_loads_the_planned_buffers_and_answers_like_local(
    workers: list[WorkerProcess], binary: ServerBinary
) -> None:
    split = _split_plan(workers)
    # the same settings on this machine alone (memory is tight on the described workers: a q8_0 KV cache)
    local = replace(_local_plan(), cache_type_k=split.cache_type_k, cache_type_v=split.cache_type_v)
    devices = memory.layer_devices(18, split.n_gpu_layers, 2, split.tensor_split)
    assert {-1, 0, 1} <= set(devices[:18]), devices  # layers on this machine and on both workers
    argv = plan_server_argv(split)
    assert argv[argv.index("--rpc") + 1] == f"{workers[0].endpoint},{workers[1].endpoint}"
    # Workers keep weights in plain CPU buffers; this machine would repack Q4_K for other kernels, whose sums
    # round differently. Without repacking, both run the same kernels, so greedy replies can be compared.
    argv.append("--no-repack")
    argv.append("-v")  # the load log with each buffer's size (llama.cpp logs it below the default verbosity)

    with start_llama_server(
        [*plan_server_argv(local), "--no-repack"], binary=binary, ready_timeout_s=300
    ) as server:
        local_text, _ = _reply(LlamaServerEngine(server, owns_process=False))
    log: list[str] = []
    with start_llama_server(argv, binary=binary, on_log=log.append, ready_timeout_s=300) as server:
        split_text, _ = _reply(LlamaServerEngine(server, owns_process=False))
    assert split_text == local_text
    assert len(split_text) > 20

    # The load log names each worker's buffers by its endpoint; their sizes are the plan's.
    def logged(kind: str, endpoint: str) -> float:
        pattern = re.compile(rf"RPC\d+\[{re.escape(endpoint)}\]\s+{kind} buffer size =\s+([\d.]+) MiB")
        sizes = [float(m.group(1)) for line in log if (m := pattern.search(line))]
        assert sizes, f"no {kind} buffer line for {endpoint} in:\n" + "\n".join(log[-60:])
        return sum(sizes)

    by_name = {d.name: d for d in split.memory.gpus}
    for w in workers:
        planned = next(d for name, d in by_name.items() if name.startswith(w.endpoint))
        assert logged("model", w.endpoint) == pytest.approx(planned.weights_bytes / MIB, rel=0.01)
        assert logged("KV", w.endpoint) == pytest.approx(planned.kv_cache_bytes / MIB, rel=0.01)


def test_a_worker_killed_mid_reply_is_reported_not_a_hang(binary: ServerBinary) -> None:
    from starlette.testclient import TestClient

    from clover_local.serve.api import ApiConfig, create_app

    pair = _two_workers()
    try:
        engine = LlamaServerEngine(
            start_llama_server(plan_server_argv(_split_plan(pair)), binary=binary, ready_timeout_s=300)
        )
        request = GenerationRequest(
            messages=(ChatMessage("user", "Count from 1 to 300, one number per line."),),
            max_tokens=600,
            temperature=0.0,
        )
        outcome: dict[str, object] = {}

        def consume() -> None:
            try:
                for event in engine.generate(request):
                    if isinstance(event, TextDelta) and "killed" not in outcome:
                        os.killpg(pair[1].pid, signal.SIGKILL)  # the second worker dies mid-reply
                        outcome["killed"] = True
                outcome["finished"] = True
            except ServerError as exc:
                outcome["error"] = str(exc)

        thread = threading.Thread(target=consume, daemon=True)
        thread.start()
        thread.join(timeout=300)
        assert not thread.is_alive(), "the reply hung after a worker was killed"
        assert outcome.get("killed")
        error = str(outcome.get("error", ""))
        assert "a worker was lost" in error and f"{pair[1].endpoint} cannot be reached" in error, outcome
        # The OpenAI server in front keeps answering /health, and says what happened.
        client = TestClient(
            create_app(engine, ApiConfig(model_id="gemma3-270m")), base_url="http://127.0.0.1"
        )
        health = client.get("/health")
        assert health.status_code == 503
        assert "a worker was lost" in health.json()["error"]
        answer = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        # The runner is being started again (or was given up once the worker stays gone): a 503, saying why.
        assert answer.status_code == 503 and "a worker was lost" in answer.text
        engine.close()
    finally:
        for w in pair:
            w.stop()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_rpc_server_started_from_a_worker_thread_outlives_the_thread_and_dies_with_us(tmp_path: Path) -> None:
    """rpc-server gets PR_SET_PDEATHSIG like llama-server, which fires when the *thread* that forked it ends:
    started from a short-lived thread (as the TUI starts things) it must live on, and still die on kill -9
    of clover-local."""
    binary = rpc_server_path()
    script = tmp_path / "parent.py"
    script.write_text(
        "import threading, time\n"
        "from pathlib import Path\n"
        "from clover_local.llamacpp.rpc_server import start_worker\n"
        "from clover_local.llamacpp.server import free_port\n"
        "box = []\n"
        "t = threading.Thread(target=lambda: box.append(start_worker(\n"
        f"    '127.0.0.1', free_port(), threads=1, binary=Path({str(binary)!r}), ready_timeout_s=120)))\n"
        "t.start(); t.join()\n"
        "time.sleep(1.0)\n"
        "print(box[0]._proc.pid, box[0]._proc.poll() is None, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = parent.stdout.readline() if parent.stdout else ""
        pid_text, running = line.split()
        child = int(pid_text)
        assert running == "True"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()

    def gone() -> bool:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return True
        status = Path(f"/proc/{child}/status")
        return status.exists() and "zombie" in status.read_text()

    wait_until(gone, limit_s=30, what="rpc-server to die with its parent")
