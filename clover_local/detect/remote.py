"""Other machines lending their devices through llama.cpp's RPC backend (``rpc-server``): plain frozen values,
from a probe of each worker (``clover_local.rpc.protocol``) or described with ``--simulate ...,rpc=...``.

Names follow llama.cpp: the RPC backend numbers the devices of all workers ``RPC0``, ``RPC1``... in ``--rpc``
order (``ggml_backend_rpc_add_server``), and places them before local GPUs. A device is shown as
``host:port/RPCn``.

Specs read here:

- ``--rpc [KIND@]HOST:PORT,...``: workers to probe; KIND says what the worker lends, which the protocol does not
  tell (``cpu``, ``gpu:nvidia``, ``gpu:amd``, ``gpu:intel``, ``gpu:apple``; default ``unknown``, planned at
  CPU memory speed). ``clover-local worker`` prints the right one.
- ``--simulate ...,rpc=KIND:SIZE@HOST:PORT``: a described worker device (``cpu:32G`` or ``gpu:nvidia:12G``);
  repeat the part for several devices or workers.
- ``--link BANDWIDTH[/RTT]`` / ``link=...``: the network, e.g. ``1Gbit``, ``10Gbit/0.1ms``, ``300MB/s/0.5ms``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from clover_local.detect.units import parse_size
from clover_local.errors import UsageError

DeviceKind = str
"""``cpu``, ``nvidia``, ``amd``, ``intel``, ``apple`` or ``unknown``."""
KINDS = ("cpu", "nvidia", "amd", "intel", "apple", "unknown")
DEFAULT_PORT = 50052
"""rpc-server's default port (``tools/rpc/rpc-server.cpp``)."""


@dataclass(frozen=True)
class Link:
    """The network between the main machine and one worker."""

    bandwidth_bytes_per_s: float
    rtt_s: float
    """Round-trip time of one small request."""
    source: str
    """``measured``, ``given with --link``, or the assumption made."""


ASSUMED_LINK = Link(117e6, 0.0005, "assumed: 1 Gbit/s Ethernet, 0.5 ms round trip")
"""When nothing measured or described it: gigabit Ethernet's payload rate and a typical LAN round trip."""


@dataclass(frozen=True)
class RemoteDevice:
    endpoint: str
    """``host:port`` of the worker."""
    index: int
    """The device's index on its worker."""
    name: str
    """llama.cpp's name for it on the main machine: ``RPC0``, ``RPC1``... across all workers in order."""
    kind: DeviceKind
    free_bytes: int
    total_bytes: int

    @property
    def label(self) -> str:
        return f"{self.endpoint}/{self.name}"


@dataclass(frozen=True)
class Worker:
    endpoint: str
    devices: tuple[RemoteDevice, ...]
    link: Link
    source: str = ""
    """``probed`` or ``simulated``."""


@dataclass(frozen=True)
class WorkerSpec:
    """One ``--rpc`` entry before it is probed."""

    host: str
    port: int
    kind: DeviceKind = "unknown"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


RPC_FORMS = (
    "HOST:PORT or KIND@HOST:PORT, comma-separated; KIND cpu, gpu:nvidia, gpu:amd, gpu:intel or gpu:apple"
)
_HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.\-]*$")


