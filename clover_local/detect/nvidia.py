"""NVIDIA GPUs through NVML (the ``pynvml`` module of nvidia-ml-py): name, total and free memory per GPU,
and memory bandwidth from bus width and maximum memory clock when NVML reports them."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from clover_local.detect.machine import Gpu, ProbeResult
from clover_local.detect.units import format_bytes


def load_nvml() -> ModuleType | None:
    """The ``pynvml`` module, or None when nvidia-ml-py is not installed."""
    try:
        import pynvml
    except ImportError:
        return None
    module: ModuleType = pynvml
    return module


def probe_nvidia(nvml: ModuleType | Any | None) -> tuple[list[Gpu], ProbeResult]:
    """Every NVIDIA GPU NVML sees, each with its own total and free memory (never summed)."""
    if nvml is None:
        return [], ProbeResult(
            "nvidia", False, "nvidia-ml-py (pynvml) is not installed: no NVIDIA GPU probed"
        )
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded...: no NVIDIA driver here
        return [], ProbeResult("nvidia", False, f"NVML unavailable (no NVIDIA driver?): {exc}")
    try:
        gpus = [_gpu(nvml, i) for i in range(nvml.nvmlDeviceGetCount())]
    finally:
        nvml.nvmlShutdown()
    if not gpus:
        return [], ProbeResult("nvidia", False, "NVML loaded but reports no GPU")
    found = "; ".join(
        f"{g.index}: {g.name} {format_bytes(g.free_bytes)} free / {format_bytes(g.total_bytes)}" for g in gpus
    )
    return gpus, ProbeResult("nvidia", True, f"{len(gpus)} GPU(s) via NVML: {found}")


def _gpu(nvml: Any, index: int) -> Gpu:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    name = nvml.nvmlDeviceGetName(handle)
    if isinstance(name, bytes):  # older nvidia-ml-py returns bytes
        name = name.decode(errors="replace")
    mem = nvml.nvmlDeviceGetMemoryInfo(handle)
    return Gpu(
        index=index,
        vendor="nvidia",
        name=str(name),
        total_bytes=int(mem.total),
        free_bytes=int(mem.free),
        bandwidth_bytes_per_s=_bandwidth(nvml, handle),
        source="nvml",
    )


def _bandwidth(nvml: Any, handle: Any) -> float | None:
    """Peak memory bandwidth: bus width (bits) / 8 x max memory clock x 2 (NVML reports the DDR base clock).

    E.g. RTX 4090: 384-bit, 10501 MHz -> 1008 GB/s; H100 SXM: 5120-bit, 2619 MHz -> 3.35 TB/s.
    None when this NVML or GPU does not report both.
    """
    try:
        bus_bits = int(nvml.nvmlDeviceGetMemoryBusWidth(handle))
        clock_mhz = int(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_MEM))
    except Exception:  # NVMLError_NotSupported, or an old NVML without the call
        return None
    if bus_bits <= 0 or clock_mhz <= 0:
        return None
    return bus_bits / 8 * clock_mhz * 1e6 * 2


def cuda_driver_version(nvml: ModuleType | Any | None) -> tuple[int, int] | None:
    """The newest CUDA version the NVIDIA driver supports (``(13, 0)``), which decides whether a CUDA 13 build
    of llama.cpp can run here; None without NVML or a driver."""
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except Exception:  # no driver
        return None
    try:
        version = int(nvml.nvmlSystemGetCudaDriverVersion())  # e.g. 12040 for 12.4
    except Exception:  # an NVML too old for the call
        return None
    finally:
        nvml.nvmlShutdown()
    return (version // 1000, (version % 1000) // 10) if version > 0 else None
