"""What the installed llama-cpp-python can run on: its version, ``llama_supports_gpu_offload()`` and the ggml
backends it registered (CUDA, Metal, Vulkan, ROCm, SYCL, CPU).

``llama_cpp`` is imported lazily (loading it maps the native libraries) and every failure is soft: a missing or
broken install gives ``LlamaBuild(version=None)`` and the reason.
"""

from __future__ import annotations

import ctypes
import re
from types import ModuleType
from typing import Any

from clover_local.detect.machine import Backend, LlamaBuild, ProbeResult

_BACKEND_BY_REGISTRY_NAME: dict[str, Backend] = {
    "cpu": "cpu",
    "cuda": "cuda",
    "rocm": "rocm",
    "hip": "rocm",
    "mtl": "metal",
    "metal": "metal",
    "vulkan": "vulkan",
    "sycl": "sycl",
}
"""ggml registry names (``ggml_backend_reg_name``) -> our backend names; others (BLAS, RPC...) are not offload
targets the planner uses."""
_SYSTEM_INFO_NAME_RE = re.compile(r"(?:^|\|)\s*([A-Za-z][A-Za-z0-9_]*)\s*:")


def load_llama_cpp() -> tuple[ModuleType | None, str]:
    """``llama_cpp``, or None and why it could not be imported."""
    try:
        import llama_cpp
    except Exception as exc:  # ImportError, or OSError when the native library does not load
        return None, f"{type(exc).__name__}: {exc}"
    return llama_cpp, ""


def probe_build(llama_cpp: ModuleType | Any | None, import_error: str = "") -> tuple[LlamaBuild, ProbeResult]:
    """The build's abilities; ``llama_cpp`` is the imported module (or a stand-in with the same functions)."""
    if llama_cpp is None:
        why = import_error or "not installed"
        return LlamaBuild(version=None, gpu_offload=False), ProbeResult(
            "llama.cpp", False, f"llama-cpp-python: {why}"
        )
    version = str(getattr(llama_cpp, "__version__", "unknown"))
    offload = bool(llama_cpp.llama_supports_gpu_offload())
    info_raw = llama_cpp.llama_print_system_info()
    system_info = (
        info_raw.decode(errors="replace") if isinstance(info_raw, bytes) else str(info_raw)
    ).strip()
    names, how = _registry_names(llama_cpp)
    if names is None:
        names, how = _SYSTEM_INFO_NAME_RE.findall(system_info), "parsed from llama_print_system_info()"
    backends = _backends(names)
    build = LlamaBuild(version=version, gpu_offload=offload, backends=backends, system_info=system_info)
    detail = (
        f"llama-cpp-python {version}; gpu offload {'yes' if offload else 'no'}; "
        f"ggml backends: {', '.join(names) or 'none'} ({how})"
    )
    return build, ProbeResult("llama.cpp", True, detail)


def _registry_names(llama_cpp: Any) -> tuple[list[str] | None, str]:
    """Names from ggml's backend registry through ctypes, or None when the library does not export it."""
    lib = getattr(getattr(llama_cpp, "llama_cpp", None), "_lib", None)
    if lib is None or not all(
        hasattr(lib, f) for f in ("ggml_backend_reg_count", "ggml_backend_reg_get", "ggml_backend_reg_name")
    ):
        return None, ""
    lib.ggml_backend_reg_count.restype = ctypes.c_size_t
    lib.ggml_backend_reg_count.argtypes = []
    lib.ggml_backend_reg_get.restype = ctypes.c_void_p
    lib.ggml_backend_reg_get.argtypes = [ctypes.c_size_t]
    lib.ggml_backend_reg_name.restype = ctypes.c_char_p
    lib.ggml_backend_reg_name.argtypes = [ctypes.c_void_p]
    names = []
    for i in range(lib.ggml_backend_reg_count()):
        raw = lib.ggml_backend_reg_name(lib.ggml_backend_reg_get(i))
        names.append(raw.decode(errors="replace") if raw else f"backend{i}")
    return names, "ggml backend registry"


def _backends(names: list[str]) -> tuple[Backend, ...]:
    """Our backend names, GPU ones first, ``cpu`` last (always present: llama.cpp always runs on the CPU)."""
    found = [_BACKEND_BY_REGISTRY_NAME[n.lower()] for n in names if n.lower() in _BACKEND_BY_REGISTRY_NAME]
    gpu = [b for b in dict.fromkeys(found) if b != "cpu"]
    return (*gpu, "cpu")
