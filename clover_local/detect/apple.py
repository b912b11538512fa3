"""Apple Silicon: unified memory and the Metal working-set limit, from ``sysctl``.

On Apple Silicon the GPU shares RAM with the CPU, but Metal lets one process keep only part of it resident
(``MTLDevice.recommendedMaxWorkingSetSize``): about 2/3 of RAM on machines with up to 36 GiB and 3/4 above.
``sysctl iogpu.wired_limit_mb`` (macOS 14+, set by the person) overrides that rule. The same function serves
the real probe and ``--simulate unified=...``, so both plan against the same limit.
"""

from __future__ import annotations

from collections.abc import Callable

from clover_local.detect.machine import Gpu, ProbeResult
from clover_local.detect.units import GIB, format_bytes

RunSysctl = Callable[[str], str | None]
"""Returns the value of one sysctl key (``sysctl -n KEY``), or None when the key does not exist."""

SMALL_MAC_LIMIT_BYTES = 36 * GIB
"""Up to this much RAM Metal's working set is about 2/3 of RAM; above it about 3/4."""


def metal_working_set(ram_bytes: int, wired_limit_mb: int | None = None) -> tuple[int, str]:
    """The bytes the GPU may use on a Mac with ``ram_bytes`` of unified memory, and which rule gave them."""
    if wired_limit_mb:
        limit = wired_limit_mb * 1024**2
        return limit, f"iogpu.wired_limit_mb={wired_limit_mb} set: GPU may wire {format_bytes(limit)}"
    if ram_bytes <= SMALL_MAC_LIMIT_BYTES:
        limit = ram_bytes * 2 // 3
        rule = "2/3 of RAM (Metal working-set rule for Macs with up to 36 GiB)"
    else:
        limit = ram_bytes * 3 // 4
        rule = "3/4 of RAM (Metal working-set rule for Macs with more than 36 GiB)"
    return limit, f"{format_bytes(limit)} = {rule}; raise it with sudo sysctl iogpu.wired_limit_mb=N"


_CHIP_BANDWIDTH_GBS: dict[str, float] = {
    "M1": 68.25, "M1 Pro": 200, "M1 Max": 400, "M1 Ultra": 800,
    "M2": 100, "M2 Pro": 200, "M2 Max": 400, "M2 Ultra": 800,
    "M3": 100, "M3 Pro": 150, "M3 Max": 400, "M3 Ultra": 819,
    "M4": 120, "M4 Pro": 273, "M4 Max": 546,
}  # fmt: skip
"""Apple's published unified-memory bandwidth per chip, GB/s."""
_BINNED_MAX_GBS = {"M3 Max": 300.0, "M4 Max": 410.0}
"""The cut-down M3/M4 Max (sold only with 36 GiB) has a narrower memory bus."""


def chip_bandwidth(brand: str, ram_bytes: int) -> float | None:
    """Bytes/s of a known Apple chip (``Apple M2 Max``), None for an unknown one (the planner estimates)."""
    chip = brand.removeprefix("Apple").strip()
    if chip in _BINNED_MAX_GBS and ram_bytes <= SMALL_MAC_LIMIT_BYTES:
        return _BINNED_MAX_GBS[chip] * 1e9
    gbs = _CHIP_BANDWIDTH_GBS.get(chip)
    return gbs * 1e9 if gbs else None


def apple_gpu(ram_bytes: int, name: str, wired_limit_mb: int | None, source: str) -> Gpu:
    """The one unified-memory GPU of an Apple Silicon Mac; free = total (the working-set limit)."""
    limit, note = metal_working_set(ram_bytes, wired_limit_mb)
    bandwidth = chip_bandwidth(name, ram_bytes)
    if bandwidth:
        note += f"; {bandwidth / 1e9:.0f} GB/s memory bandwidth (Apple's figure for the {name})"
    return Gpu(
        index=0,
        vendor="apple",
        name=name,
        total_bytes=limit,
        free_bytes=limit,
        unified=True,
        bandwidth_bytes_per_s=bandwidth,
        source=source,
        note=note,
    )


def probe_apple(run_sysctl: RunSysctl, machine: str) -> tuple[list[Gpu], ProbeResult]:
    """Apple Silicon GPU from sysctl values; ``machine`` is ``platform.machine()`` (``arm64`` on Apple Silicon)."""
    if machine not in ("arm64", "aarch64"):
        return [], ProbeResult("apple", False, f"not Apple Silicon (machine is {machine or 'unknown'})")
    memsize = run_sysctl("hw.memsize")
    if not memsize or not memsize.strip().isdigit():
        return [], ProbeResult("apple", False, "sysctl hw.memsize gave no value")
    ram = int(memsize.strip())
    brand = (run_sysctl("machdep.cpu.brand_string") or "Apple Silicon").strip()
    wired_text = (run_sysctl("iogpu.wired_limit_mb") or "").strip()
    wired = int(wired_text) if wired_text.isdigit() and int(wired_text) > 0 else None
    gpu = apple_gpu(ram, brand, wired, source="sysctl")
    return [gpu], ProbeResult("apple", True, f"{brand}: {format_bytes(ram)} unified; {gpu.note}")
