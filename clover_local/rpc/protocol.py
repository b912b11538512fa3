"""A small client of ggml's RPC protocol (``ggml/src/ggml-rpc/ggml-rpc.cpp``, protocol v7 at the vendored
commit): enough to ask a worker what devices it has and how much memory is free on each, and to measure the
link to it (round-trip time, and bandwidth by writing and reading back a scratch buffer on its first device).

Wire format: a request is ``cmd (1 byte) | size (u64) | payload``; a response is ``size (u64) | payload``. The
first command of a connection must be HELLO. A worker serves one client at a time: while a llama-server is
connected, a probe waits in the queue and times out (reported as "busy").
"""

from __future__ import annotations

import socket
import struct
import time
from contextlib import closing
from dataclasses import dataclass

from clover_local.errors import CloverError

PROTO_MAJOR = 7
"""``RPC_PROTO_MAJOR_VERSION`` in ``ggml-rpc.h``: a worker must speak the same major version."""
CONN_CAPS_SIZE = 24
"""``RPC_CONN_CAPS_SIZE`` (transport capabilities; all zero = plain TCP)."""

CMD_ALLOC_BUFFER = 0
CMD_BUFFER_GET_BASE = 3
CMD_FREE_BUFFER = 4
CMD_SET_TENSOR = 6
CMD_GET_TENSOR = 8
CMD_GET_DEVICE_MEMORY = 11
CMD_HELLO = 14
CMD_DEVICE_COUNT = 15

GGML_TYPE_I8 = 24
_TENSOR = struct.Struct("<QIQ4I4II16iI10QQQQ64si")
"""``rpc_tensor`` (packed): id, type, buffer, ne[4], nb[4], op, op_params[16], flags, src[10], view_src,
view_offs, data, name[64], use_count; 296 bytes."""
assert _TENSOR.size == 296

DEFAULT_TIMEOUT_S = 5.0
LINK_SAMPLE_BYTES = 8 * 1024 * 1024
"""Bytes written to and read from the worker to measure bandwidth (a scratch buffer, freed at once)."""
MAX_WORKER_DEVICES = 64
"""Most devices one worker may report (ggml's RPC server lends the devices of one machine)."""


class RpcError(CloverError):
    """A worker could not be reached or answered something unexpected."""


@dataclass(frozen=True)
class DeviceReport:
    """One device of a worker, as the worker reports it."""

    index: int
    free_bytes: int
    total_bytes: int


@dataclass(frozen=True)
class LinkMeasure:
    rtt_s: float
    """Median round trip of a small request."""
    send_bytes_per_s: float
    """Main machine -> worker (weights at load, activations per token)."""
    recv_bytes_per_s: float
    """Worker -> main machine."""


@dataclass(frozen=True)
class WorkerReport:
    endpoint: str
    version: tuple[int, int, int]
    devices: tuple[DeviceReport, ...]
    link: LinkMeasure | None


