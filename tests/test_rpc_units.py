"""Small RPC pieces without binaries: what a worker's device line means for ``--rpc``, and how a lost worker
is explained (with real sockets: one listening, one closed)."""

from __future__ import annotations

import socket

import pytest

from clover_local.llamacpp.rpc_server import WorkerDevice, rpc_spec
from clover_local.llamacpp.server import free_port
from clover_local.rpc.failures import explain_rpc_failure, rpc_endpoints


@pytest.mark.parametrize(
    ("name", "description", "kind"),
    [
        ("CPU", "AMD EPYC 7B13", "cpu"),
        ("CUDA0", "NVIDIA GeForce RTX 4090", "gpu:nvidia"),
        ("ROCm1", "Radeon RX 7900 XTX", "gpu:amd"),
        ("MTL0", "Apple M2 Max", "gpu:apple"),
        ("Vulkan0", "AMD Radeon 780M", "gpu:amd"),
        ("Vulkan1", "Intel(R) Arc(tm) A770", "gpu:intel"),
        ("Vulkan2", "llvmpipe", "unknown"),
    ],
)
def test_a_lent_devices_kind_comes_from_its_llama_cpp_name(name: str, description: str, kind: str) -> None:
    assert WorkerDevice(name, description, 1024, 1000).kind == kind


def test_the_rpc_spec_names_the_kind_only_when_known() -> None:
    assert (
        rpc_spec([WorkerDevice("CUDA0", "NVIDIA", 1, 1)], "192.168.1.20", 50052)
        == "gpu:nvidia@192.168.1.20:50052"
    )
    assert rpc_spec([WorkerDevice("Vulkan0", "llvmpipe", 1, 1)], "10.0.0.2", 1) == "10.0.0.2:1"


def test_a_lost_worker_is_named_when_it_cannot_be_reached() -> None:
    closed = free_port()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        alive = f"127.0.0.1:{listening.getsockname()[1]}"
        argv = ["-m", "x.gguf", "--rpc", f"{alive},127.0.0.1:{closed}", "-ngl", "all"]
        assert rpc_endpoints(argv) == [alive, f"127.0.0.1:{closed}"]
        why = explain_rpc_failure("Remote RPC server crashed or returned malformed response", argv)
        assert why is not None and f"127.0.0.1:{closed} cannot be reached" in why and alive not in why
        # every worker still there and no RPC message: not about workers
        assert explain_rpc_failure("out of memory", ["--rpc", alive]) is None
        assert "stopped answering" in (
            explain_rpc_failure("Remote RPC server crashed", ["--rpc", alive]) or ""
        )
    assert explain_rpc_failure("Remote RPC server crashed", ["-m", "x.gguf"]) is None


def test_a_llama_server_without_rpc_is_told_to_rebuild() -> None:
    why = explain_rpc_failure("error: RPC not supported in this build", ["--rpc", "127.0.0.1:1"])
    assert why is not None and "GGML_RPC=ON" in why
