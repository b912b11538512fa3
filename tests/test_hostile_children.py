"""Secrets and trust around child processes and workers (issue 27 items 3, 10, 11): the llama-server child
has its own key (by environment, never argv) so its port is no way around ``serve --api-key``; the port is
checked to be the child's; no child inherits HF_TOKEN; the RPC worker refuses the network unless told it is
trusted; a hostile worker cannot make the client loop 2^32 times."""

from __future__ import annotations

import argparse
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers_serve import llama_server_path

from clover_local.errors import CloverError, ServerError, UsageError
from clover_local.llamacpp import http_client
from clover_local.llamacpp.binary import ServerBinary
from clover_local.llamacpp.server import LlamaServerProcess, start_llama_server
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.rpc import protocol
from clover_local.testing.models import tiny_model


@pytest.fixture(scope="module")
def child() -> Iterator[LlamaServerProcess]:
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_TOKEN", "hf_secret_never_for_children")
    mp.setenv("CLOVER_API_KEY", "serve-key-never-for-children")
    argv = ["-m", str(tiny_model("llama")), "-c", "256", "-t", "1", "-np", "1"]
    try:
        with start_llama_server(argv, binary=ServerBinary(llama_server_path(), "test")) as server:
            yield server
    finally:
        mp.undo()


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


@pytest.mark.slow
def test_the_child_wants_its_own_key_and_gets_it_by_environment(child: LlamaServerProcess) -> None:
    assert child.api_key
    for path in ("/slots", "/props", "/v1/models"):
        assert http_client.request(child.url, "GET", path).status == 401, path
    assert http_client.request(child.url, "GET", "/props", api_key=child.api_key).status == 200
    assert child.api_key not in " ".join(child.command_line())
    assert _environ(child.pid or 0).get("LLAMA_API_KEY") == child.api_key


@pytest.mark.slow
def test_no_child_inherits_the_hub_token_or_the_serve_key(child: LlamaServerProcess) -> None:
    env = _environ(child.pid or 0)
    assert "HF_TOKEN" not in env and "CLOVER_API_KEY" not in env


@pytest.mark.slow
def test_the_engine_talks_to_its_keyed_child(child: LlamaServerProcess) -> None:
    engine = LlamaServerEngine(child, model_name="tiny", owns_process=False)
    assert engine.count_tokens("hello world") > 0


@pytest.mark.slow
def test_a_port_held_by_another_program_is_refused(child: LlamaServerProcess) -> None:
    from clover_local.llamacpp.server import check_listener

    check_listener(child, child.port)  # its own port
    with socket.socket() as impostor:
        impostor.bind(("127.0.0.1", 0))
        impostor.listen()
        with pytest.raises(ServerError, match="another program holds the port"):
            check_listener(child, impostor.getsockname()[1])


@pytest.mark.parametrize("host", ["0.0.0.0", "", "192.168.1.20", "::"])
def test_the_worker_refuses_the_network_unless_trusted(host: str) -> None:
    from clover_local.llamacpp.rpc_server import check_worker_host

    with pytest.raises(UsageError, match="--trust-network"):
        check_worker_host(host, trust_network=False)
    check_worker_host(host, trust_network=True)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1", "[::1]"])
def test_loopback_workers_need_no_flag(host: str) -> None:
    from clover_local.llamacpp.rpc_server import check_worker_host

    check_worker_host(host, trust_network=False)


def test_the_worker_command_refuses_before_starting_anything(capsys: pytest.CaptureFixture[str]) -> None:
    from clover_local.commands import worker

    args = argparse.Namespace(
        host="0.0.0.0", port=50052, device=None, threads=None, cache=False, verbose=False, trust_network=False
    )
    with pytest.raises(UsageError, match=r"Refusing to listen on 0\.0\.0\.0"):
        worker.run(args)


def _hostile_worker(device_count: int) -> tuple[socket.socket, threading.Thread]:
    """A TCP server that answers the RPC hello and then claims ``device_count`` devices."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            for reply in (
                bytes([protocol.PROTO_MAJOR, 0, 0, 0]) + bytes(protocol.CONN_CAPS_SIZE),
                struct.pack("<I", device_count),
            ):
                header = conn.recv(9)
                (size,) = struct.unpack_from("<Q", header, 1)
                while size:
                    size -= len(conn.recv(size))
                conn.sendall(struct.pack("<Q", len(reply)) + reply)
            conn.recv(1)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return listener, thread


def test_a_worker_claiming_billions_of_devices_is_refused() -> None:
    listener, thread = _hostile_worker(2**32 - 1)
    try:
        with pytest.raises(CloverError, match="4294967295 devices"):
            protocol.probe_worker("127.0.0.1", listener.getsockname()[1], measure=False)
    finally:
        listener.close()
        thread.join(5)


def test_the_worker_cli_refusal_is_a_message_not_a_traceback() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "clover_local", "worker", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--trust-network" in done.stderr and "Traceback" not in done.stderr
