"""Advice when the GPUs found and the llama.cpp build disagree (a CUDA card with a CPU-only build...)."""

from __future__ import annotations

from clover_local.detect.machine import Backend, Gpu, LlamaBuild

PINNED_VERSION = "0.3.36"
"""The llama-cpp-python this package pins: installed when none is, and a simulated machine's build."""
_REBUILD = 'CMAKE_ARGS="{flag}" pip install --force-reinstall --no-cache-dir llama-cpp-python=={version}'
_FLAG_FOR_VENDOR = {"nvidia": "-DGGML_CUDA=on", "amd": "-DGGML_HIP=on", "intel": "-DGGML_VULKAN=on"}
_VENDOR_LABEL = {"nvidia": "NVIDIA", "amd": "AMD", "intel": "Intel", "apple": "Apple"}
_BACKENDS_FOR_VENDOR: dict[str, tuple[Backend, ...]] = {
    "nvidia": ("cuda", "vulkan"),
    "amd": ("rocm", "vulkan"),
    "intel": ("vulkan", "sycl"),
    "apple": ("metal",),
}


def rebuild_command(vendor: str, version: str | None) -> str:
    """The exact command that rebuilds llama-cpp-python with the backend for ``vendor``'s GPUs."""
    return _REBUILD.format(
        flag=_FLAG_FOR_VENDOR.get(vendor, "-DGGML_VULKAN=on"), version=version or PINNED_VERSION
    )


def build_hints(gpus: tuple[Gpu, ...], build: LlamaBuild) -> tuple[str, ...]:
    """One hint per GPU vendor the build cannot drive, with the rebuild command; nothing when all is well."""
    if build.version is None:
        return (
            "llama-cpp-python is not importable: install it with "
            f"pip install llama-cpp-python=={PINNED_VERSION} (it compiles llama.cpp; needs a C/C++ toolchain)",
        )
    hints: list[str] = []
    for vendor in dict.fromkeys(g.vendor for g in gpus):
        usable = build.gpu_offload and any(b in build.backends for b in _BACKENDS_FOR_VENDOR[vendor])
        if usable:
            continue
        names = ", ".join(g.name for g in gpus if g.vendor == vendor)
        if vendor == "apple":
            hints.append(
                f"Found {names} but this llama-cpp-python build has no Metal: reinstall it with "
                f"pip install --force-reinstall --no-cache-dir llama-cpp-python=={build.version} "
                "(Metal is the default on macOS); until then the model runs on the CPU only"
            )
            continue
        hints.append(
            f"Found {_VENDOR_LABEL[vendor]} GPU ({names}) but this "
            f"llama-cpp-python build cannot use it (backends: {', '.join(build.backends)}); rebuild with "
            f"{rebuild_command(vendor, build.version)} -- until then the model runs on the CPU only"
        )
    return tuple(hints)
