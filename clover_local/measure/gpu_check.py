"""The GPU check: for a local model on this machine's GPU, plan, then load with llama-bench, llama-server and the
embedded engine, and put planned next to real: GPU memory (NVML, per process) and decode speed. Optionally
emulate a smaller card by holding memory first (``--free 12G``). ``benchmarks/check_gpu.py`` and
``clover-local doctor --measure`` run it; it needs an NVIDIA GPU.

Each engine runs in its own process, one after another, so NVML's per-process figure is that engine's alone.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from clover_local.detect.units import GIB
from clover_local.plan.types import Plan

Log = Callable[[str], None]


@dataclass
class EngineMeasure:
    decode_tokens_per_s: float | None = None
    peak_gpu_bytes: int | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class CaseReport:
    name: str
    free_bytes: int
    ctx: int
    n_gpu_layers: int
    n_cpu_moe: int
    planned_gpu_bytes: int
    planned_breakdown: dict[str, int]
    predicted_tokens_per_s: float
    speed_source: str
    llama_bench: EngineMeasure
    llama_server: EngineMeasure
    embedded: EngineMeasure
    fit_params: str | None = None


def _gpu_breakdown(plan: Plan) -> dict[str, int]:
    if not plan.memory.gpus:
        return {}
    g = plan.memory.gpus[0]
    return {
        "weights": g.weights_bytes,
        "kv_cache": g.kv_cache_bytes,
        "recurrent": g.recurrent_state_bytes,
        "compute": g.compute_bytes,
        "margin": g.margin_bytes,
    }


def measure_llama_bench(model: Path, plan: Plan, log: Log) -> EngineMeasure:
    from clover_local.measure.llama_bench import beside_llama_server, run_llama_bench

    bench = beside_llama_server("llama-bench")
    if bench is None:
        return EngineMeasure(error="no llama-bench next to llama-server")
    try:
        result = run_llama_bench(bench, model, plan)
    except Exception as exc:
        return EngineMeasure(error=str(exc))
    log(f"  llama-bench tg128: {result.decode_tokens_per_s:.1f} tok/s")
    return EngineMeasure(
        decode_tokens_per_s=result.decode_tokens_per_s, extra={"argv": " ".join(result.argv)}
    )


def measure_llama_server(model: Path, plan: Plan, log: Log) -> EngineMeasure:
    from clover_local.llamacpp import http_client
    from clover_local.llamacpp.binary import find_llama_server
    from clover_local.llamacpp.server import plan_server_argv, start_llama_server
    from clover_local.measure.gpu_memory import PeakSampler

    binary = find_llama_server()
    if binary is None:
        return EngineMeasure(error="no llama-server found")
    argv = plan_server_argv(replace(plan, model_path=str(model)))
    try:
        with contextlib.ExitStack() as stack:
            log_lines: list[str] = []
            server = stack.enter_context(
                start_llama_server(argv, binary=binary, ready_timeout_s=600, on_log=log_lines.append)
            )
            sampler = stack.enter_context(PeakSampler(server.pid or 0))
            body = {
                "prompt": "The history of the city begins",
                "n_predict": 128,
                "temperature": 0,
                "ignore_eos": True,
                "cache_prompt": False,
            }
            rates = []
            for _ in range(2):
                reply = http_client.request(
                    server.url, "POST", "/completion", body, api_key=server.api_key, timeout_s=600
                ).json()
                rates.append(float(reply["timings"]["predicted_per_second"]))
            time.sleep(0.3)
            peak = sampler.peak
    except Exception as exc:
        return EngineMeasure(error=f"{type(exc).__name__}: {exc}")
    log(f"  llama-server: {max(rates):.1f} tok/s, peak GPU {peak / GIB:.2f} GiB")
    buffers = [ln.strip() for ln in log_lines if "buffer size" in ln or "n_rs_seq" in ln]
    return EngineMeasure(decode_tokens_per_s=max(rates), peak_gpu_bytes=peak, extra={"buffers": buffers})


def measure_embedded(model: Path, plan: Plan, log: Log) -> EngineMeasure:
    from clover_local.measure.gpu_memory import PeakSampler
    from clover_local.plan.llama_args import llama_cpp_kwargs

    job: dict[str, Any] = {
        "model": str(model),
        "settings": llama_cpp_kwargs(plan),
        "speculative": asdict(plan.speculative),
    }
    cmd = [sys.executable, "-m", "clover_local.measure.embedded_worker", json.dumps(job)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with PeakSampler(proc.pid) as sampler:
        out, err = proc.communicate(timeout=1200)
    result = next((ln[7:] for ln in out.splitlines() if ln.startswith("RESULT ")), None)
    if proc.returncode != 0 or result is None:
        tail = " / ".join((err or out).strip().splitlines()[-6:])
        return EngineMeasure(peak_gpu_bytes=sampler.peak, error=f"exit {proc.returncode}: {tail}")
    data = json.loads(result)
    log(
        f"  embedded: greedy {data.get('greedy')} tok/s, sampled {data.get('sampled')}, "
        f"greedy+spec {data.get('greedy_spec')}, peak GPU {sampler.peak / GIB:.2f} GiB"
    )
    return EngineMeasure(decode_tokens_per_s=data.get("greedy"), peak_gpu_bytes=sampler.peak, extra=data)


def fit_params_summary(model: Path, plan: Plan) -> str | None:
    """llama-fit-params' own placement for the plan's context on this machine (one line), when available."""
    from clover_local.llamacpp.fit_params import fit_args
    from clover_local.measure.llama_bench import beside_llama_server

    tool = beside_llama_server("llama-fit-params")
    if tool is None:
        return None

    argv = [str(tool), *fit_args(replace(plan, model_path=str(model)), tool)]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    except subprocess.TimeoutExpired:
        return "timed out"
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    return " | ".join(lines[-3:])


def run_case(
    name: str,
    model: Path,
    *,
    preset: str = "clover-35b-a3b",
    free_bytes: int | None = None,
    ctx: int | None = None,
    engines: tuple[str, ...] = ("llama-bench", "llama-server", "embedded"),
    log: Log = print,
) -> CaseReport:
    """Plan and measure one case (the whole card, or ``free_bytes`` left free by holding the rest)."""
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.measure.gpu_memory import GpuMemoryHold

    log(f"case {name}:")
    with GpuMemoryHold(free_bytes) if free_bytes else contextlib.nullcontext() as hold:
        if hold is not None:
            log(f"  holding GPU memory: {hold.report}")
        # The plan the product makes for this file on this machine as it is now (free memory included).
        plan = decide_launch(LaunchRequest(preset, str(model), ctx=ctx)).plan
        log(
            f"  plan: ctx {plan.ctx}, GPU layers {plan.n_gpu_layers}, experts of {plan.n_cpu_moe} layers in RAM, "
            f"GPU {sum(plan.memory.gpu_bytes) / GIB:.2f} GiB, predicted {plan.predicted_tokens_per_s:.0f} tok/s"
        )
        report = CaseReport(
            name=name,
            free_bytes=free_bytes or 0,
            ctx=plan.ctx,
            n_gpu_layers=plan.n_gpu_layers,
            n_cpu_moe=plan.n_cpu_moe,
            planned_gpu_bytes=sum(plan.memory.gpu_bytes),
            planned_breakdown=_gpu_breakdown(plan),
            predicted_tokens_per_s=plan.predicted_tokens_per_s,
            speed_source=plan.speed_source,
            llama_bench=measure_llama_bench(model, plan, log)
            if "llama-bench" in engines
            else EngineMeasure(),
            llama_server=measure_llama_server(model, plan, log)
            if "llama-server" in engines
            else EngineMeasure(),
            embedded=measure_embedded(model, plan, log) if "embedded" in engines else EngineMeasure(),
        )
        if "fit-params" in engines:
            report.fit_params = fit_params_summary(model, plan)
    return report


def format_reports(reports: list[CaseReport]) -> str:
    """The planned-vs-real table, as Markdown."""
    head = (
        "| case | plan | planned GPU | real GPU (server / embedded) | real/planned | llama-bench tg | "
        "llama-server | embedded greedy | embedded/bench | predicted |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    rows = [head]

    def gib(x: int | None) -> str:
        return f"{x / GIB:.2f}" if x else "-"

    def tps(x: float | None) -> str:
        return f"{x:.1f}" if x else "-"

    for r in reports:
        placement = "all layers" if r.n_cpu_moe == 0 else f"--n-cpu-moe {r.n_cpu_moe}"
        real = r.llama_server.peak_gpu_bytes or r.embedded.peak_gpu_bytes
        ratio = f"{real / r.planned_gpu_bytes:.3f}" if real and r.planned_gpu_bytes else "-"
        bench = r.llama_bench.decode_tokens_per_s
        emb = r.embedded.decode_tokens_per_s
        emb_ratio = f"{emb / bench:.2f}" if emb and bench else "-"
        rows.append(
            f"| {r.name} | {placement}, ctx {r.ctx} | {gib(r.planned_gpu_bytes)} GiB | "
            f"{gib(r.llama_server.peak_gpu_bytes)} / {gib(r.embedded.peak_gpu_bytes)} GiB | {ratio} | "
            f"{tps(bench)} | {tps(r.llama_server.decode_tokens_per_s)} | {tps(emb)} | {emb_ratio} | "
            f"{r.predicted_tokens_per_s:.0f} ({r.speed_source}) |"
        )
    return "\n".join(rows)


def reports_to_json(reports: list[CaseReport]) -> list[dict[str, Any]]:
    return [asdict(r) for r in reports]
