"""Planner table tests over described machines: the choices, and that planned memory stays under each GPU's free
memory minus the margin (and RAM likewise) whenever the plan says it fits."""

from __future__ import annotations

import json

import pytest

from clover_local.cli import main
from clover_local.detect import parse_simulate
from clover_local.errors import UsageError
from clover_local.plan import memory
from clover_local.plan.planner import make_plan
from clover_local.plan.types import Plan, SpeculativePlan, Wishes
from clover_local.presets import load_preset

GIB = 1024**3


@pytest.fixture(autouse=True)
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI tests here plan from the preset's estimates: no request to the real Hub (tests/test_plan_sizes.py
    covers sizes from GGUF headers against the fake Hub)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def clover():
    return load_preset("clover-35b-a3b")


def plan_for(spec: str, clover, **wishes) -> Plan:
    return make_plan(parse_simulate(spec), clover, None, Wishes(**wishes))


def assert_within_memory(plan: Plan, spec: str) -> None:
    machine = parse_simulate(spec)
    for gpu, planned in zip(machine.gpus, plan.memory.gpus, strict=False):
        assert planned.capacity_bytes == gpu.free_bytes
        assert planned.used_bytes <= gpu.free_bytes - memory.GPU_MARGIN_BYTES, (spec, planned)
    if plan.fits:
        ram = plan.memory.ram
        assert ram.used_bytes + ram.margin_bytes <= ram.capacity_bytes <= machine.memory.available_bytes


# spec, quant, n_gpu_layers, (min, max) n_cpu_moe, ctx range, fits. Planned for the embedded engine, which holds
# the CUDA runtime (1.2 GiB, measured on an H200) and, for n-gram speculation, a copy of the recurrent state
# (63 MiB) to roll a draft back to.
TABLE = [
    ("ram=16G,cpu=8", "Q4_K_M", 0, (0, 0), (16384, 16384), False),
    ("ram=64G,cpu=16", "Q8_0", 0, (0, 0), (16384, 65536), True),
    ("gpu=nvidia:8G,ram=16G", "Q4_K_M", -1, (34, 38), (16384, 16384), False),
    ("gpu=nvidia:8G,ram=32G", "Q4_K_M", -1, (34, 38), (16384, 16384), True),
    ("gpu=nvidia:8G,ram=64G", "Q4_K_M", -1, (34, 38), (16384, 16384), True),
    ("gpu=nvidia:12G,ram=16G", "Q4_K_M", -1, (26, 30), (16384, 16384), True),
    ("gpu=nvidia:12G,ram=32G", "Q4_K_M", -1, (26, 30), (16384, 16384), True),
    ("gpu=nvidia:12G,ram=64G", "Q4_K_M", -1, (26, 30), (16384, 16384), True),
    ("gpu=nvidia:16G,ram=16G", "Q4_K_M", -1, (17, 21), (16384, 16384), True),
    ("gpu=nvidia:16G,ram=32G", "Q4_K_M", -1, (17, 21), (16384, 16384), True),
    ("gpu=nvidia:16G,ram=64G", "Q4_K_M", -1, (17, 21), (16384, 16384), True),
    ("gpu=nvidia:24G,ram=16G", "Q4_K_M", -1, (1, 5), (16384, 16384), True),
    ("gpu=nvidia:24G,ram=32G", "Q4_K_M", -1, (1, 5), (16384, 16384), True),
    ("gpu=nvidia:24G,ram=64G", "Q4_K_M", -1, (1, 5), (16384, 16384), True),
    ("gpu=nvidia:24G,gpu=nvidia:24G,ram=64G", "Q8_0", -1, (0, 0), (16384, 65536), True),
    ("gpu=nvidia:80G,ram=128G", "Q8_0", -1, (0, 0), (16384, 65536), True),
    ("unified=36G", "Q4_K_M", -1, (0, 0), (16384, 65536), True),
    ("unified=64G", "Q8_0", -1, (0, 0), (16384, 65536), True),
    ("unified=128G", "Q8_0", -1, (0, 0), (16384, 65536), True),
]


