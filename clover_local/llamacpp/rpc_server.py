"""Run llama.cpp's ``rpc-server`` on this machine so another machine's ``llama-server --rpc`` can use its devices.

The binary is built by ``scripts/build-llama-server`` next to ``llama-server`` (CMake target
``ggml-rpc-server``, installed as ``rpc-server``). The child gets its own process group and dies with
clover-local (as ``llama-server`` does); ready means it answers the RPC handshake on its own address.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from clover_local import settings
from clover_local.detect.remote import DEFAULT_PORT
from clover_local.errors import CloverError, ServerError, UsageError
from clover_local.llamacpp.binary import find_tool
from clover_local.llamacpp.children import Child, bind_error
from clover_local.netaddr import is_loopback_host
from clover_local.rpc.protocol import RpcError, WorkerReport, probe_worker

BINARY_NAMES = ("rpc-server", "ggml-rpc-server")
_DEVICE_LINE_RE = re.compile(
    r"^\s+(?P<name>[A-Za-z]+\d*): (?P<desc>.*) \((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)"
)
_KIND_BY_BACKEND = {
    "cpu": "cpu",
    "cuda": "gpu:nvidia",
    "rocm": "gpu:amd",
    "mtl": "gpu:apple",
    "sycl": "gpu:intel",
}


@dataclass(frozen=True)
class WorkerDevice:
    """A device the worker lends, as ``rpc-server`` prints it when it starts."""

    name: str
    description: str
    total_mib: int
    free_mib: int

    @property
    def kind(self) -> str:
        """The ``--rpc`` KIND for this device: ``cpu``, ``gpu:nvidia``... or ``unknown``."""
        backend = re.sub(r"\d+$", "", self.name).lower()
        if backend in _KIND_BY_BACKEND:
            return _KIND_BY_BACKEND[backend]
        desc = self.description.lower()
        for vendor in ("nvidia", "amd", "intel", "apple"):
            if vendor in desc or (vendor == "amd" and "radeon" in desc):
                return f"gpu:{vendor}"
        return "unknown"


def find_rpc_server() -> Path | None:
    """``CLOVER_RPC_SERVER``, else the one ``scripts/build-llama-server`` installed, else ``PATH``."""
    override = os.environ.get(settings.ENV_PREFIX + "RPC_SERVER")
    if override:
        path = Path(override).expanduser()
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServerError(
                f"CLOVER_RPC_SERVER ({override}) is not an executable file.", "Fix the path, or unset it."
            )
        return path
    return find_tool(*BINARY_NAMES)


def rpc_server_argv(
    binary: Path,
    host: str,
    port: int,
    devices: str | None = None,
    threads: int | None = None,
    cache: bool = False,
) -> list[str]:
    """The ``rpc-server`` command line (flags of ``tools/rpc/rpc-server.cpp``)."""
    argv = [str(binary), "--host", host, "--port", str(port)]
    if devices:
        argv += ["--device", devices]
    if threads:
        argv += ["--threads", str(threads)]
    if cache:
        argv.append("--cache")
    return argv


def lan_addresses() -> list[str]:
    """This machine's IPv4 addresses other machines may reach (loopback and link-local left out)."""
    import psutil

    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith(("127.", "169.254.")):
                out.append(a.address)
    return sorted(set(out))


