"""A detected (or simulated) machine as text for people and as a JSON-ready dict, for ``detect`` and the TUI."""

from __future__ import annotations

import dataclasses
from typing import Any

from clover_local.detect.machine import Gpu, Machine
from clover_local.detect.units import format_bytes, gigabytes


def machine_to_dict(machine: Machine) -> dict[str, Any]:
    """Every dataclass field as plain JSON values (bytes as integers), plus the derived ``offload_backend`` and
    ``unified_memory``."""
    data = dataclasses.asdict(machine)
    data["offload_backend"] = machine.offload_backend
    data["unified_memory"] = machine.unified_memory
    return data


def describe_machine(machine: Machine) -> list[str]:
    """Lines for a terminal: CPU, RAM, disk, one line per GPU (free / total), build, hints, probe details."""
    cpu, mem, disk, build = machine.cpu, machine.memory, machine.disk, machine.build
    title = "Simulated machine" if machine.simulated else "This machine"
    lines = [
        f"{title} ({machine.os or 'unknown OS'})",
        f"  CPU    {cpu.model} ({cpu.arch or '?'}): {cpu.physical_cores} physical / {cpu.logical_cores} logical cores;"
        f" {' '.join(cpu.features) or 'no AVX2/AVX-512/NEON reported'}",
        f"  RAM    {format_bytes(mem.available_bytes)} available of {format_bytes(mem.total_bytes)}",
        f"  Disk   {format_bytes(disk.free_bytes)} free of {format_bytes(disk.total_bytes)} at {disk.path}",
    ]
    if not machine.gpus:
        lines.append("  GPU    none usable (see the probes below)")
    lines += [line for position, gpu in enumerate(machine.gpus) for line in _gpu_lines(position, gpu)]
    for worker in machine.workers:
        link = worker.link
        lines.append(
            f"  Worker {worker.endpoint} ({worker.source or 'rpc'}): link {link.bandwidth_bytes_per_s / 1e6:.0f} MB/s, "
            f"{link.rtt_s * 1e3:.2f} ms round trip ({link.source})"
        )
        lines += [
            f"    {d.label} [{d.kind}]: {format_bytes(d.free_bytes)} free / {format_bytes(d.total_bytes)}"
            for d in worker.devices
        ]
    version = build.version or "not installed"
    lines.append(
        f"  Build  llama-cpp-python {version}; GPU offload {'yes' if build.gpu_offload else 'no'}; "
        f"backends {', '.join(build.backends)}; plans target {machine.offload_backend}"
    )
    if machine.hints:
        lines.append("Hints")
        lines += [f"  ! {hint}" for hint in machine.hints]
    if machine.probes:
        lines.append("Probes")
        lines += [f"  {'ok' if p.ok else '--'} {p.name}: {p.detail}" for p in machine.probes]
    return lines


def _gpu_lines(position: int, gpu: Gpu) -> list[str]:
    kind = "unified memory, Metal working set" if gpu.unified else "VRAM"
    speed = f", {gpu.bandwidth_bytes_per_s / 1e9:.0f} GB/s" if gpu.bandwidth_bytes_per_s else ""
    lines = [
        f"  GPU {position}  {gpu.name} [{gpu.vendor} #{gpu.index}, {gpu.source}]: "
        f"{format_bytes(gpu.free_bytes)} free / {format_bytes(gpu.total_bytes)} {kind}{speed}"
    ]
    if gpu.note:
        lines.append(f"         {gpu.note}")
    return lines


def machine_summary(machine: Machine, llama_cpp: str | None = None) -> str:
    """The machine in a few lines (the app's plan screen): CPU, RAM, disk, each GPU, and the llama.cpp that runs
    the plan (``llama_cpp``, once a plan is made: an installed runtime is not the pinned build), else the pinned
    build."""
    gib = gigabytes
    path = machine.disk.path
    where = f" in {path}" if path and not path.startswith("(") else ""  # not "(simulated)"
    lines = [
        f"CPU   {machine.cpu.model or 'unknown'} ({machine.cpu.physical_cores} cores)",
        f"RAM   {gib(machine.memory.available_bytes)} free of {gib(machine.memory.total_bytes)}",
        f"Disk  {gib(machine.disk.free_bytes)} free{where}",
    ]
    for g in machine.gpus:
        kind = "unified" if g.unified else "VRAM"
        lines.append(f"GPU{g.index}  {g.name}: {gib(g.free_bytes)} free of {gib(g.total_bytes)} {kind}")
    if not machine.gpus:
        lines.append("GPU   none found: the CPU runs the model")
    build = machine.build
    backends = ", ".join(build.backends) or "cpu"
    version = build.version or "not installed"
    lines.append(f"llama.cpp  {llama_cpp or f'llama-cpp-python {version}'}, backends: {backends}")
    lines.extend(f"hint  {h}" for h in machine.hints)
    if machine.simulated:
        lines.append("(simulated machine)")
    return "\n".join(lines)
