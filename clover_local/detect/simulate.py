"""``--simulate``: describe a machine in one line instead of detecting it ("what would it do on X?").

Spec: comma-separated ``key=value`` parts, e.g. ``ram=32G,gpu=nvidia:12G,gpu=nvidia:24G,cpu=16``.

- ``ram=SIZE``       system RAM (default 16G)
- ``gpu=VENDOR:SIZE[@BANDWIDTH]`` a discrete GPU, repeat for several; VENDOR is nvidia, amd or intel;
  BANDWIDTH its memory bandwidth (``@4.8TB/s``, ``@936GB/s``; default: a typical card of that size)
- ``unified=SIZE``   Apple Silicon with SIZE of unified memory: RAM = SIZE and one ``apple`` GPU whose memory
  is the Metal working-set limit (:func:`clover_local.detect.apple.metal_working_set`, the real probe's rule)
- ``cpu=N``          CPU cores (default 8)
- ``busy=N``         cores' worth of CPU other programs use (default: not measured, taken as idle)
- ``disk=SIZE``      free disk where models are stored (default 500G)
- ``rpc=KIND:SIZE@HOST:PORT`` a device lent by another machine through llama.cpp's RPC backend, repeatable
  (``gpu:nvidia:12G@192.168.1.20:50052``, ``cpu:32G@192.168.1.21:50052``); ``link=1Gbit[/0.5ms]`` the network
  to every worker (default: gigabit Ethernet). See ``clover_local.detect.remote``.
- ``backend=NAME``   the llama.cpp build: cuda, metal, vulkan, rocm, sycl or cpu (default: from the GPUs,
  nvidia -> cuda, amd -> rocm, intel -> vulkan, apple -> metal, none -> cpu)

Sizes are binary: ``K``/``M``/``G``/``T`` (``G`` = GiB; ``GB``/``GiB`` suffixes are accepted), or plain bytes.
A simulated GPU is idle (free = total). Available RAM is total minus what the OS and desktop typically hold:
10% of RAM, at least 1.5 GiB.
"""

from __future__ import annotations

from typing import NoReturn, get_args

from clover_local.detect.apple import apple_gpu
from clover_local.detect.hints import PINNED_VERSION, build_hints
from clover_local.detect.machine import (
    Backend,
    Cpu,
    Disk,
    Gpu,
    GpuVendor,
    LlamaBuild,
    Machine,
    Memory,
    ProbeResult,
)
from clover_local.detect.remote import Worker, WorkerSpec, number_devices, parse_link, parse_simulated_device
from clover_local.detect.units import GIB, format_bytes, parse_bandwidth, parse_size
from clover_local.errors import UsageError

DEFAULT_RAM_BYTES = 16 * GIB
DEFAULT_CORES = 8
DEFAULT_DISK_BYTES = 500 * GIB

ACCEPTED_FORMS = (
    "ram=32G, gpu=nvidia:12G or gpu=nvidia:12G@936GB/s (repeatable; vendor nvidia|amd|intel; optional "
    "memory bandwidth in GB/s or TB/s), unified=64G (Apple Silicon), "
    "cpu=16, busy=1 (other programs' cores), disk=500G, backend=cuda|metal|vulkan|rocm|sycl|cpu, "
    "rpc=gpu:nvidia:12G@HOST:PORT (repeatable), "
    "link=1Gbit/0.5ms; sizes in K/M/G/T (binary) or bytes, "
    "parts separated by commas"
)
_DISCRETE_VENDORS: tuple[GpuVendor, ...] = ("nvidia", "amd", "intel")
_DEFAULT_BACKEND: dict[GpuVendor, Backend] = {
    "nvidia": "cuda",
    "amd": "rocm",
    "intel": "vulkan",
    "apple": "metal",
}
_SINGLE_KEYS = ("ram", "unified", "cpu", "busy", "disk", "backend", "link")


def _busy(singles: dict[str, str]) -> float | None:
    if "busy" not in singles:
        return None
    try:
        busy = float(singles["busy"])
    except ValueError:
        _bad(f"busy={singles['busy']}", "give the busy cores as a number, e.g. busy=1 or busy=0.5")
    if busy < 0:
        _bad(f"busy={singles['busy']}", "busy cores cannot be negative")
    return busy