@pytest.mark.parametrize(("spec", "quant", "ngl", "moe", "ctx", "fits"), TABLE, ids=[t[0] for t in TABLE])
def test_plan_table(spec, quant, ngl, moe, ctx, fits, clover) -> None:
    plan = plan_for(spec, clover)
    assert plan.quant == quant
    assert plan.n_gpu_layers == ngl
    assert moe[0] <= plan.n_cpu_moe <= moe[1]
    assert ctx[0] <= plan.ctx <= ctx[1]
    assert plan.fits is fits
    assert_within_memory(plan, spec)
    assert plan.predicted_tokens_per_s > 0
    assert any("estimate" in r.text for r in plan.reasons)
    assert len(plan.memory.gpus) == len(parse_simulate(spec).gpus) * (ngl != 0)


def test_more_vram_means_fewer_experts_in_ram_and_faster(clover) -> None:
    plans = [plan_for(f"gpu=nvidia:{g}G,ram=64G", clover) for g in (8, 12, 16, 24, 32)]
    moes = [p.n_cpu_moe for p in plans]
    assert moes == sorted(moes, reverse=True) and moes[-1] == 0
    speeds = [p.predicted_tokens_per_s for p in plans]
    assert speeds == sorted(speeds)


def test_n_cpu_moe_is_the_smallest_that_fits(clover) -> None:
    from clover_local.gguf.model import describe_from_preset
    from clover_local.plan.fit import evaluate

    spec = "gpu=nvidia:12G,ram=32G"
    plan = plan_for(spec, clover)
    fewer = evaluate(
        parse_simulate(spec),
        describe_from_preset(clover, "Q4_K_M"),
        plan.ctx,
        n_gpu_layers=-1,
        n_cpu_moe=plan.n_cpu_moe - 1,
        cache_type="q8_0",
        # What the placement was fitted with: the preset's n-gram drafting (the state and the copy a draft's
        # rollback needs), before the GPU rule turned speculation off.
        recurrent_copies=memory.recurrent_copies(
            describe_from_preset(clover, "Q4_K_M").architecture, SpeculativePlan(enabled=True)
        ),
    )
    assert not fewer.gpus_fit
    assert f"--n-cpu-moe {plan.n_cpu_moe}" in " ".join(r.text for r in plan.reasons)


def test_two_gpus_each_checked_alone_and_split_by_layers(clover) -> None:
    plan = plan_for("gpu=nvidia:24G,gpu=nvidia:24G,ram=64G", clover)
    assert len(plan.tensor_split) == 2 and sum(plan.tensor_split) == 41  # 40 layers + output head
    assert all(0 < g < 24 * GIB - memory.GPU_MARGIN_BYTES for g in plan.memory.gpu_bytes)
    # Q8_0 (35 GiB) fits only because it is split: neither GPU could hold it alone.
    assert plan.file_bytes > 24 * GIB


def test_uneven_gpus_get_uneven_layers(clover) -> None:
    plan = plan_for("gpu=nvidia:24G,gpu=nvidia:12G,ram=64G", clover, quant="Q4_K_M")
    assert plan.tensor_split[0] > plan.tensor_split[1]
    assert_within_memory(plan, "gpu=nvidia:24G,gpu=nvidia:12G,ram=64G")


def test_gpu_with_cpu_only_build_plans_cpu_and_says_how_to_rebuild(clover) -> None:
    plan = plan_for("gpu=nvidia:24G,ram=64G,backend=cpu", clover)
    assert plan.n_gpu_layers == 0 and plan.memory.gpus == () and plan.backend == "cpu"
    text = " ".join(r.text for r in plan.reasons)
    assert "cannot offload" in text and "CMAKE_ARGS" in text


def test_apple_unified_checks_working_set_and_ram(clover) -> None:
    plan = plan_for("unified=36G", clover)
    gpu = plan.memory.gpus[0]
    machine = parse_simulate("unified=36G")
    assert gpu.capacity_bytes == machine.gpus[0].free_bytes == 24 * GIB  # 2/3 of 36 GiB
    assert plan.memory.ram.capacity_bytes == machine.memory.available_bytes - gpu.used_bytes
    assert plan.load_mode == "mmap"


def test_speed_goal_picks_the_smaller_quant(clover) -> None:
    plan = plan_for("gpu=nvidia:80G,ram=128G", clover, goal="speed")
    assert plan.quant == "Q4_K_M"
    assert plan.alternatives[0].quant == "Q8_0" and plan.alternatives[0].fits


