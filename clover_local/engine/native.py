"""The ctypes edge of the engine: llama.cpp parameters from a settings dict, tensor buffer-type overrides, and
the load log.

llama-cpp-python declares ``llama_model_params.tensor_buft_overrides`` as an unused ``c_void_p``, but the C
struct has it: a NULL-terminated array of ``{const char *pattern; ggml_backend_buffer_type_t buft}``. We build
that array here (the same thing ``--n-cpu-moe N`` builds) and keep it alive as long as the model.

Importing this module imports llama_cpp; :mod:`clover_local.engine` imports it lazily.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
from llama_cpp import llama_cpp as C

from clover_local.errors import EngineError, UsageError

_GGML_BACKEND_DEVICE_TYPE_CPU = 0

REQUIRED_KEYS = frozenset(
    {
        "n_gpu_layers",
        "n_ctx",
        "n_batch",
        "n_ubatch",
        "n_threads",
        "n_threads_batch",
        "flash_attn",
        "type_k",
        "type_v",
        "use_mmap",
        "use_mlock",
        "split_mode",
        "main_gpu",
        "tensor_split",
        "offload_kqv",
        "tensor_buft_overrides",
        "swa_full",
        "n_seq_max",
        "kv_unified",
        "n_rs_seq",
        "n_outputs_max_per_seq",
        "backend_sampling",
    }
)
"""What ``plan.llama_args.llama_settings(plan).kwargs()`` always gives, and :func:`build_params` needs: the
loader decides no setting itself, so a missing one is a mistake, not a default."""
OPTIONAL_KEYS = frozenset({"use_extra_bufts", "op_offload"})
"""Given only when they differ from llama.cpp's default (``--no-repack``; never at present)."""
SETTINGS_KEYS = REQUIRED_KEYS | OPTIONAL_KEYS
"""``llama_cpp.Llama.__init__`` keyword names we honour, plus the ones the loader sets through ctypes."""

ENGINE_ONLY_KEYS = frozenset({"ctx_checkpoints", "n_rs_seq", "n_outputs_max_per_seq", "backend_sampling"})
"""Keys of the embedded engine's own (``engine.checkpoints``, its speculation and sampler), which
``llama_cpp.Llama`` has no keyword for."""
IGNORED_KEYS = frozenset({"model_path", "chat_format", "verbose", "ctx_checkpoints", "backend_sampling"})
"""Keys ``llama_cpp_kwargs`` may carry that the loader takes elsewhere (path, template, the engine's
sampling place, its context checkpoints) or not at all."""


class _BuftOverride(ctypes.Structure):
    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def _lib_dir() -> Path:
    """Where llama-cpp-python's libraries are: ``LLAMA_CPP_LIB_PATH`` when set (as llama_cpp itself reads it)."""
    from clover_local._native import llama_lib_dir

    return llama_lib_dir() or Path(llama_cpp.__file__).resolve().parent / "lib"


def _load_lib(stem: str) -> ctypes.CDLL:
    """One of llama-cpp-python's bundled ggml libraries, whatever the platform calls it."""
    for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll", f"lib{stem}.dll"):
        path = _lib_dir() / name
        if path.exists():
            return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
    raise EngineError(
        f"llama-cpp-python's {stem} library was not found in {_lib_dir()}.", "Reinstall llama-cpp-python."
    )


@functools.cache
def cpu_buffer_type() -> int:
    """Address of the CPU backend's buffer type (what ``=CPU`` in ``--override-tensor`` means)."""
    ggml = _load_lib("ggml")
    base = _load_lib("ggml-base")
    ggml.ggml_backend_dev_by_type.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_by_type.argtypes = [ctypes.c_int]
    base.ggml_backend_dev_buffer_type.restype = ctypes.c_void_p
    base.ggml_backend_dev_buffer_type.argtypes = [ctypes.c_void_p]
    C.llama_backend_init()
    dev = ggml.ggml_backend_dev_by_type(_GGML_BACKEND_DEVICE_TYPE_CPU)
    if not dev:
        raise EngineError("llama.cpp reports no CPU backend, so tensors cannot be kept in RAM.")
    return int(base.ggml_backend_dev_buffer_type(dev))


@dataclass
class NativeParams:
    """llama.cpp model and context parameters plus the ctypes objects they point into (kept alive here)."""

    model: Any
    context: Any
    keep_alive: list[Any] = field(default_factory=list)


def _parse_override(item: str) -> str:
    pattern, sep, target = item.rpartition("=")
    if not sep or not pattern or target.strip().upper() != "CPU":
        raise UsageError(
            f"Tensor override {item!r} is not of the form '<regex>=CPU'.",
            "Only CPU overrides are supported (what --n-cpu-moe builds).",
        )
    return pattern


def _flash_attn_type(value: Any) -> int:
    if value is None or value == "auto":
        return C.LLAMA_FLASH_ATTN_TYPE_AUTO
    if value is True or value == "on":
        return C.LLAMA_FLASH_ATTN_TYPE_ENABLED
    if value is False or value == "off":
        return C.LLAMA_FLASH_ATTN_TYPE_DISABLED
    raise UsageError(f"flash_attn must be on, off, auto or a bool, not {value!r}.")


def _load_mode(use_mmap: bool, use_mlock: bool) -> int:
    if use_mmap and use_mlock:
        return C.LLAMA_LOAD_MODE_MMAP_MLOCK
    if use_mlock:
        return C.LLAMA_LOAD_MODE_MLOCK
    return C.LLAMA_LOAD_MODE_MMAP if use_mmap else C.LLAMA_LOAD_MODE_NONE