class WorkerProcess(Child):
    """One running ``rpc-server``; :func:`start_worker` makes one."""

    name = "rpc-server"
    shown_lines = 20

    def __init__(self, argv: list[str], host: str, port: int, on_log: Callable[[str], None] | None) -> None:
        super().__init__(on_log)
        self.argv, self.host, self.port = argv, host, port
        self.devices: list[WorkerDevice] = []
        self._greeted = threading.Event()
        """Set once rpc-server flushed its start-up lines (it flushes when it accepts a client)."""
        self._spawn(argv, dict(os.environ), self._heard)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def _heard(self, line: str) -> None:
        """One line of its log: a device it lends, or the client it accepted (its start-up lines are out)."""
        m = _DEVICE_LINE_RE.match(line)
        if m:
            self.devices.append(WorkerDevice(m["name"], m["desc"], int(m["total"]), int(m["free"])))
        if "Accepted client connection" in line:
            self._greeted.set()

    def wait_ready(self, timeout_s: float = 60.0) -> WorkerReport:
        """Until the worker answers the RPC handshake on its address (checked the way the main machine will
        ask); raises ``ServerError`` with its last lines if it exits or does not answer in time."""
        probe_host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

        def handshake() -> WorkerReport | None:
            try:
                return probe_worker(probe_host, self.port, measure=False, timeout_s=2.0)
            except RpcError:
                return None

        report = self._wait_until(
            handshake,
            timeout_s,
            lambda code: ServerError(
                f"rpc-server exited (code {code}) before it was ready. Its last lines:\n" + self.log_tail()
            ),
            lambda: ServerError(
                f"rpc-server did not answer on {self.endpoint} after {timeout_s:.0f} s. Its last lines:\n"
                + self.log_tail()
            ),
        )
        # rpc-server prints its devices with printf into a pipe: they arrive when it flushes, on accepting us
        self._greeted.wait(timeout=10.0)
        return report

    def wait(self) -> int:
        assert self._proc is not None
        return self._proc.wait()

    def stop(self, timeout_s: float = 5.0) -> int | None:
        return super().stop(timeout_s)


def check_worker_host(host: str, trust_network: bool) -> None:
    """UsageError for a worker address that reaches the network (``0.0.0.0``, a LAN address) without
    ``trust_network``: the refusal that used to be a warning."""
    if trust_network or is_loopback_host(host):
        return
    raise UsageError(
        f"Refusing to listen on {host or '0.0.0.0'}: llama.cpp's RPC has no authentication or encryption, and"
        " its server has had memory-corruption bugs that anyone who can connect can reach.",
        "On a network you trust (and ideally behind a firewall that lets in only the main machine), add"
        " --trust-network; else keep the default 127.0.0.1.",
    )


def start_worker(
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    devices: str | None = None,
    threads: int | None = None,
    cache: bool = False,
    binary: Path | None = None,
    on_log: Callable[[str], None] | None = None,
    ready_timeout_s: float = 60.0,
    trust_network: bool = False,
) -> WorkerProcess:
    """Start ``rpc-server`` on ``host:port`` and return once it answers the RPC handshake.

    ``host`` must be a loopback address unless ``trust_network``: ggml's RPC has no authentication and has
    had memory-corruption bugs reachable by anyone who can connect."""
    check_worker_host(host, trust_network)
    binary = binary or find_rpc_server()
    if binary is None:
        raise ServerError(
            "No rpc-server was found (CLOVER_RPC_SERVER, the one scripts/build-llama-server builds, PATH).",
            "Build it with scripts/build-llama-server (it builds rpc-server next to llama-server).",
        )
    if not 0 < port < 65536:
        raise CloverError(f"--port {port} is not a port number (1-65535).")
    if (taken := bind_error(host, port)) is not None:
        raise ServerError(
            f"Cannot listen on {host}:{port}: {taken.strerror}.",
            "Another worker (or program) holds the port: choose another with --port, or name an address of "
            "this machine with --host.",
        )
    worker = WorkerProcess(rpc_server_argv(binary, host, port, devices, threads, cache), host, port, on_log)
    try:
        worker.wait_ready(ready_timeout_s)
    except BaseException:
        worker.stop()
        raise
    return worker


def rpc_spec(devices: Sequence[WorkerDevice], address: str, port: int) -> str:
    """What to give the main machine's ``--rpc``: ``KIND@ADDRESS:PORT`` (KIND from the first device)."""
    kind = devices[0].kind if devices else "unknown"
    return f"{address}:{port}" if kind == "unknown" else f"{kind}@{address}:{port}"
