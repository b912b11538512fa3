"""Engine settings for a model file, made the one way the product makes them: a small plan for the file,
rendered by ``plan.llama_args.llama_settings`` (the sole producer), for tests and scripts that load a file directly.
Nothing else hand-builds a settings dict."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from clover_local.gguf.header import read_local_header
from clover_local.plan.llama_args import llama_settings
from clover_local.plan.types import DeviceMemory, MemoryPlan, Plan, SpeculativePlan

SPECULATING = SpeculativePlan(enabled=True)
"""``load_engine``'s speculation when none is given."""


def file_plan(
    model: str | Path,
    *,
    ctx: int,
    threads: int = 2,
    n_gpu_layers: int = 0,
    speculative: SpeculativePlan = SPECULATING,
    **fields: Any,
) -> Plan:
    """A plan that loads ``model`` as given (no fitting): whether the model is recurrent comes from its header,
    as the planner takes it; ``fields`` set any other :class:`Plan` field (``n_batch``, ``parallel``...)."""
    path = Path(model)
    plan = Plan(
        preset="test",
        model_path=str(path),
        quant="file",
        file_bytes=path.stat().st_size,
        ctx=ctx,
        n_gpu_layers=n_gpu_layers,
        n_cpu_moe=0,
        fits=True,
        memory=MemoryPlan(gpus=(), ram=DeviceMemory("ram", 0)),
        speculative=speculative,
        predicted_tokens_per_s=0.0,
        reasons=(),
        threads=threads,
        threads_batch=threads,
        recurrent=read_local_header(path).architecture.recurrent_state_bytes > 0,
    )
    return replace(plan, **fields)


def engine_settings(model: str | Path, *, ctx: int, **fields: Any) -> dict[str, Any]:
    """``load_engine``'s settings for ``model`` (:func:`file_plan`, with the same keywords, rendered by the
    producer); give the loader the same ``speculative``."""
    return llama_settings(file_plan(model, ctx=ctx, **fields)).kwargs()
