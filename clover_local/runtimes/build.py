"""Building ``llama-server`` from a llama.cpp source tree with CMake: the one implementation behind
``scripts/build-llama-server`` (the pinned source) and ``clover-local runtime install --from-source`` (a release's).

The backend is chosen from what this machine can build and run (CUDA, Metal, Vulkan, ROCm, else CPU): a GPU and
its toolkit must both exist. Binaries are linked statically (``BUILD_SHARED_LIBS=OFF``), so a build folder's
``bin/llama-server`` runs wherever it is copied.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from clover_local.errors import RuntimeInstallError

Log = Callable[[str], None]

BACKEND_FLAGS: dict[str, list[str]] = {
    "cpu": [],
    "cuda": ["-DGGML_CUDA=ON"],
    "metal": ["-DGGML_METAL=ON"],
    "vulkan": ["-DGGML_VULKAN=ON"],
    "rocm": ["-DGGML_HIP=ON"],
}
CONFIGURE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DGGML_RPC=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)
ARG_SOURCE = "common/arg.cpp"
ARCH_SOURCE = "src/llama-arch.cpp"


def detect_backend(log: Log) -> tuple[str, str]:
    """The best backend this machine can build and run, and why: a GPU and its toolkit must both exist."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "metal", "Apple Silicon"
    nvidia_gpu = shutil.which("nvidia-smi") is not None or Path("/proc/driver/nvidia/gpus").is_dir()
    nvcc = find_nvcc()
    if nvidia_gpu and nvcc:
        return "cuda", f"NVIDIA GPU and nvcc ({nvcc})"
    amd_gpu = Path("/dev/kfd").exists()
    hipcc = shutil.which("hipcc") or ("/opt/rocm/bin/hipcc" if Path("/opt/rocm/bin/hipcc").exists() else None)
    if amd_gpu and hipcc:
        return "rocm", f"AMD GPU (/dev/kfd) and hipcc ({hipcc})"
    has_vulkan_sdk = shutil.which("glslc") is not None and (
        Path("/usr/include/vulkan/vulkan.h").exists() or bool(os.environ.get("VULKAN_SDK"))
    )
    any_gpu = nvidia_gpu or amd_gpu or Path("/dev/dri").is_dir()
    if any_gpu and has_vulkan_sdk:
        return "vulkan", "a GPU and the Vulkan SDK (glslc, headers)"
    if nvidia_gpu:
        log(
            "NVIDIA GPU found but no CUDA toolkit (nvcc): building for CPU. Install the CUDA toolkit to use it."
        )
    elif amd_gpu:
        log("AMD GPU found but no ROCm (hipcc): building for CPU. Install ROCm or the Vulkan SDK to use it.")
    return "cpu", "no GPU with a matching toolkit was found"


def find_nvcc() -> str | None:
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    found = shutil.which("nvcc")
    if found:
        return found
    candidate = Path(cuda_home) / "bin" / "nvcc"
    return str(candidate) if candidate.exists() else None


def runtime_backend(build_backend: str) -> str:
    """The runtime's backend label for a build backend: ``cuda`` becomes ``cuda-<major>`` from nvcc's version."""
    if build_backend != "cuda":
        return build_backend
    nvcc = find_nvcc()
    if nvcc:
        try:
            out = subprocess.run(
                [nvcc, "--version"], capture_output=True, text=True, timeout=30, check=False
            ).stdout
        except (OSError, subprocess.TimeoutExpired):
            out = ""
        m = re.search(r"release (\d+)\.", out)
        if m:
            return f"cuda-{m.group(1)}"
    return "cuda"


def build_backend_for(runtime: str) -> str:
    """The CMake backend that builds a runtime backend (``cuda-12`` and ``cuda-13`` both build with CUDA)."""
    backend = "cuda" if runtime.startswith("cuda") else runtime
    if backend not in BACKEND_FLAGS:
        raise RuntimeInstallError(
            f"Cannot build llama.cpp for {runtime!r}.",
            f"Choose one of {', '.join(BACKEND_FLAGS)} (--backend).",
        )
    return backend


def cmake_build(
    src: Path,
    build_dir: Path,
    backend: str,
    commit: str,
    jobs: int,
    targets: Sequence[str],
    log: Log,
) -> Path:
    """Configure and build ``targets``; the folder the binaries are in. Raises CalledProcessError on a failed step."""
    # A folder configured before keeps its generator (CMake refuses to switch one).
    generator = ["-G", "Ninja"] if shutil.which("ninja") and not (build_dir / "Makefile").exists() else []
    configure = ["cmake", "-S", str(src), "-B", str(build_dir), *generator, *CONFIGURE_FLAGS]
    configure += [f"-DLLAMA_BUILD_COMMIT={commit}", *BACKEND_FLAGS[backend]]
    log("Configuring: " + " ".join(configure))
    subprocess.run(configure, check=True)
    cmd = ["cmake", "--build", str(build_dir), "--config", "Release", "-j", str(jobs), "--target", *targets]
    log("Building: " + " ".join(cmd))
    subprocess.run(cmd, check=True)
    return build_dir / "bin"


def keep_sources(src: Path, install_dir: Path, kept: Sequence[str], log: Log) -> None:
    """Copy ``kept`` source files (by their base name) beside the binaries: the option table (``common/arg.cpp``)
    and the architecture table (``src/llama-arch.cpp``) are read from there, so what a build can do is known from
    the exact source it was built from."""
    from clover_local.arch_support import parse_llama_arch

    missing = [rel for rel in kept if not (src / rel).is_file()]
    if missing:
        raise RuntimeInstallError(
            f"This llama.cpp source has no {', '.join(missing)}, which clover-local reads beside the binaries.",
            "Use a llama.cpp version that has them.",
        )
    install_dir.mkdir(parents=True, exist_ok=True)
    for rel in kept:
        target = install_dir / Path(rel).name
        tmp = target.with_name(f".{target.name}.tmp")
        shutil.copy2(src / rel, tmp)
        tmp.replace(target)
    if ARCH_SOURCE in kept:
        table = parse_llama_arch((install_dir / Path(ARCH_SOURCE).name).read_text(encoding="utf-8"))
        log(
            f"Kept {', '.join(Path(rel).name for rel in kept)}: models are checked against this llama.cpp's "
            f"{len(table.names)} architectures ({len(table.diffusion)} by diffusion)."
        )
