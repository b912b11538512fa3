"""Measure the memory llama.cpp really takes when it loads a GGUF, to check the planner's memory model against.

Each measurement runs in a fresh Python process (``python -m clover_local.testing.measure``), so nothing a
previous load left behind (freed but not returned pages, the page cache mapped by an earlier ``Llama``) counts.
The child loads the model with llama-cpp-python, prefills a prompt of ``prompt_tokens`` tokens (a full ubatch
touches the activation part of the compute buffer), decodes one token, and reports:

- **Resident growth** from ``/proc/self/smaps_rollup``, split into anonymous memory (KV cache, compute
  buffers, repacked weights, and the weights themselves when ``use_mmap`` is off) and file-backed memory
  (the weights' mapped pages: with mmap they count only once touched, and one decode touches them all).
- **llama.cpp's own buffer sizes**, parsed from its load log (``... model|KV|RS|compute|output buffer size``):
  what it *reserves*. Reserved is not resident: Linux gives pages on first touch, and most of the compute
  buffer (sized for the logits of a whole ubatch) is never touched when only the last token's logits are
  asked for.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
_BUFFER_RE = re.compile(r"^\w+:\s+(\S+)\s+(model|output|KV|RS|compute) buffer size =\s+([\d.]+) MiB", re.M)
_PROMPT_TEXT = (
    "The planner decides how many layers go to the graphics card, how long the context is, and which experts "
    "stay in system memory. It reads the model header, sums the bytes of every tensor, adds the cache for "
    "each attention layer and the scratch space for one batch, then checks that everything fits. "
)


@dataclass(frozen=True)
class LoadSettings:
    """How the child loads the model: the settings the memory model is asked about."""

    ctx: int
    use_mmap: bool = True
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: bool = True
    type_k: str = "f16"
    type_v: str = "f16"
    n_threads: int = 2
    prompt_tokens: int = 512
    """Prefilled before the one decode; capped at ``ctx - 8``."""


@dataclass(frozen=True)
class MemoryUse:
    """Resident memory of a process, in bytes."""

    rss: int
    anon: int
    file: int

    def minus(self, other: MemoryUse) -> MemoryUse:
        return MemoryUse(self.rss - other.rss, self.anon - other.anon, self.file - other.file)


@dataclass(frozen=True)
class Measurement:
    model: str
    settings: LoadSettings
    before: MemoryUse
    after_load: MemoryUse
    after_decode: MemoryUse
    peak_rss: int
    """``VmHWM``: the most the process ever had resident (loading included)."""
    buffers: dict[str, int] = field(default_factory=dict)
    """Bytes llama.cpp reserved, by kind: ``model``, ``kv``, ``rs``, ``compute``, ``output``."""
    prompt_tokens: int = 0

    @property
    def growth(self) -> MemoryUse:
        """What loading, one prefill and one decode added to the process's resident memory."""
        return self.after_decode.minus(self.before)

    @property
    def reserved(self) -> int:
        """Everything llama.cpp says it allocated (weights, KV, recurrent state, compute, output)."""
        return sum(self.buffers.values())


def measure_load(model_path: Path, settings: LoadSettings, timeout_s: float = 600) -> Measurement:
    """Load ``model_path`` with ``settings`` in a fresh process and measure it (see the module docstring)."""
    request = {"model": str(model_path), "settings": asdict(settings)}
    result, log = run_measuring_child(
        "clover_local.testing.measure", request, f"Measuring {model_path.name}", timeout_s
    )
    return Measurement(
        model=model_path.name,
        settings=settings,
        before=MemoryUse(**result["before"]),
        after_load=MemoryUse(**result["after_load"]),
        after_decode=MemoryUse(**result["after_decode"]),
        peak_rss=result["peak_rss"],
        buffers=parse_buffer_log(log),
        prompt_tokens=result["prompt_tokens"],
    )


def run_measuring_child(
    module: str, request: dict[str, Any], what: str, timeout_s: float
) -> tuple[dict[str, Any], str]:
    """Run ``python -m module REQUEST_JSON`` in a fresh process (its memory is its own) and return the JSON object
    it prints last, and its stderr (llama.cpp's log); an :class:`EngineError` with the child's last lines when it
    fails."""
    from clover_local.errors import EngineError

    proc = subprocess.run(
        [sys.executable, "-m", module, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        raise EngineError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if not isinstance(result, dict):
        raise EngineError(f"{what} failed: the child printed {type(result).__name__}, not an object.")
    return result, proc.stderr


def parse_buffer_log(log: str) -> dict[str, int]:
    """Sum llama.cpp's ``<device> <kind> buffer size = X MiB`` lines by kind (``model`` includes repacked
    weights; ``kv`` the full and sliding-window caches)."""
    out: dict[str, int] = {}
    for _device, kind, mib in _BUFFER_RE.findall(log):
        key = kind.lower()
        out[key] = out.get(key, 0) + round(float(mib) * MIB)
    return out


def read_memory_use() -> MemoryUse:
    """This process's resident memory, from ``/proc/self/smaps_rollup`` (Linux)."""
    fields: dict[str, int] = {}
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines()[1:]:
        key, _, rest = line.partition(":")
        parts = rest.split()
        if len(parts) == 2 and parts[1] == "kB":
            fields[key] = int(parts[0]) * 1024
    rss, anon = fields["Rss"], fields["Anonymous"]
    return MemoryUse(rss=rss, anon=anon, file=rss - anon)


def _peak_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _child(request: dict[str, object]) -> dict[str, object]:
    """Runs in the fresh process: load, prefill, decode one token, report memory."""
    import llama_cpp
    import numpy as np

    s = LoadSettings(**request["settings"])  # type: ignore[arg-type]
    ggml_types = {"f16": 1, "q8_0": 8, "f32": 0}
    before = read_memory_use()
    from clover_local.engine.native import load_llama

    llm = load_llama(
        str(request["model"]),
        n_ctx=s.ctx,
        n_batch=s.n_batch,
        n_ubatch=s.n_ubatch,
        flash_attn=s.flash_attn,
        type_k=ggml_types[s.type_k],
        type_v=ggml_types[s.type_v],
        n_threads=s.n_threads,
        n_threads_batch=s.n_threads,
        use_mmap=s.use_mmap,
        swa_full=False,
        verbose=True,
    )
    after_load = read_memory_use()
    n_prompt = max(1, min(s.prompt_tokens, s.ctx - 8))
    text = _PROMPT_TEXT * (1 + n_prompt // 40)
    tokens = llm.tokenize(text.encode())[:n_prompt]
    llm.eval(tokens)
    logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
    llm.eval([int(np.argmax(logits))])
    after_decode = read_memory_use()
    return {
        "before": asdict(before),
        "after_load": asdict(after_load),
        "after_decode": asdict(after_decode),
        "peak_rss": _peak_rss(),
        "prompt_tokens": len(tokens),
    }


if __name__ == "__main__":
    print(json.dumps(_child(json.loads(sys.argv[1]))), flush=True)
