"""CPU: model, physical/logical cores and the instruction-set extensions llama.cpp's kernels care about.

Linux reads ``/proc/cpuinfo``; macOS asks ``sysctl``. Both inputs are injectable so tests feed recorded text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path

from clover_local.detect.apple import RunSysctl
from clover_local.detect.machine import Cpu, ProbeResult

CoreCounter = Callable[[bool], int | None]
"""``psutil.cpu_count(logical=...)``."""

FEATURES = ("avx2", "avx512f", "avx512_vnni", "amx_int8", "f16c", "fma", "neon", "sve")
"""Reported in this order. ``asimd`` (Linux on ARM) is reported as ``neon``."""

_SYSCTL_FEATURE_KEYS = {
    "neon": "hw.optional.neon",
    "avx2": "hw.optional.avx2_0",
    "avx512f": "hw.optional.avx512f",
    "fma": "hw.optional.fma",
    "f16c": "hw.optional.f16c",
}


def core_cpus(sysfs_root: Path, allowed: Iterable[int]) -> tuple[int, ...]:
    """One logical CPU per physical core among ``allowed`` (``os.sched_getaffinity``), the lowest of each core's
    hardware threads (``<sysfs>/devices/system/cpu/cpuN/topology/thread_siblings_list``: ``0,8``, ``0-1``),
    sorted. Empty when a CPU's topology cannot be read: then nothing is bound."""
    allowed_set = set(allowed)
    picked: set[int] = set()
    for cpu in sorted(allowed_set):
        path = sysfs_root / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            siblings = _cpu_list(path.read_text())
        except (OSError, ValueError):
            return ()
        picked.add(min((siblings & allowed_set) or {cpu}))
    return tuple(sorted(picked))


def _cpu_list(text: str) -> set[int]:
    """A kernel CPU list (``0-3,8,10-11``)."""
    out: set[int] = set()
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def probe_cpu_linux(
    cpuinfo: Path, arch: str, count: CoreCounter, sysfs_root: Path | None = None, allowed: Iterable[int] = ()
) -> tuple[Cpu, ProbeResult]:
    """Model and flags from ``cpuinfo`` (``/proc/cpuinfo``), cores from ``count``, one CPU per core among
    ``allowed`` from ``sysfs_root`` (:func:`core_cpus`; None: not read)."""
    fields = _first_processor_fields(cpuinfo.read_text(errors="replace"))
    model = (
        fields.get("model name")
        or fields.get("hardware")
        or fields.get("cpu model")
        or _arm_model(fields, arch)
    )
    flags = set((fields.get("flags") or fields.get("features") or "").split())
    if "asimd" in flags:
        flags.add("neon")
    cpu = _cpu(model, flags, arch, count)
    if sysfs_root is not None:
        cpu = replace(cpu, core_cpus=core_cpus(sysfs_root, allowed))
    return cpu, ProbeResult("cpu", True, _describe(cpu, f"from {cpuinfo}"))


def probe_cpu_macos(run_sysctl: RunSysctl, arch: str, count: CoreCounter) -> tuple[Cpu, ProbeResult]:
    """Model and flags from ``sysctl`` (``machdep.cpu.brand_string``, ``hw.optional.*``)."""
    model = (run_sysctl("machdep.cpu.brand_string") or arch or "unknown CPU").strip()
    flags = {name for name, key in _SYSCTL_FEATURE_KEYS.items() if (run_sysctl(key) or "").strip() == "1"}
    if arch in ("arm64", "aarch64"):  # every Apple Silicon core has NEON; some macOS versions lack the key
        flags.add("neon")
    cpu = _cpu(model, flags, arch, count)
    return cpu, ProbeResult("cpu", True, _describe(cpu, "from sysctl"))


def _cpu(model: str, flags: set[str], arch: str, count: CoreCounter) -> Cpu:
    logical = count(True) or 1
    physical = count(False) or logical
    return Cpu(
        model=" ".join(model.split()),
        physical_cores=physical,
        logical_cores=logical,
        features=tuple(f for f in FEATURES if f in flags),
        arch=arch,
    )


def _arm_model(fields: dict[str, str], arch: str) -> str:
    """ARM Linux has no model name: say which implementer/part it is (``0x41``/``0xd40`` = Arm Neoverse V1)."""
    implementer, part = fields.get("cpu implementer"), fields.get("cpu part")
    if implementer and part:
        return f"{arch or 'ARM'} CPU (implementer {implementer}, part {part})"
    return arch or "unknown CPU"


def _first_processor_fields(text: str) -> dict[str, str]:
    """``key: value`` lines of the first processor block (plus trailing global lines on ARM), lower-cased keys."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key and key not in fields:
            fields[key] = value.strip()
    return fields


def _describe(cpu: Cpu, where: str) -> str:
    features = ", ".join(cpu.features) or "none of " + "/".join(FEATURES)
    return (
        f"{cpu.model} ({cpu.arch}), {cpu.physical_cores} physical / {cpu.logical_cores} logical cores; "
        f"features: {features} ({where})"
    )
