"""Which prebuilt archive of a llama.cpp release runs here: a pure choice from the release's asset names and a
described target (OS, CPU architecture, GPU backends in order of preference).

Upstream names its archives ``llama-<tag>-bin-<os>[-<variant>]-<arch>.<tar.gz|zip>`` (``ubuntu``, ``macos``,
``win``; variants ``vulkan``, ``cuda-12.4``, ``cuda-13.3``, ``rocm-7.2``, ``hip-radeon``, ``cpu``, older
``avx2``...), and ships the CUDA runtime libraries apart as ``cudart-llama-[<tag>-]bin-<os>-cuda-<ver>-<arch>``.
The macOS arm64 archive is the Metal build. When nothing fits, :func:`choose_archive` says None and the caller
builds from source.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from clover_local.detect.machine import Machine

OsName = Literal["linux", "macos", "windows"]
BACKENDS = ("cpu", "cuda-12", "cuda-13", "vulkan", "rocm", "metal")
"""The backends a runtime can be installed for (``--backend``); ``cuda`` picks 12 or 13 from the driver."""

_ARCHIVE = re.compile(
    r"^llama-(?P<tag>b\d+)-bin-(?P<os>ubuntu|macos|win)-(?:(?P<variant>[a-z0-9.-]+?)-)?"
    r"(?P<arch>x64|arm64|s390x)\.(?P<ext>tar\.gz|zip)$"
)
_CUDART = re.compile(
    r"^cudart-llama-(?:(?P<tag>b\d+)-)?bin-(?P<os>ubuntu|win)-(?:cuda-)?(?:cu)?(?P<version>\d+\.\d+(?:\.\d+)?)-"
    r"(?P<arch>x64|arm64)\.(?:tar\.gz|zip)$"
)
_CUDA_VARIANT = re.compile(r"^cuda-(?:cu)?(?P<version>\d+\.\d+(?:\.\d+)?)$")
_OS_WORD: dict[str, OsName] = {"ubuntu": "linux", "macos": "macos", "win": "windows"}
_CPU_VARIANTS = {None: 0, "cpu": 0, "avx2": 1}
"""CPU builds by preference: the plain (all-variants) one, then the older Windows AVX2 one."""
_ARCH_WORDS = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64"}
"""CPU names upstream calls otherwise (``x64``, ``arm64`` and ``s390x`` are its own words)."""


@dataclass(frozen=True)
class Target:
    """What an archive must run on."""

    os: OsName
    arch: str
    """``x64``, ``arm64``, ``s390x`` (upstream's words)."""
    backends: tuple[str, ...]
    """Acceptable backends, best first: ``("cuda-13", "cuda-12", "vulkan")`` for a recent NVIDIA driver."""
    why: str = ""
    """Why these backends, for messages."""


@dataclass(frozen=True)
class ArchiveChoice:
    """The archives to unpack together into one runtime folder."""

    asset: str
    """The main archive (the binaries)."""
    extras: tuple[str, ...]
    """Unpacked beside it: the CUDA runtime libraries (``cudart-...``) when the release has them."""
    backend: str


@dataclass(frozen=True)
class _Archive:
    name: str
    os: OsName
    arch: str
    backend: str
    version: tuple[int, ...]
    rank: int
    """Among archives of one backend, lower is better (format, CPU variant)."""


def choose_archive(names: Iterable[str], tag: str, target: Target) -> ArchiveChoice | None:
    """The archive of release ``tag`` for ``target`` (its first backend that has one); None when none fits."""
    names = tuple(names)
    archives = [
        a for a in (_parse(n, tag) for n in names) if a and a.os == target.os and a.arch == target.arch
    ]
    for backend in target.backends:
        fits = [a for a in archives if a.backend == backend]
        if not fits:
            continue
        best = min(fits, key=lambda a: (a.rank, tuple(-v for v in a.version)))
        return ArchiveChoice(best.name, _cudart(names, best, tag), backend)
    return None


def _parse(name: str, tag: str) -> _Archive | None:
    m = _ARCHIVE.match(name)
    if m is None or m.group("tag") != tag:
        return None
    os_name, arch, variant = _OS_WORD[m.group("os")], m.group("arch"), m.group("variant")
    rank = 0 if m.group("ext") == "tar.gz" else 1  # older releases zipped their Linux builds
    version: tuple[int, ...] = ()
    if variant in _CPU_VARIANTS:
        backend = "metal" if os_name == "macos" and arch == "arm64" else "cpu"
        rank += 2 * _CPU_VARIANTS[variant]
    elif variant == "vulkan":
        backend = "vulkan"
    elif variant is not None and (cuda := _CUDA_VARIANT.match(variant)):
        version = tuple(int(p) for p in cuda.group("version").split("."))
        backend = f"cuda-{version[0]}"
    elif variant is not None and (variant.startswith(("rocm-", "hip-")) or variant in ("rocm", "hip")):
        backend = "rocm"
        version = tuple(int(p) for p in re.findall(r"\d+", variant))
    else:
        return None  # sycl, openvino, opencl, kleidiai...: not a backend chosen here
    return _Archive(name, os_name, arch, backend, version, rank)


def _cudart(names: tuple[str, ...], archive: _Archive, tag: str) -> tuple[str, ...]:
    """The CUDA runtime archive built with exactly the main archive's CUDA version."""
    if not archive.backend.startswith("cuda-"):
        return ()
    for name in names:
        m = _CUDART.match(name)
        if not m or (m.group("tag") and m.group("tag") != tag) or m.group("arch") != archive.arch:
            continue
        if _OS_WORD[m.group("os")] != archive.os:
            continue
        if tuple(int(p) for p in m.group("version").split(".")) == archive.version:
            return (name,)
    return ()


def target_for(
    machine: Machine, *, cuda_driver: tuple[int, int] | None = None, backend: str | None = None
) -> Target:
    """The target of a described machine: its OS and CPU, and the backends its GPUs can use, best first.

    ``backend`` (``--backend``) narrows the choice to that one (``cuda``: 13 or 12 as the driver allows);
    ``cuda_driver`` is the CUDA version the NVIDIA driver supports (NVML), None when unknown."""
    os_name = normalize_os(machine.os)
    arch = normalize_arch(machine.cpu.arch or platform.machine())
    if backend is not None:
        if backend == "cuda":
            return Target(os_name, arch, _cuda_order(cuda_driver), "asked for with --backend cuda")
        return Target(os_name, arch, (backend,), f"asked for with --backend {backend}")
    vendors = {g.vendor for g in machine.gpus}
    if os_name == "macos" and arch == "arm64":
        return Target(os_name, arch, ("metal",), "Apple Silicon")
    if "nvidia" in vendors:
        driver = f"CUDA {cuda_driver[0]}.{cuda_driver[1]}" if cuda_driver else "CUDA version unknown"
        return Target(
            os_name, arch, (*_cuda_order(cuda_driver), "vulkan"), f"an NVIDIA GPU (driver: {driver})"
        )
    if "amd" in vendors:
        return Target(os_name, arch, ("rocm", "vulkan"), "an AMD GPU")
    if vendors & {"intel", "apple"}:
        return Target(os_name, arch, ("vulkan",), "an Intel GPU" if "intel" in vendors else "a GPU")
    return Target(os_name, arch, ("cpu",), "no GPU found")


def _cuda_order(driver: tuple[int, int] | None) -> tuple[str, ...]:
    """CUDA builds the driver can run, newest first: a CUDA 13 build needs a driver that supports 13."""
    if driver is None or driver[0] < 13:
        return ("cuda-12",)
    return ("cuda-13", "cuda-12")


def normalize_os(name: str) -> OsName:
    lowered = (name or platform.system()).lower()
    if lowered.startswith("darwin") or lowered == "macos":
        return "macos"
    if lowered.startswith(("win", "cygwin", "msys")):
        return "windows"
    return "linux"


def normalize_arch(name: str) -> str:
    return _ARCH_WORDS.get(name.lower(), name.lower())
