"""Run upstream ``llama-bench`` with a plan's placement and read its decode speed (``tg``), the reference the
embedded engine and the speed model are held to."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

from clover_local.engine.repack import bench_argv_here
from clover_local.errors import ServerError
from clover_local.plan.types import Plan


@dataclass(frozen=True)
class BenchResult:
    decode_tokens_per_s: float
    """llama-bench ``tg`` average tokens/s."""
    n_gen: int
    argv: tuple[str, ...]


@dataclass(frozen=True)
class Placement:
    """What llama-bench is told about where the model runs."""

    n_gpu_layers: int
    """-1: all."""
    threads: int
    flash_attn: bool
    n_cpu_moe: int = 0

    @staticmethod
    def of(plan: Plan) -> Placement:
        return Placement(plan.n_gpu_layers, plan.threads, plan.flash_attn == "on", plan.n_cpu_moe)


def beside_llama_server(name: str) -> Path | None:
    """The tool ``name`` (``llama-bench``, ``llama-fit-params``) built beside the llama-server found, if any."""
    from clover_local.llamacpp.binary import find_llama_server

    server = find_llama_server()
    return server.sibling(name) if server else None


def llama_bench_argv(
    binary: Path, model: Path, where: Placement, *, n_gen: int = 128, repetitions: int = 3
) -> list[str]:
    """llama-bench flags for a placement (GPU layers, experts in RAM, threads, flash attention): decode only."""
    ngl = 999 if where.n_gpu_layers < 0 else where.n_gpu_layers
    argv = [str(binary), "-m", str(model), "-ngl", str(ngl), "-t", str(where.threads)]
    argv += ["-fa", "1" if where.flash_attn else "0", "-p", "0", "-n", str(n_gen)]
    argv += ["-r", str(repetitions), "-o", "json"]
    if where.n_cpu_moe:
        argv += ["-ncmoe", str(where.n_cpu_moe)]
    return argv


def parse_llama_bench_json(text: str) -> float:
    """The ``tg`` average tokens/s from ``llama-bench -o json`` output."""
    start = text.find("[")
    if start < 0:
        raise ValueError("no JSON array in llama-bench's output")
    rows = json.loads(text[start : text.rindex("]") + 1])
    gen = [r for r in rows if int(r.get("n_gen", 0)) > 0 and int(r.get("n_prompt", 0)) == 0]
    if not gen:
        raise ValueError("llama-bench reported no decode (tg) run")
    return float(gen[-1]["avg_ts"])


def run_llama_bench(
    binary: Path, model: Path, where: Plan | Placement, *, n_gen: int = 128, timeout_s: float = 900
) -> BenchResult:
    """llama-bench's decode speed for a plan's placement (or one given directly)."""
    placement = where if isinstance(where, Placement) else Placement.of(where)
    argv = bench_argv_here(llama_bench_argv(binary, model, placement, n_gen=n_gen))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        raise ServerError(f"llama-bench did not finish within {timeout_s:.0f} s.") from None
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise ServerError(f"llama-bench failed (exit {done.returncode}): {' / '.join(tail)}")
    return BenchResult(parse_llama_bench_json(done.stdout), n_gen, tuple(argv))
