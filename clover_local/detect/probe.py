"""``detect_machine()``: run every probe, each failing soft, and assemble the :class:`Machine`.

Every input a probe reads comes from :class:`ProbeInputs` (the sysfs root, a sysctl runner, the NVML module...),
so tests describe a machine with recorded outputs and the real run uses the defaults.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import psutil

from clover_local.detect.amd import load_amdsmi, probe_amd_sysfs, probe_amdsmi
from clover_local.detect.apple import RunSysctl, probe_apple
from clover_local.detect.build import load_llama_cpp, probe_build
from clover_local.detect.cpu import CoreCounter, probe_cpu_linux, probe_cpu_macos
from clover_local.detect.cpu_load import CpuSample, others_busy_cores, sample_cpu
from clover_local.detect.drm import SYSFS_ROOT, drm_cards
from clover_local.detect.hints import build_hints
from clover_local.detect.intel import probe_intel_sysfs
from clover_local.detect.machine import Cpu, Disk, Gpu, LlamaBuild, Machine, Memory, ProbeResult
from clover_local.detect.memory import probe_disk, probe_memory
from clover_local.detect.nvidia import load_nvml, probe_nvidia
from clover_local.detect.ram_read import RamRead, machine_key, ram_read_here

T = TypeVar("T")
NVIDIA_VENDOR_ID = "0x10de"
LOAD_WINDOW_S = 0.25
"""The shortest window the other programs' CPU use is measured over while probing."""


def run_sysctl(key: str) -> str | None:
    """``sysctl -n KEY`` on this machine; None when the key or the command does not exist."""
    try:
        done = subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None


def allowed_cpus() -> Iterable[int]:
    """The CPUs this process may run on (``sched_getaffinity``; none where the system does not say)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ()


@dataclass(frozen=True)
class ProbeInputs:
    """Where each probe reads from. Defaults read this machine; tests replace fields with recorded data."""

    system: str = field(default_factory=lambda: platform.system().lower())
    """``linux``, ``darwin``, ``windows``."""
    arch: str = field(default_factory=platform.machine)
    sysfs_root: Path = SYSFS_ROOT
    cpuinfo: Path = Path("/proc/cpuinfo")
    run_sysctl: RunSysctl = run_sysctl
    cpu_count: CoreCounter = psutil.cpu_count
    virtual_memory: Callable[[], Any] = psutil.virtual_memory
    load_nvml: Callable[[], Any] = load_nvml
    load_amdsmi: Callable[[], Any] = load_amdsmi
    load_llama_cpp: Callable[[], tuple[Any, str]] = load_llama_cpp
    allowed_cpus: Callable[[], Iterable[int]] = allowed_cpus
    """The CPUs this process may run on (a container's or ``taskset``'s set)."""
    sample_cpu: Callable[[], CpuSample] = sample_cpu
    """CPU time used so far (``detect.cpu_load``), sampled as probing starts and ends."""
    ram_read: Callable[[Cpu, Memory], RamRead | None] = field(
        default_factory=lambda: ram_read_kept_or_measured
    )
    """How fast the CPU reads RAM (``detect.ram_read``): kept per machine, measured the first time."""


def detect_machine(models_dir: Path | None = None, inputs: ProbeInputs | None = None) -> Machine:
    """Probe this machine: CPU, RAM, disk free at ``models_dir`` (default: the HF cache), every GPU, the build.

    Never raises for a missing driver or a broken probe: that probe reports ``ok=False`` and why.
    """
    inp = inputs or ProbeInputs()
    if models_dir is None:
        from clover_local.settings import hf_cache_dir

        models_dir = hf_cache_dir()
    probes: list[ProbeResult] = []
    load_from = inp.sample_cpu()

    def soft(name: str, probe: Callable[[], tuple[T, ProbeResult]], fallback: T) -> T:
        try:
            value, result = probe()
        except Exception as exc:  # a probe bug or an odd system must not stop detection
            probes.append(ProbeResult(name, False, f"probe failed: {type(exc).__name__}: {exc}"))
            return fallback
        probes.append(result)
        return value

    cpu = soft("cpu", lambda: _probe_cpu(inp), _fallback_cpu(inp))
    memory = soft("memory", lambda: probe_memory(inp.virtual_memory), Memory(0, 0))
    disk = soft("disk", lambda: probe_disk(models_dir), Disk(str(models_dir), 0, 0))
    gpus: list[Gpu] = []
    gpus += soft("nvidia", lambda: probe_nvidia(inp.load_nvml()), list[Gpu]())
    if inp.system == "linux":
        amd: list[Gpu] = soft("amd", lambda: probe_amd_sysfs(inp.sysfs_root), [])
        if not amd:
            amd = soft("amdsmi", lambda: probe_amdsmi(inp.load_amdsmi()), [])
        gpus += amd
        gpus += soft("intel", lambda: probe_intel_sysfs(inp.sysfs_root), [])
    if inp.system == "darwin":
        gpus += soft("apple", lambda: probe_apple(inp.run_sysctl, inp.arch), [])
    build = soft("llama.cpp", lambda: probe_build(*inp.load_llama_cpp()), LlamaBuild(None, False))
    gpu_tuple = tuple(gpus)
    hints = list(build_hints(gpu_tuple, build))
    if inp.system == "linux" and not any(g.vendor == "nvidia" for g in gpus):
        hints += soft("nvidia-pci", lambda: _nvidia_without_nvml(inp.sysfs_root), [])
    cpu = replace(cpu, others_busy_cores=_others_busy_since(load_from, inp.sample_cpu))
    if memory.total_bytes > 0:
        read = soft("ram-read", lambda: _ram_read_probe(inp, cpu, memory), None)
        memory = replace(memory, ram_read=read)
    return Machine(
        cpu=cpu,
        memory=memory,
        disk=disk,
        gpus=gpu_tuple,
        build=build,
        os=inp.system,
        probes=tuple(probes),
        hints=tuple(hints),
    )


def _others_busy_since(start: CpuSample, sample: Callable[[], CpuSample]) -> float:
    """The other programs' CPU use since ``start``, over at least :data:`LOAD_WINDOW_S` (the counters tick in
    10 ms: a shorter window would read one stray tick as a busy core)."""
    now = sample()
    if now.at - start.at < LOAD_WINDOW_S:
        time.sleep(LOAD_WINDOW_S - (now.at - start.at))
        now = sample()
    return round(others_busy_cores(start, now), 2)


def ram_read_kept_or_measured(cpu: Cpu, memory: Memory) -> RamRead | None:
    """This machine's RAM read rate, kept in the data folder (measured there the first time, and again when the
    CPU, its cores or the RAM changed)."""
    from clover_local.settings import data_dir

    key = machine_key(cpu.model, cpu.logical_cores, memory.total_bytes)
    return ram_read_here(data_dir(), key, cpu.physical_cores)


def _ram_read_probe(inp: ProbeInputs, cpu: Cpu, memory: Memory) -> tuple[RamRead | None, ProbeResult]:
    read = inp.ram_read(cpu, memory)
    if read is None:
        return None, ProbeResult("ram-read", False, "not measured")
    gbs = f"{read.one_thread / 1e9:.1f} GB/s on one thread, {read.all_threads / 1e9:.1f} on {read.threads}"
    note = "" if read.quiet else f" (other programs used {read.others_busy:.1f} cores meanwhile: not kept)"
    return read, ProbeResult("ram-read", True, f"RAM read {gbs}, measured {read.date}{note}")


def detect_cpu() -> Cpu:
    """This machine's CPU alone (model, cores, flags), as :func:`detect_machine` reads it."""
    inp = ProbeInputs()
    try:
        return _probe_cpu(inp)[0]
    except (OSError, ValueError):
        return _fallback_cpu(inp)


