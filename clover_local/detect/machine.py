"""What a machine is, as the planner sees it: plain frozen values, built by detection or ``--simulate``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from clover_local.detect.ram_read import RamRead
from clover_local.detect.remote import Worker

GpuVendor = Literal["nvidia", "amd", "intel", "apple"]
Backend = Literal["cuda", "metal", "vulkan", "rocm", "sycl", "cpu"]


@dataclass(frozen=True)
class Cpu:
    model: str
    physical_cores: int
    logical_cores: int
    features: tuple[str, ...] = ()
    """Instruction-set extensions that matter to llama.cpp: ``avx2``, ``avx512f``, ``neon``, ``sve``..."""
    arch: str = ""
    """``x86_64``, ``arm64``..."""
    others_busy_cores: float | None = None
    """Cores' worth of CPU other programs used while the machine was probed (``detect.cpu_load``); None when
    not measured (``--simulate`` without ``busy=``)."""
    core_cpus: tuple[int, ...] = ()
    """One logical CPU of each physical core this process may run on (the lowest of its hardware threads), in
    order: what llama-server's threads are bound to (``--cpu-mask``). Empty where the topology is not known
    (macOS, Windows, a described machine)."""


@dataclass(frozen=True)
class Memory:
    total_bytes: int
    available_bytes: int
    ram_read: RamRead | None = None
    """How fast the CPU reads RAM, measured here once (``detect.ram_read``); None when not measured
    (``--simulate``), then the planner assumes a typical machine."""


@dataclass(frozen=True)
class Disk:
    path: str
    """The folder models are stored in (the Hugging Face cache), or its nearest existing parent."""
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Gpu:
    """One GPU. Memory is per GPU and never summed across GPUs."""

    index: int
    vendor: GpuVendor
    name: str
    total_bytes: int
    free_bytes: int
    unified: bool = False
    """Apple Silicon: memory shared with the CPU. ``total_bytes`` is then the Metal working-set limit."""
    bandwidth_bytes_per_s: float | None = None
    """Memory bandwidth when known (NVML clocks, a table of known chips); None: the planner estimates."""
    source: str = ""
    """Where the numbers came from: ``nvml``, ``sysfs``, ``amdsmi``, ``sysctl``, ``simulated``."""
    note: str = ""
    """E.g. how the Apple working-set limit was derived."""


@dataclass(frozen=True)
class ProbeResult:
    """What one probe (NVML, AMD sysfs, ...) found or why it found nothing; shown by ``detect``."""

    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class LlamaBuild:
    """What the installed llama-cpp-python can do."""

    version: str | None
    """llama-cpp-python version, None when it is not importable."""
    gpu_offload: bool
    """``llama_supports_gpu_offload()``."""
    backends: tuple[Backend, ...] = ("cpu",)
    """Backends compiled in (from the ggml backend registry)."""
    system_info: str = ""


@dataclass(frozen=True)
class Machine:
    cpu: Cpu
    memory: Memory
    disk: Disk
    gpus: tuple[Gpu, ...] = ()
    build: LlamaBuild = field(default_factory=lambda: LlamaBuild(version=None, gpu_offload=False))
    os: str = ""
    probes: tuple[ProbeResult, ...] = ()
    hints: tuple[str, ...] = ()
    """Advice for the person, e.g. how to rebuild llama-cpp-python with CUDA for the card it found."""
    simulated: bool = False
    workers: tuple[Worker, ...] = ()
    """Other machines lending devices through llama.cpp's RPC backend (``--rpc``, or ``rpc=`` when simulated)."""

    @property
    def unified_memory(self) -> bool:
        return any(g.unified for g in self.gpus)

    @property
    def offload_backend(self) -> Backend:
        """The backend the plan targets: the build's GPU backend when it has one and a GPU exists, else cpu."""
        if not self.gpus or not self.build.gpu_offload:
            return "cpu"
        return next((b for b in self.build.backends if b != "cpu"), "cpu")
