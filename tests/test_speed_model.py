"""The speed model against measurements: three placements of a Clover-shaped Q4_K_M on an H200 (issue 10's
table, ``tests/data/h200_clover_shaped.json``) and Gemma 3 270M on this project's 2-core CPU machine must all be
predicted within 25%; recorded llama-bench runs replace or calibrate the estimate."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from clover_local.detect.machine import Cpu, Disk, Gpu, LlamaBuild, Machine, Memory
from clover_local.gguf.model import ModelDescription, TensorEntry
from clover_local.plan import memory
from clover_local.plan.measured import SpeedRecord, machine_key, model_key
from clover_local.plan.planner import layer_work, make_plan
from clover_local.plan.speed import predict_tokens_per_s
from clover_local.presets import load_preset
from clover_local.testing.clover_shaped import tensor_plan

GIB = 1024**3
DATA = json.loads((Path(__file__).parent / "data" / "h200_clover_shaped.json").read_text())


def clover_shaped() -> ModelDescription:
    """The exact tensor table of the Clover-shaped file (no need to write its 19.7 GiB)."""
    entries = tuple(TensorEntry.classify(t.name, t.n_bytes) for t in tensor_plan())
    return ModelDescription(
        architecture=load_preset("clover-35b-a3b").architecture,
        file_bytes=sum(e.n_bytes for e in entries),
        quant="Q4_K_M",
        tensors=entries,
        source="clover-shaped tensor plan",
    )


def h200(free_gib: float) -> Machine:
    m = DATA["machine"]
    return Machine(
        cpu=Cpu("H200 host", m["cores"], m["cores"]),
        memory=Memory(m["ram_gib"] * GIB, (m["ram_gib"] - 8) * GIB),
        disk=Disk("/", 64 * GIB, 40 * GIB),
        gpus=(
            Gpu(
                0,
                "nvidia",
                "NVIDIA H200",
                int(m["gpu_total_gib"] * GIB),
                int(free_gib * GIB),
                bandwidth_bytes_per_s=m["bandwidth_tb_s"] * 1e12,
            ),
        ),
        build=LlamaBuild("0.3.36", True, ("cuda", "cpu")),
    )


def predicted(machine: Machine, desc: ModelDescription, ctx: int, n_gpu_layers: int, n_cpu_moe: int) -> float:
    placement = memory.place(
        desc, ctx=ctx, n_gpus=len(machine.gpus), n_gpu_layers=n_gpu_layers, n_cpu_moe=n_cpu_moe
    )
    gpu, ram = memory.active_bytes_per_token(desc, placement, min(ctx, 4096))
    work = layer_work(desc, placement, len(machine.gpus), min(ctx, 4096))
    return predict_tokens_per_s(machine, gpu, ram, work, machine.cpu.physical_cores)[0]


@pytest.mark.parametrize("case", DATA["cases"], ids=[c["name"] for c in DATA["cases"]])
def test_gpu_speed_within_a_quarter_of_llama_bench(case: dict) -> None:
    desc = clover_shaped()
    tps = predicted(h200(case["gpu_free_gib"]), desc, case["ctx"], -1, case["n_cpu_moe"])
    assert tps == pytest.approx(case["decode_tokens_per_s"], rel=0.25), tps


def test_cpu_speed_within_a_quarter_of_the_two_core_machine(gemma_path: Path) -> None:
    """Gemma 3 270M Q4_K_M, CPU, 2 threads, at the start of a conversation (512 tokens): 64-72 tokens/s measured
    (docs/measurements.md, engine benchmark; 62.5 by benchmarks/check_speed_prediction.py on 6 December 2026)."""
    from clover_local.gguf.header import read_local_header

    desc = read_local_header(gemma_path)
    machine = Machine(
        cpu=Cpu("2-core VM", 2, 2), memory=Memory(24 * GIB, 22 * GIB), disk=Disk("/", 100 * GIB, 80 * GIB)
    )
    assert predicted(machine, desc, 512, 0, 0) == pytest.approx(68.0, rel=0.25)


def test_recorded_runs_replace_or_calibrate_the_estimate() -> None:
    desc = clover_shaped()
    machine = h200(20.0)
    preset = load_preset("clover-35b-a3b")
    plain = make_plan(machine, preset, desc)
    assert plain.speed_source == "estimate"
    key = dict(machine=machine_key(machine), model=model_key(desc.quant, desc.file_bytes))
    here = SpeedRecord(
        **key,
        n_gpu_layers=plain.n_gpu_layers,
        n_cpu_moe=plain.n_cpu_moe,
        tokens_per_s=150.0,
        predicted_tokens_per_s=plain.estimated_tokens_per_s,
        when="2026-11-30",
    )
    measured = make_plan(machine, preset, desc, speed_records=[here])
    assert (measured.speed_source, measured.predicted_tokens_per_s) == ("measured", 150.0)
    assert any("measured with llama-bench on this machine on 2026-11-30" in r.text for r in measured.reasons)

    elsewhere = SpeedRecord(
        **key, n_gpu_layers=-1, n_cpu_moe=plain.n_cpu_moe + 7, tokens_per_s=100.0, predicted_tokens_per_s=80.0
    )
    calibrated = make_plan(machine, preset, desc, speed_records=[elsewhere])
    assert calibrated.speed_source == "calibrated"
    assert calibrated.predicted_tokens_per_s == pytest.approx(plain.estimated_tokens_per_s * 1.25, rel=0.01)

    other_threads = replace(here, threads=plain.threads + 1)  # a measurement at other threads only calibrates
    assert make_plan(machine, preset, desc, speed_records=[other_threads]).speed_source == "calibrated"
    same_threads = replace(here, threads=plain.threads)
    assert make_plan(machine, preset, desc, speed_records=[same_threads]).speed_source == "measured"

    other_machine = SpeedRecord(
        **{**key, "machine": "another"},
        n_gpu_layers=-1,
        n_cpu_moe=0,
        tokens_per_s=1.0,
        predicted_tokens_per_s=2.0,
    )
    assert make_plan(machine, preset, desc, speed_records=[other_machine]).speed_source == "estimate"


@pytest.mark.parametrize(("measured", "written"), [(2.54, "2.5"), (2.5, "2.5"), (12.54, "12"), (0.96, "1.0")])
def test_the_summary_and_the_reasons_write_one_speed(measured: float, written: str) -> None:
    """The plan keeps its speed rounded to a tenth and its reasons saw it unrounded: both are written by one
    function, so 2.54 tokens/s is "2.5" in the summary and in the reasons (it was "about 2" and "~3")."""
    from clover_local.plan.render import describe_plan, plan_summary

    desc = clover_shaped()
    machine = h200(20.0)
    preset = load_preset("clover-35b-a3b")
    plain = make_plan(machine, preset, desc)
    record = SpeedRecord(
        machine=machine_key(machine),
        model=model_key(desc.quant, desc.file_bytes),
        n_gpu_layers=plain.n_gpu_layers,
        n_cpu_moe=plain.n_cpu_moe,
        tokens_per_s=measured,
        predicted_tokens_per_s=plain.estimated_tokens_per_s,
    )
    plan = make_plan(machine, preset, desc, speed_records=[record])
    assert f"Predicted speed: about {written} tokens/s" in plan_summary(plan)
    assert any(r.text.startswith(f"Decode ~{written} tokens/s: measured") for r in plan.reasons), plan.reasons
    assert (
        f"~{written} tokens/s (measured)" in describe_plan(plan, preset)[0]
    )  # not "(estimate)": it was measured


SESSION = DATA["measured_2026_11_30"]


@pytest.mark.parametrize(
    "case", [c for c in SESSION["cases"] if "real_peak_bytes" in c], ids=lambda c: c["name"]
)
def test_planned_gpu_memory_matches_the_real_peak(case: dict) -> None:
    """The plan's GPU memory for the embedded engine (buffers plus the CUDA runtime) against NVML's peak for the
    process: within 5% either way."""
    from dataclasses import replace

    from clover_local.plan.fit import evaluate
    from clover_local.plan.memory import runtime_overhead_bytes

    desc = clover_shaped()
    fit = evaluate(
        h200(case["gpu_free_gib"]),
        desc,
        case["ctx"],
        n_gpu_layers=-1,
        n_cpu_moe=case["n_cpu_moe"],
        cache_type="f16",
        recurrent_copies=case["recurrent_copies"],
        engine="embedded",
    )
    planned = fit.memory.gpus[0]
    ratio = case["real_peak_bytes"] / planned.used_bytes
    assert 0.95 <= ratio <= 1.05, (ratio, replace(planned))
    buffers = case["buffers_mib"]
    assert planned.weights_bytes / 2**20 == pytest.approx(buffers["model"], rel=0.001)
    assert planned.recurrent_state_bytes / 2**20 == pytest.approx(buffers["rs"], rel=0.005)
    assert planned.kv_cache_bytes / 2**20 == pytest.approx(buffers["kv"], rel=0.001)
    assert runtime_overhead_bytes("cuda", "embedded") == planned.runtime_bytes


@pytest.mark.parametrize(("free_gib", "fit_params_moe"), [(20.0, 4), (12.0, 22)])
def test_llama_server_plans_as_many_experts_on_the_gpu_as_llama_fit_params(
    free_gib: float, fit_params_moe: int
) -> None:
    """llama-server holds one recurrent state (no snapshots for n-gram drafting) and less runtime memory, so its
    plan keeps one more layer's experts on the GPU than before, as llama-fit-params does, with the 1 GiB margin."""
    from clover_local.plan.types import Wishes

    preset = load_preset("clover-35b-a3b")
    server = make_plan(h200(free_gib), preset, clover_shaped(), Wishes(ctx=16384, engine="llama-server"))
    assert server.n_cpu_moe == fit_params_moe
    gpu = server.memory.gpus[0]
    assert gpu.used_bytes + gpu.margin_bytes <= gpu.capacity_bytes
    embedded = make_plan(h200(free_gib), preset, clover_shaped(), Wishes(ctx=16384))
    assert embedded.n_cpu_moe > server.n_cpu_moe  # its runtime and rollback snapshots take more room


@pytest.mark.parametrize("case", [c for c in SESSION["cases"] if "llama_bench" in c], ids=lambda c: c["name"])
def test_speed_within_a_quarter_of_this_sessions_llama_bench(case: dict) -> None:
    tps = predicted(h200(case["gpu_free_gib"]), clover_shaped(), case["ctx"], -1, case["n_cpu_moe"])
    assert tps == pytest.approx(case["llama_bench"], rel=0.25), tps
