"""Load llama.cpp's shared libraries early: before anything in the process imports numpy.

On a CUDA build of llama-cpp-python 0.3.36, loading a model crashed (inside ``llama_model::print_info``) whenever
numpy had been imported before libllama was loaded, and worked when libllama came first (issue 10; measured on
an H200). ``import llama_cpp`` itself loads libllama before numpy, which is why llama-cpp-python's own ``Llama``
worked; clover_local's engine imports numpy (and the ``gguf`` package, which imports numpy) first. So
``import clover_local`` loads the library, with ``ctypes`` only (no numpy, no llama_cpp package: a few
milliseconds), and every later load, by llama_cpp or by us, gets the same handle.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

_NAMES = {"linux": ("libllama.so",), "darwin": ("libllama.dylib", "libllama.so")}

loaded_path: str | None = None
"""The libllama this process loaded early, if any."""
numpy_was_first = False
"""numpy was already imported when clover_local was (the caller imported it first)."""


def llama_lib_dir() -> Path | None:
    """Where llama-cpp-python loads its libraries from: ``LLAMA_CPP_LIB_PATH``, else the package's ``lib``."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"


def preload_llama_library() -> str | None:
    """dlopen libllama (and through it ggml and its backends) once; None where there is none to load."""
    global loaded_path, numpy_was_first
    if loaded_path is not None:
        return loaded_path
    numpy_was_first = "numpy" in sys.modules
    platform = "darwin" if sys.platform == "darwin" else "linux" if sys.platform.startswith("linux") else ""
    lib_dir = llama_lib_dir() if platform else None
    if lib_dir is None:
        return None
    for name in _NAMES[platform]:
        path = lib_dir / name
        if path.is_file():
            try:
                ctypes.CDLL(str(path))
            except OSError:
                return None  # llama_cpp's own import will report it properly
            loaded_path = str(path)
            return loaded_path
    return None