def test_full_gpu_loads_without_mmap_partial_with_mmap(clover) -> None:
    assert plan_for("gpu=nvidia:32G,ram=32G", clover).load_mode == "none"
    assert plan_for("gpu=nvidia:12G,ram=32G", clover).load_mode == "mmap"
    assert plan_for("ram=64G", clover).load_mode == "mmap"


def test_requested_ctx_is_honoured(clover) -> None:
    plan = plan_for("gpu=nvidia:24G,ram=32G", clover, ctx=8192)
    assert plan.ctx == 8192
    assert any("as asked" in r.text for r in plan.reasons)


def test_requested_ctx_too_large_is_refused_with_the_limit(clover) -> None:
    with pytest.raises(UsageError) as err:
        plan_for("gpu=nvidia:24G,ram=32G", clover, ctx=262144)
    assert "131072" in str(err.value)


def test_large_ctx_is_paid_with_q8_kv_then_experts_in_ram(clover) -> None:
    # 128K needs a few layers' experts in RAM on a 24 GB card (beside the CUDA runtime's 1.2 GiB); speculation
    # adds one copy of the recurrent state (63 MiB), which a rejected n-gram draft is rolled back to.
    plain24 = plan_for("gpu=nvidia:24G,ram=64G", clover, ctx=131072, speculative=False)
    assert plain24.ctx == 131072 and 0 < plain24.n_cpu_moe <= 4 and plain24.cache_type_k == "q8_0"
    big24 = plan_for("gpu=nvidia:24G,ram=64G", clover, ctx=131072)
    assert big24.ctx == 131072 and plain24.n_cpu_moe <= big24.n_cpu_moe <= plain24.n_cpu_moe + 1
    assert big24.cache_type_k == "q8_0"
    spec_state = big24.memory.gpus[0].recurrent_state_bytes
    assert spec_state == pytest.approx(2 * plain24.memory.gpus[0].recurrent_state_bytes, rel=1e-6)
    assert big24.flash_attn == "on"  # a quantized V cache needs flash attention
    small16 = plan_for("gpu=nvidia:16G,ram=64G", clover)
    big16 = plan_for("gpu=nvidia:16G,ram=64G", clover, ctx=131072)
    assert big16.n_cpu_moe > small16.n_cpu_moe
    for plan, spec in ((big24, "gpu=nvidia:24G,ram=64G"), (big16, "gpu=nvidia:16G,ram=64G")):
        assert_within_memory(plan, spec)


def test_q8_forced_on_small_machine_does_not_fit_and_says_why(clover) -> None:
    plan = plan_for("ram=16G", clover, quant="Q8_0")
    assert plan.quant == "Q8_0" and plan.fits is False
    advice = next(r.text for r in plan.reasons if r.code == "does-not-fit")
    assert "ram needs" in advice and "Q4_K_M" in advice
    assert "--ctx" not in advice, "no context makes Q8_0's 37 GiB fit in 16 GB: none is advised"


def test_unknown_quant_is_a_usage_error(clover) -> None:
    with pytest.raises(UsageError, match="no quant 'Q2_K'"):
        plan_for("ram=64G", clover, quant="Q2_K")


def test_kv_cache_matches_clover_arithmetic(clover) -> None:
    arch = clover.architecture
    assert memory.kv_bytes_per_token(arch) == 10 * 2 * 256 * 2 * 2  # 20 KiB per token at f16
    assert memory.kv_cache_bytes(arch, 32768) == 640 * 1024**2
    assert memory.kv_cache_bytes(arch, 32768, "q8_0", "q8_0") == 340 * 1024**2
    assert memory.kv_cache_bytes(arch, 1000) == memory.kv_cache_bytes(arch, 1024)  # padded to 256 cells


def test_gemma_swa_layers_hold_window_plus_ubatch() -> None:
    arch = load_preset("gemma3-270m").architecture
    cells = memory.kv_cells_per_layer(arch, 4096, n_ubatch=512)
    assert cells.count(4096) == 3 and cells.count(1024) == 15  # llama.cpp: 3 global layers, 15 SWA
    assert memory.kv_cells_per_layer(arch, 768)[0] == 768  # never more than the context