def parse_endpoint(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port). IPv6 literals are refused: llama.cpp splits the endpoint at its first colon."""
    host, sep, port_text = text.strip().partition(":")
    if not sep or not _HOST_RE.match(host) or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(
            f"{what}: {text.strip()!r} is not HOST:PORT.",
            f"Give the worker's address and port, e.g. 192.168.1.20:{DEFAULT_PORT} (IPv4 or a host name).",
        )
    return host, int(port_text)


def parse_kind(text: str, what: str) -> DeviceKind:
    """``cpu`` / ``gpu:VENDOR`` (or a bare vendor) -> a :data:`DeviceKind`."""
    value = text.strip().lower()
    if value.startswith("gpu:"):
        value = value[4:]
    if value not in KINDS or (value == "unknown" and text.strip().lower() != "unknown"):
        raise UsageError(f"{what}: unknown device kind {text.strip()!r}.", f"Accepted: {RPC_FORMS}.")
    return value


def parse_rpc(text: str) -> tuple[WorkerSpec, ...]:
    """``--rpc`` -> the workers in order; duplicates refused (llama.cpp would silently use one)."""
    specs: list[WorkerSpec] = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        kind_text, at, endpoint = part.rpartition("@")
        kind = parse_kind(kind_text, "--rpc") if at else "unknown"
        host, port = parse_endpoint(endpoint, "--rpc")
        spec = WorkerSpec(host, port, kind)
        if any(s.endpoint == spec.endpoint for s in specs):
            raise UsageError(f"--rpc names {spec.endpoint} twice.", "List each worker once.")
        specs.append(spec)
    if not specs:
        raise UsageError("--rpc names no worker.", f"Accepted: {RPC_FORMS}.")
    return tuple(specs)


_LINK_RE = re.compile(
    r"^\s*(?P<bw>\d+(?:\.\d+)?)\s*(?P<unit>gbit|mbit|gb/s|mb/s|gbps|mbps)"
    r"(?:\s*/\s*(?P<rtt>\d+(?:\.\d+)?)\s*(?P<rtt_unit>ms|us))?\s*$",
    re.IGNORECASE,
)
_LINK_UNITS = {"gbit": 1e9 / 8, "gbps": 1e9 / 8, "mbit": 1e6 / 8, "mbps": 1e6 / 8, "gb/s": 1e9, "mb/s": 1e6}
ETHERNET_EFFICIENCY = 0.94
"""TCP payload share of an Ethernet link's line rate (headers and framing)."""


def parse_link(text: str, what: str = "--link") -> Link:
    """``1Gbit``, ``10Gbit/0.1ms``, ``300MB/s/0.5ms`` -> a :class:`Link` (bit rates lose framing overhead;
    without a round trip, 0.5 ms is assumed)."""
    m = _LINK_RE.match(text)
    if not m:
        raise UsageError(
            f"{what}: {text.strip()!r} is not a link like 1Gbit, 10Gbit/0.1ms or 300MB/s/0.5ms.",
            "Give the bandwidth (Gbit, Mbit, GB/s, MB/s) and optionally the round-trip time after a slash.",
        )
    unit = m.group("unit").lower()
    bandwidth = (
        float(m.group("bw"))
        * _LINK_UNITS[unit]
        * (ETHERNET_EFFICIENCY if "bit" in unit or "ps" in unit else 1)
    )
    rtt = ASSUMED_LINK.rtt_s
    if m.group("rtt"):
        rtt = float(m.group("rtt")) * (1e-3 if m.group("rtt_unit").lower() == "ms" else 1e-6)
    if bandwidth <= 0 or rtt <= 0:
        raise UsageError(f"{what}: {text.strip()!r}: bandwidth and round trip must be positive.")
    return Link(bandwidth, rtt, f"given with {what} {text.strip()}")


def parse_simulated_device(value: str) -> tuple[DeviceKind, int, WorkerSpec]:
    """``gpu:nvidia:12G@host:port`` or ``cpu:32G@host:port`` -> (kind, bytes, worker)."""
    described, at, endpoint = value.rpartition("@")
    if not at:
        raise UsageError(
            f"--simulate: bad part 'rpc={value}': expected rpc=KIND:SIZE@HOST:PORT.",
            "e.g. rpc=gpu:nvidia:12G@192.168.1.20:50052 or rpc=cpu:32G@192.168.1.21:50052",
        )
    kind_text, _, size_text = described.rpartition(":")
    kind = parse_kind(kind_text, f"--simulate rpc={value}")
    size = parse_size(size_text)
    if size is None or size <= 0:
        raise UsageError(f"--simulate: bad part 'rpc={value}': {size_text!r} is not a memory size like 12G.")
    host, port = parse_endpoint(endpoint, f"--simulate rpc={value}")
    return kind, size, WorkerSpec(host, port, kind)


def number_devices(
    workers: list[tuple[WorkerSpec, list[tuple[DeviceKind, int, int]]]], links: dict[str, Link], source: str
) -> tuple[Worker, ...]:
    """Workers with their devices named as llama.cpp names them (``RPC0``... in order); ``(kind, free, total)``
    per device, the link per endpoint (else :data:`ASSUMED_LINK`)."""
    out: list[Worker] = []
    n = 0
    for spec, devices in workers:
        named = []
        for i, (kind, free, total) in enumerate(devices):
            named.append(RemoteDevice(spec.endpoint, i, f"RPC{n}", kind, free, total))
            n += 1
        out.append(Worker(spec.endpoint, tuple(named), links.get(spec.endpoint, ASSUMED_LINK), source))
    return tuple(out)
