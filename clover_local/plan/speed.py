"""Predicted decode speed from memory bandwidth: generating a token reads every active byte once.

An estimate, not a measurement: bytes read per token on each device divided by that device's bandwidth, the
times summed (layers run one after another), scaled by an efficiency llama.cpp typically reaches on MoE decode.
"""

from __future__ import annotations

from collections.abc import Sequence

from clover_local.detect.machine import Gpu, Machine

GB = 1e9
DEFAULT_RAM_BANDWIDTH = 50 * GB
"""Desktop dual-channel DDR4/DDR5, conservatively."""
BANDWIDTH_EFFICIENCY = 0.7
"""Share of the peak bandwidth llama.cpp reaches while decoding."""

# (max memory in GiB, bandwidth in GB/s) by vendor: a typical card of that size, conservatively.
_DISCRETE_TABLE: dict[str, tuple[tuple[float, float], ...]] = {
    "nvidia": ((8, 300), (12, 360), (16, 450), (24, 900), (48, 800), (1e9, 2000)),
    "amd": ((8, 256), (16, 500), (24, 900), (1e9, 1600)),
    "intel": ((8, 224), (1e9, 450)),
}
# Apple Silicon by unified memory: base / Pro / Max / Ultra chips.
_APPLE_TABLE: tuple[tuple[float, float], ...] = ((24, 100), (48, 200), (96, 300), (1e9, 400))


def _lookup(table: Sequence[tuple[float, float]], total_bytes: int) -> float:
    gib = total_bytes / 1024**3
    for limit, gbs in table:
        if gib <= limit + 0.5:
            return gbs * GB
    return table[-1][1] * GB


def gpu_bandwidth(gpu: Gpu, ram_bytes: int) -> tuple[float, str]:
    """Bytes per second of one GPU's memory, and where the figure came from."""
    if gpu.bandwidth_bytes_per_s:
        return gpu.bandwidth_bytes_per_s, "reported"
    if gpu.vendor == "apple":
        return _lookup(_APPLE_TABLE, ram_bytes), "typical Apple chip with this much memory"
    table = _DISCRETE_TABLE.get(gpu.vendor, _DISCRETE_TABLE["intel"])
    return _lookup(table, gpu.total_bytes), f"typical {gpu.vendor} card of this size"


def ram_bandwidth(machine: Machine) -> float:
    """System RAM bandwidth; on Apple Silicon the CPU reads the same unified memory as the GPU."""
    for gpu in machine.gpus:
        if gpu.unified:
            return gpu_bandwidth(gpu, machine.memory.total_bytes)[0]
    return DEFAULT_RAM_BANDWIDTH


def predict_tokens_per_s(
    machine: Machine, gpu_bytes: Sequence[float], ram_bytes: float
) -> tuple[float, list[str]]:
    """Tokens per second for the bytes read per token on each GPU and in RAM, with one note per device."""
    seconds = 0.0
    notes: list[str] = []
    for gpu, n_bytes in zip(machine.gpus, gpu_bytes, strict=False):
        if n_bytes <= 0:
            continue
        bw, source = gpu_bandwidth(gpu, machine.memory.total_bytes)
        seconds += n_bytes / bw
        notes.append(f"gpu{gpu.index}: {n_bytes / GB:.2f} GB per token at {bw / GB:.0f} GB/s ({source})")
    if ram_bytes > 0:
        bw = ram_bandwidth(machine)
        seconds += ram_bytes / bw
        notes.append(f"RAM: {ram_bytes / GB:.2f} GB per token at {bw / GB:.0f} GB/s")
    if seconds <= 0:
        return 0.0, notes
    return BANDWIDTH_EFFICIENCY / seconds, notes
