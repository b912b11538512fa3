"""Why a llama-server with workers stopped: llama.cpp's RPC client aborts the whole server when a worker stops
answering (``RPC_STATUS_ASSERT`` in ``ggml-rpc.cpp``: "Remote RPC server crashed or returned malformed
response"), so the reason is read from its last lines and by knocking on each worker."""

from __future__ import annotations

import socket
from collections.abc import Sequence

_RPC_FAILURES = (
    "Remote RPC server crashed",
    "Failed to connect to",
    "RPC handshake failed",
    "RPC server version mismatch",
    "RPC not supported in this build",
)


def rpc_endpoints(argv: Sequence[str]) -> list[str]:
    """The workers named by ``--rpc`` in a llama-server argv."""
    for i, token in enumerate(argv[:-1]):
        if token == "--rpc":
            return [e.strip() for e in argv[i + 1].split(",") if e.strip()]
    return []


def reachable(endpoint: str, timeout_s: float = 1.0) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


def explain_rpc_failure(log_tail: str, argv: Sequence[str]) -> str | None:
    """A sentence for people when a worker is why llama-server stopped; None when it is not about workers."""
    if not (endpoints := rpc_endpoints(argv)):
        return None
    if "RPC not supported in this build" in log_tail:
        return "this llama-server was built without RPC: rebuild it with scripts/build-llama-server (GGML_RPC=ON)."
    down = [e for e in endpoints if not reachable(e)]
    if not down and not any(marker in log_tail for marker in _RPC_FAILURES):
        return None
    which = (
        f"{', '.join(down)} cannot be reached" if down else f"one of {', '.join(endpoints)} stopped answering"
    )
    return (
        f"a worker was lost: {which}. llama.cpp cannot go on without a worker that holds layers; restart the "
        "worker (`clover-local worker` there) and then this server, or plan without it."
    )