def test_cli_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--simulate", "gpu=nvidia:12G,ram=32G", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    for key in ("quant", "file_bytes", "ctx", "n_gpu_layers", "n_cpu_moe", "fits", "speculative"):
        assert key in data
    assert data["quant"] == "Q4_K_M" and data["fits"] is True
    assert len(data["memory"]["gpu_bytes"]) == 1 and data["memory"]["ram_bytes"] > 0
    assert data["memory"]["gpus"][0]["weights_bytes"] > 0
    assert "--n-cpu-moe" in data["llama_server_args"]
    assert len(data["llama_cpp_kwargs"]["tensor_buft_overrides"]) == data["n_cpu_moe"]
    assert data["predicted_tokens_per_s"] > 0 and data["reasons"]


def test_cli_plan_text_and_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--simulate", "unified=64G"]) == 0
    text = capsys.readouterr().out
    assert "Q8_0" in text and "gpu0" in text and "Why:" in text
    assert main(["command", "--simulate", "gpu=nvidia:8G,ram=32G"]) == 0
    said, line = capsys.readouterr().out.strip().splitlines()  # no runtime here: the release it needs first
    assert said == "# needs llama.cpp b12060 or newer: install it with `clover-local runtime install b12060`"
    assert line.startswith(
        "llama-server -hf Diffuspace/Clover-35B-A3B-Preview-GGUF:Q4_K_M --no-mmproj -c 16384"
    )
    assert "--n-cpu-moe" in line and "--fit off" in line and line.endswith("--host 127.0.0.1 --port 8080")


def test_cli_bad_input_is_an_error_not_a_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--simulate", "gpu=nvidia:lots"]) == 2
    assert main(["plan", "--simulate", "ram=32G", "--ctx", "999999999"]) == 2
    assert main(["plan", "--simulate", "ram=32G", "--model", "/nonexistent.gguf"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 3


@pytest.mark.slow
def test_cli_plan_with_a_local_gguf_uses_exact_sizes(capsys: pytest.CaptureFixture[str]) -> None:
    from clover_local.testing.models import gemma_path

    path = str(gemma_path())
    code = main(["plan", "--preset", "gemma3-270m", "--model", path, "--simulate", "ram=16G", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["estimated"] is False and data["model_path"] == path
    assert data["llama_server_args"][:2] == ["-m", path] and data["llama_cpp_kwargs"]["model_path"] == path
    # CPU only, tied embeddings shared: the weights in RAM are the file's tensor data (llama.cpp logs
    # 235.16 MiB mapped + 12.66 MiB repacked for this file).
    weights = data["memory"]["ram"]["weights_bytes"]
    assert 0.9 * 247.8 * 1024**2 <= weights <= data["file_bytes"]


def test_llama_server_keeps_all_of_q4_k_m_on_a_24_gib_card(clover) -> None:
    """llama-server holds no rollback snapshots for n-gram drafting and less runtime memory than the embedded
    engine, so the same card takes every layer for it."""
    server = make_plan(parse_simulate("gpu=nvidia:24G,ram=32G"), clover, None, Wishes(engine="llama-server"))
    embedded = make_plan(parse_simulate("gpu=nvidia:24G,ram=32G"), clover, None, Wishes())
    assert (server.n_cpu_moe, server.engine) == (0, "llama-server")
    assert embedded.n_cpu_moe > 0
    assert server.memory.gpus[0].runtime_bytes < embedded.memory.gpus[0].runtime_bytes
    assert any("runtime itself" in r.text for r in server.reasons)


@pytest.mark.parametrize(
    ("n_gpu_layers", "n_cpu_moe", "words"),
    [
        (0, 0, "CPU only"),
        (-1, 0, "all on the GPU"),
        (-1, 12, "experts of 12 layers in RAM"),
        (20, 0, "20 layers on the GPU"),  # a dense model offloaded in part (the community reason said "all")
    ],
)
def test_every_reason_names_a_placement_in_the_same_words(
    n_gpu_layers: int, n_cpu_moe: int, words: str
) -> None:
    from clover_local.plan.fit import placement_words

    assert placement_words(n_gpu_layers, n_cpu_moe) == words