def _probe_cpu(inp: ProbeInputs) -> tuple[Cpu, ProbeResult]:
    if inp.system == "darwin":
        return probe_cpu_macos(inp.run_sysctl, inp.arch, inp.cpu_count)
    if inp.cpuinfo.is_file():
        return probe_cpu_linux(inp.cpuinfo, inp.arch, inp.cpu_count, inp.sysfs_root, inp.allowed_cpus())
    cpu = _fallback_cpu(inp)
    return cpu, ProbeResult(
        "cpu", True, f"{cpu.model}: {cpu.logical_cores} logical cores (no flags on {inp.system})"
    )


def _fallback_cpu(inp: ProbeInputs) -> Cpu:
    cores = os.cpu_count() or 1
    return Cpu(
        model=platform.processor() or inp.arch or "unknown CPU",
        physical_cores=cores,
        logical_cores=cores,
        arch=inp.arch,
    )


def _nvidia_without_nvml(sysfs_root: Path) -> tuple[list[str], ProbeResult]:
    """An NVIDIA card on the PCI bus that NVML could not see means a missing driver or nvidia-ml-py."""
    cards = drm_cards(sysfs_root, NVIDIA_VENDOR_ID)
    if not cards:
        return [], ProbeResult("nvidia-pci", True, "no NVIDIA card on the PCI bus")
    ids = ", ".join(f"{c.name} (PCI {c.pci_id})" for c in cards)
    hint = (
        f"NVIDIA GPU on the PCI bus ({ids}) but NVML could not read it: install the NVIDIA driver "
        "(nvidia-smi should list the card) and nvidia-ml-py; until then it is not used"
    )
    return [hint], ProbeResult("nvidia-pci", False, f"NVIDIA card(s) present but not readable: {ids}")
