"""Beyond home machines: the command that serves the same model on a GPU server with vLLM or SGLang, with the
plan's context and the server's GPUs as tensor parallelism. Both serve the Hugging Face (safetensors) model, not
the GGUF, and run its custom code (``--trust-remote-code``). Flags as documented by each engine:
vLLM ``vllm serve MODEL --max-model-len --tensor-parallel-size --gpu-memory-utilization``
(docs.vllm.ai, serving/engine_args), SGLang ``python -m sglang.launch_server --model-path --context-length
--tp-size --mem-fraction-static`` (docs.sglang.io, advanced_features/server_arguments).
"""

from __future__ import annotations

import re

from clover_local.plan.types import Plan
from clover_local.presets import Preset

MAX_TENSOR_PARALLEL = 8
GPU_MEMORY_FRACTION = 0.9
"""vLLM's default ``--gpu-memory-utilization`` and SGLang's ``--mem-fraction-static`` ballpark; stated so it can
be lowered when the GPUs are shared."""


def hf_model(preset: Preset) -> str:
    """The safetensors repo the GGUF repo was made from: ``Org/Name-GGUF`` -> ``Org/Name``."""
    return re.sub(r"[-_]GGUF$", "", preset.repo, flags=re.IGNORECASE)


def local_gpu_count(plan: Plan) -> int:
    """GPUs of the planned machine itself (devices lent over RPC are named ``host:port/RPCn``)."""
    return sum(1 for g in plan.memory.gpus if "/" not in g.name)


def tensor_parallel(plan: Plan) -> int:
    """The largest power of two GPUs of the machine, at most 8: tensor parallelism splits attention heads, and
    both engines want a power of two that divides them."""
    n = max(local_gpu_count(plan), 1)
    tp = 1
    while tp * 2 <= min(n, MAX_TENSOR_PARALLEL):
        tp *= 2
    return tp


def vllm_argv(
    plan: Plan, preset: Preset, model: str | None = None, host: str = "127.0.0.1", port: int = 8000
) -> list[str]:
    names = ("--max-model-len", "--tensor-parallel-size", "--gpu-memory-utilization")
    flags = _flags(plan, preset, host, port, names, GPU_MEMORY_FRACTION)
    return ["vllm", "serve", model or hf_model(preset), *flags]


def sglang_argv(
    plan: Plan, preset: Preset, model: str | None = None, host: str = "127.0.0.1", port: int = 30000
) -> list[str]:
    names = ("--context-length", "--tp-size", "--mem-fraction-static")
    flags = _flags(plan, preset, host, port, names, GPU_MEMORY_FRACTION - 0.05)
    return ["python3", "-m", "sglang.launch_server", "--model-path", model or hf_model(preset), *flags]


def _flags(
    plan: Plan, preset: Preset, host: str, port: int, names: tuple[str, str, str], memory_fraction: float
) -> list[str]:
    """What both engines take after the model, with each one's flag ``names`` for the context, the tensor
    parallelism and the share of GPU memory."""
    values = (str(plan.ctx), str(tensor_parallel(plan)), f"{memory_fraction:g}")
    tuned = [arg for pair in zip(names, values, strict=True) for arg in pair]
    served = ["--served-model-name", preset.name, "--host", host, "--port", str(port)]
    return ["--trust-remote-code", *tuned, *served]


def notes(plan: Plan) -> list[str]:
    """What the person should know about the vLLM / SGLang command."""
    out = [
        f"serves the Hugging Face (safetensors) model with context {plan.ctx} (the plan's) and tensor parallelism "
        f"{tensor_parallel(plan)} over {local_gpu_count(plan)} GPU(s) of this (or the --simulate) machine",
    ]
    if local_gpu_count(plan) == 0:
        out.append(
            "this machine has no usable GPU: run it on a GPU server, and plan for it with --simulate "
            "gpu=nvidia:80G,gpu=nvidia:80G,..."
        )
    elif local_gpu_count(plan) > tensor_parallel(plan):
        out.append(
            f"{local_gpu_count(plan) - tensor_parallel(plan)} GPU(s) left out: tensor parallelism takes a power of two"
        )
    if plan.rpc_servers:
        out.append(
            "RPC workers are a llama.cpp feature: these engines span machines with their own multi-node setup "
            "(vLLM: Ray and --pipeline-parallel-size; SGLang: --nnodes/--node-rank), not with --rpc"
        )
    return out