def build_params(settings: dict[str, Any]) -> NativeParams:
    """llama.cpp model/context params from ``llama_settings(plan).kwargs()``, exactly as given: unknown or
    missing keys are a UsageError (the settings producer decides every value; nothing here has a default)."""
    unknown = set(settings) - SETTINGS_KEYS - IGNORED_KEYS
    if unknown:
        raise UsageError(
            f"Unknown engine setting(s): {', '.join(sorted(unknown))}.",
            f"Known settings: {', '.join(sorted(SETTINGS_KEYS))}.",
        )
    missing = REQUIRED_KEYS - set(settings)
    if missing:
        raise UsageError(
            f"Engine setting(s) missing: {', '.join(sorted(missing))}.",
            "Build the settings from a plan: clover_local.plan.llama_args.llama_settings(plan).kwargs().",
        )
    keep: list[Any] = []
    mp = C.llama_model_default_params()
    mp.n_gpu_layers = int(settings["n_gpu_layers"])
    mp.use_extra_bufts = bool(settings.get("use_extra_bufts", True)) and _repack_default()
    mp.split_mode = int(settings["split_mode"])
    mp.main_gpu = int(settings["main_gpu"])
    mp.load_mode = _load_mode(bool(settings["use_mmap"]), bool(settings["use_mlock"]))
    split = settings["tensor_split"] or ()
    if split:
        arr = (ctypes.c_float * max(len(split), C.llama_max_devices()))(*map(float, split))
        keep.append(arr)
        mp.tensor_split = ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))
    overrides = list(settings["tensor_buft_overrides"] or ())
    if overrides:
        patterns = [_parse_override(o).encode() for o in overrides]
        buft = cpu_buffer_type()
        table = (_BuftOverride * (len(patterns) + 1))()  # zeroed: the last entry is the NULL terminator
        for i, pattern in enumerate(patterns):
            table[i].pattern = pattern
            table[i].buft = buft
        keep.extend([patterns, table])
        mp.tensor_buft_overrides = ctypes.addressof(table)

    cp = C.llama_context_default_params()
    cp.n_ctx = int(settings["n_ctx"])
    cp.n_batch = int(settings["n_batch"])
    cp.n_ubatch = min(int(settings["n_ubatch"]), cp.n_batch)
    cp.n_threads = int(settings["n_threads"])
    cp.n_threads_batch = int(settings["n_threads_batch"])
    cp.flash_attn_type = _flash_attn_type(settings["flash_attn"])
    cp.type_k = int(settings["type_k"])
    cp.type_v = int(settings["type_v"])
    cp.offload_kqv = bool(settings["offload_kqv"])
    cp.swa_full = bool(settings["swa_full"])
    if settings.get("op_offload") is not None:
        cp.op_offload = bool(settings["op_offload"])
    cp.n_seq_max = int(settings["n_seq_max"])  # the planned slots (plan.slots)
    cp.kv_unified = bool(settings["kv_unified"])
    cp.n_rs_seq = int(settings["n_rs_seq"])
    cp.n_outputs_max_per_seq = int(settings["n_outputs_max_per_seq"])
    cp.no_perf = True
    return NativeParams(model=mp, context=cp, keep_alive=keep)


def _repack_default() -> bool:
    """The rule for this CPU (``engine.repack``), whatever machine the settings were planned for."""
    from clover_local.engine.repack import repack_safe_here

    return repack_safe_here()


class LogCapture:
    """Collects llama.cpp's log (all levels) while a model loads, so errors and placement can be read from it.

    llama.cpp has one global log callback; ours stays installed and drops lines when nothing captures them
    (llama-cpp-python's default callback would print them to stderr).
    """

    _lock = threading.Lock()
    _active: LogCapture | None = None
    _callback: Any = None

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._partial = ""

    def _feed(self, text: str) -> None:
        text = self._partial + text
        *full, self._partial = text.split("\n")
        self.lines.extend(full)

    def __enter__(self) -> LogCapture:
        """Not re-entrant: one capture at a time (a second one, even in the same thread, waits)."""
        if LogCapture._callback is None:

            @C.llama_log_callback
            def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
                capture = LogCapture._active
                if capture is not None and text:
                    capture._feed(text.decode("utf-8", errors="replace"))

            LogCapture._callback = _on_log  # keep the ctypes thunk alive for the process
            C.llama_log_set(_on_log, ctypes.c_void_p(0))
        LogCapture._lock.acquire()
        LogCapture._active = self
        return self

    def __exit__(self, *exc: object) -> None:
        LogCapture._active = None
        LogCapture._lock.release()
        if self._partial:
            self.lines.append(self._partial)
            self._partial = ""

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


_DEFAULTS_LOCK = threading.Lock()


def load_llama(model_path: str | Path, *, use_extra_bufts: bool = True, **kwargs: Any) -> llama_cpp.Llama:
    """llama-cpp-python's high-level ``Llama``, loaded under the same repacking rule as the engine's own params
    (:func:`build_params`): ``Llama`` takes no ``use_extra_bufts`` (it would drop the key silently), so on a CPU
    whose repacked kernels must not run, its default model params are given with repacking off for this load.
    Settings only the embedded engine knows (:data:`ENGINE_ONLY_KEYS`) are left out."""
    kwargs = {k: v for k, v in kwargs.items() if k not in ENGINE_ONLY_KEYS}
    if use_extra_bufts and _repack_default():
        return llama_cpp.Llama(str(model_path), **kwargs)
    original = C.llama_model_default_params

    def without_repack() -> Any:
        params = original()
        params.use_extra_bufts = False
        return params

    with _DEFAULTS_LOCK:  # the module attribute llama_cpp.Llama reads: one load at a time swaps it
        C.llama_model_default_params = without_repack
        try:
            return llama_cpp.Llama(str(model_path), **kwargs)
        finally:
            C.llama_model_default_params = original