def os_reserved_bytes(total_ram_bytes: int) -> int:
    """RAM a simulated OS and desktop keep for themselves: 10% of RAM, at least 1.5 GiB."""
    return max(total_ram_bytes // 10, 3 * GIB // 2)


def parse_simulate(spec: str) -> Machine:
    """Build the :class:`Machine` that ``spec`` describes; raises ``UsageError`` naming the bad part."""
    singles: dict[str, str] = {}
    gpu_specs: list[str] = []
    rpc_specs: list[str] = []
    for raw in spec.split(","):
        part = raw.strip()
        if not part:
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip().lower(), value.strip()
        if not sep or not value:
            _bad(part, "expected key=value")
        if key == "gpu":
            gpu_specs.append(value)
        elif key == "rpc":
            rpc_specs.append(value)
        elif key in _SINGLE_KEYS:
            if key in singles:
                _bad(part, f"{key}= given twice")
            singles[key] = value
        else:
            _bad(part, f"unknown key {key!r}")

    gpus: list[Gpu] = [_parse_gpu(index, value) for index, value in enumerate(gpu_specs)]
    ram = _size(singles, "ram", DEFAULT_RAM_BYTES)
    if "unified" in singles:
        unified = _size(singles, "unified", 0)
        if gpus:
            _bad(f"unified={singles['unified']}", "Apple Silicon has no discrete GPUs; drop the gpu= parts")
        if "ram" in singles and ram != unified:
            _bad(f"ram={singles['ram']}", "unified= already sets RAM; give one or make them equal")
        ram = unified
        gpus.append(
            apple_gpu(unified, f"Simulated Apple Silicon ({format_bytes(unified)})", None, "simulated")
        )

    cores = _count(singles, "cpu", DEFAULT_CORES)
    disk = _size(singles, "disk", DEFAULT_DISK_BYTES)
    build = _build(singles.get("backend"), gpus)
    apple = any(g.vendor == "apple" for g in gpus)
    gpu_tuple = tuple(gpus)
    return Machine(
        cpu=Cpu(
            model="Simulated CPU",
            physical_cores=cores,
            logical_cores=cores,
            features=("neon",) if apple else ("avx2", "f16c", "fma"),
            arch="arm64" if apple else "x86_64",
            others_busy_cores=_busy(singles),
        ),
        memory=Memory(total_bytes=ram, available_bytes=max(ram - os_reserved_bytes(ram), 0)),
        disk=Disk(path="(simulated)", total_bytes=disk, free_bytes=disk),
        gpus=gpu_tuple,
        build=build,
        os="darwin" if apple else "linux",
        probes=(ProbeResult("simulate", True, f"described by --simulate {spec!r}"),),
        hints=build_hints(gpu_tuple, build),
        simulated=True,
        workers=simulated_workers(rpc_specs, singles.get("link")),
    )


def simulated_workers(rpc_specs: list[str], link_text: str | None) -> tuple[Worker, ...]:
    """The ``rpc=`` parts grouped by worker (in order of first mention), each device free = total."""
    link = parse_link(link_text, "--simulate link=") if link_text else None
    if link is not None and not rpc_specs:
        _bad(f"link={link_text}", "link= describes the network to rpc= workers; add an rpc= part")
    grouped: dict[str, tuple[WorkerSpec, list[tuple[str, int, int]]]] = {}
    for value in rpc_specs:
        kind, size, spec = parse_simulated_device(value)
        grouped.setdefault(spec.endpoint, (spec, []))[1].append((kind, size, size))
    links = {endpoint: link for endpoint in grouped} if link is not None else {}
    return number_devices(list(grouped.values()), links, "simulated")


def _parse_gpu(index: int, value: str) -> Gpu:
    card, at, bandwidth_text = value.partition("@")
    bandwidth = parse_bandwidth(bandwidth_text) if at else None
    if at and bandwidth is None:
        _bad(f"gpu={value}", f"{bandwidth_text.strip()!r} is not a memory bandwidth like 936GB/s or 4.8TB/s")
    vendor, sep, size_text = card.partition(":")
    vendor = vendor.strip().lower()
    if not sep or vendor not in _DISCRETE_VENDORS:
        _bad(
            f"gpu={value}", "expected gpu=VENDOR:SIZE with VENDOR nvidia, amd or intel (Apple: unified=SIZE)"
        )
    size = parse_size(size_text)
    if size is None or size <= 0:
        _bad(f"gpu={value}", f"{size_text.strip()!r} is not a memory size like 12G")
    label = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel"}[vendor]
    return Gpu(
        index=index,
        vendor=vendor,  # checked against _DISCRETE_VENDORS above
        name=f"Simulated {label} GPU ({format_bytes(size)})",
        total_bytes=size,
        free_bytes=size,
        bandwidth_bytes_per_s=bandwidth,
        source="simulated",
    )


def _build(backend_text: str | None, gpus: list[Gpu]) -> LlamaBuild:
    if backend_text is None:
        backend: Backend = _DEFAULT_BACKEND[gpus[0].vendor] if gpus else "cpu"
    else:
        name = backend_text.lower()
        if name not in get_args(Backend):
            _bad(f"backend={backend_text}", f"backend must be one of {', '.join(get_args(Backend))}")
        backend = name  # type: ignore[assignment]  # checked against Backend above
    backends: tuple[Backend, ...] = ("cpu",) if backend == "cpu" else (backend, "cpu")
    return LlamaBuild(
        version=PINNED_VERSION,
        gpu_offload=backend != "cpu",
        backends=backends,
        system_info=f"simulated {backend} build",
    )


def _size(singles: dict[str, str], key: str, default: int) -> int:
    if key not in singles:
        return default
    size = parse_size(singles[key])
    if size is None or size <= 0:
        _bad(f"{key}={singles[key]}", f"{singles[key]!r} is not a size like 32G")
    return size


def _count(singles: dict[str, str], key: str, default: int) -> int:
    if key not in singles:
        return default
    text = singles[key]
    if not text.isdigit() or int(text) < 1:
        _bad(f"{key}={text}", f"{text!r} is not a whole number of cores like 16")
    return int(text)


def _bad(part: str, why: str) -> NoReturn:
    raise UsageError(f"--simulate: bad part {part!r}: {why}", f"accepted forms: {ACCEPTED_FORMS}")