class RpcClient:
    """One connection to a worker (``close`` it); every call raises :class:`RpcError`."""

    def __init__(self, host: str, port: int, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.endpoint = f"{host}:{port}"
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_s)
        except OSError as exc:
            raise RpcError(
                f"Cannot reach the worker at {self.endpoint}: {exc.strerror or exc}.",
                "Start it there with `clover-local worker --host ADDRESS` and check the address, the port and "
                "any firewall between the machines.",
            ) from None
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.version = self._hello()

    def close(self) -> None:
        self._sock.close()

    # --- commands --------------------------------------------------------------------------------------

    def device_count(self) -> int:
        """How many devices the worker lends; :class:`RpcError` past :data:`MAX_WORKER_DEVICES` (a hostile or
        broken worker may say 2^32, and each device is then asked about in turn)."""
        (count,) = struct.unpack("<I", self._call(CMD_DEVICE_COUNT, b"", 4))
        if count > MAX_WORKER_DEVICES:
            raise RpcError(
                f"The worker at {self.endpoint} says it has {count} devices; no rpc-server lends more than"
                f" {MAX_WORKER_DEVICES}.",
                "It is not a clover-local worker (or is broken): check the address and port.",
            )
        return int(count)

    def device_memory(self, device: int) -> tuple[int, int]:
        """(free, total) bytes of one device."""
        free, total = struct.unpack("<QQ", self._call(CMD_GET_DEVICE_MEMORY, struct.pack("<I", device), 16))
        return int(free), int(total)

    def measure_link(self, device: int = 0, n_bytes: int = LINK_SAMPLE_BYTES, rounds: int = 3) -> LinkMeasure:
        """Round trip and bandwidth both ways, through a scratch buffer on ``device`` (freed afterwards)."""
        rtts = []
        for _ in range(5):
            t0 = time.perf_counter()
            self.device_memory(device)
            rtts.append(time.perf_counter() - t0)
        rtt = sorted(rtts)[len(rtts) // 2]
        buffer, size = struct.unpack(
            "<QQ", self._call(CMD_ALLOC_BUFFER, struct.pack("<IQ", device, n_bytes), 16)
        )
        if not buffer or size < n_bytes:
            raise RpcError(
                f"The worker at {self.endpoint} could not lend {n_bytes} bytes to measure the link."
            )
        try:
            (base,) = struct.unpack("<Q", self._call(CMD_BUFFER_GET_BASE, struct.pack("<Q", buffer), 8))
            tensor = _tensor(buffer, base, n_bytes)
            payload = tensor + struct.pack("<BQ", 0, 0) + bytes(n_bytes)
            sends, recvs = [], []
            for _ in range(rounds):
                t0 = time.perf_counter()
                self._send(CMD_SET_TENSOR, payload)
                self._get(tensor, 1)  # SET_TENSOR has no answer: a 1-byte read waits until it is done
                sends.append(time.perf_counter() - t0 - rtt)
                t0 = time.perf_counter()
                self._get(tensor, n_bytes)
                recvs.append(time.perf_counter() - t0)
        finally:
            self._send(CMD_FREE_BUFFER, struct.pack("<Q", buffer))
        return LinkMeasure(
            rtt_s=rtt,
            send_bytes_per_s=n_bytes / max(min(sends), 1e-6),
            recv_bytes_per_s=n_bytes / max(min(recvs), 1e-6),
        )

    # --- wire ------------------------------------------------------------------------------------------

    def _hello(self) -> tuple[int, int, int]:
        major, minor, patch, _ = struct.unpack_from(
            "<BBBB", self._call(CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
        )
        if major != PROTO_MAJOR:
            raise RpcError(
                f"The worker at {self.endpoint} speaks RPC protocol {major}.{minor}.{patch}; this clover-local's "
                f"llama.cpp speaks {PROTO_MAJOR}.x.",
                "Build the worker's rpc-server and this machine's llama-server from the same llama.cpp "
                "(scripts/build-llama-server on both).",
            )
        return major, minor, patch

    def _get(self, tensor: bytes, n_bytes: int) -> bytes:
        return self._call(CMD_GET_TENSOR, tensor + struct.pack("<QQ", 0, n_bytes), n_bytes)

    def _send(self, cmd: int, payload: bytes) -> None:
        try:
            self._sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
        except OSError as exc:
            raise self._lost(exc) from None

    def _call(self, cmd: int, payload: bytes, expect: int) -> bytes:
        self._send(cmd, payload)
        (size,) = struct.unpack("<Q", self._recv(8))
        if size != expect:
            raise RpcError(
                f"The worker at {self.endpoint} answered command {cmd} with {size} bytes, not {expect}: it does "
                "not look like a llama.cpp rpc-server of this version."
            )
        return self._recv(size)

    def _recv(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self._sock.recv(min(n - len(out), 1 << 20))
            except TimeoutError:
                raise RpcError(
                    f"The worker at {self.endpoint} did not answer in time.",
                    "A worker serves one main machine at a time: is a llama-server already connected to it?",
                ) from None
            except OSError as exc:
                raise self._lost(exc) from None
            if not chunk:
                raise RpcError(
                    f"The worker at {self.endpoint} closed the connection.",
                    "Is it a llama.cpp rpc-server (`clover-local worker`) of the same version as this machine's?",
                )
            out += chunk
        return bytes(out)

    def _lost(self, exc: OSError) -> RpcError:
        return RpcError(f"The connection to the worker at {self.endpoint} failed: {exc.strerror or exc}.")


def _tensor(buffer: int, base: int, n_bytes: int) -> bytes:
    """An ``rpc_tensor`` of ``n_bytes`` int8 values covering the scratch buffer."""
    return _TENSOR.pack(
        1, GGML_TYPE_I8, buffer, n_bytes, 1, 1, 1, 1, n_bytes, n_bytes, n_bytes,
        0, *([0] * 16), 0, *([0] * 10), 0, 0, base, b"clover-link-probe", 0,
    )  # fmt: skip


def probe_worker(
    host: str, port: int, *, measure: bool = True, timeout_s: float = DEFAULT_TIMEOUT_S
) -> WorkerReport:
    """Devices and free memory of the worker at ``host:port`` and, with ``measure``, the link to it."""
    with closing(RpcClient(host, port, timeout_s)) as client:
        count = client.device_count()
        devices = tuple(DeviceReport(i, *client.device_memory(i)) for i in range(count))
        link = client.measure_link(0) if measure and count else None
        return WorkerReport(client.endpoint, client.version, devices, link)
