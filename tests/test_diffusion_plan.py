"""Diffusion detection, planning and the schedule arithmetic (pure, no llama.cpp); the architecture check is in
test_arch_support.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_local.engine.diffusion_schedule import (
    DiffusionParams,
    Mt19937,
    parse_algorithm,
    transfer_count,
    transfer_counts_for_block,
)
from clover_local.errors import UsageError
from clover_local.gguf.header import read_local_header
from clover_local.plan.diffusion import DiffusionWishes, plan_diffusion, wants_diffusion


@pytest.fixture(scope="module")
def headers() -> dict[str, object]:
    from clover_local.testing.models import tiny_model

    return {kind: read_local_header(tiny_model(kind)) for kind in ("dream", "llada-moe", "llama")}


def test_header_says_diffusion(headers: dict[str, object]) -> None:
    dream, llada, llama = headers["dream"], headers["llada-moe"], headers["llama"]
    assert dream.diffusion is not None and dream.diffusion.shift_logits  # key absent: llama.cpp's default
    assert not dream.diffusion.shift_logits_in_header
    assert llada.diffusion is not None and llada.diffusion.shift_logits is False
    assert llada.diffusion.mask_token_id == llada.architecture.n_vocab - 1
    assert llama.diffusion is None


def test_plan_defaults_per_family(headers: dict[str, object]) -> None:
    dream_plan, reasons = plan_diffusion(headers["dream"])
    assert dream_plan.schedule == "timestep" and dream_plan.eps == pytest.approx(0.001)
    assert dream_plan.steps_per_block == dream_plan.answer_length // 2
    assert any("timestep schedule" in r.text for r in reasons)
    llada_plan, reasons = plan_diffusion(headers["llada-moe"], ctx=512)
    assert llada_plan.schedule == "block" and llada_plan.block_length == 32
    assert llada_plan.steps_per_block == 16 and llada_plan.canvas == 512
    assert any("n_ubatch = 512" in r.text for r in reasons)
    wished, reasons = plan_diffusion(
        headers["llada-moe"], wishes=DiffusionWishes(block_length=0, steps_per_block=8, algorithm="entropy")
    )
    assert wished.schedule == "timestep" and wished.steps_per_block == 8 and wished.algorithm == "entropy"
    assert any("as asked" in r.text for r in reasons)


def test_diffusion_on_autoregressive_model_is_an_error(headers: dict[str, object]) -> None:
    from dataclasses import replace

    from clover_local.presets import load_preset

    preset = replace(load_preset("gemma3-270m"), decoding="diffusion")
    with pytest.raises(UsageError, match="decodes left to right"):
        wants_diffusion(preset, headers["llama"])
    with pytest.raises(UsageError, match="not a diffusion model"):
        plan_diffusion(headers["llama"])
    assert wants_diffusion(None, headers["dream"]) is True
    assert wants_diffusion(None, headers["llama"]) is False


def test_preset_diffusion_table(tmp_path: Path) -> None:
    from clover_local.presets import load_preset_file

    base = (Path(__file__).resolve().parent.parent / "presets" / "gemma3-270m.toml").read_text()
    path = tmp_path / "d.toml"
    path.write_text(
        'decoding = "diffusion"\n' + base + '\n[diffusion]\nalgorithm = "margin"\nblock_length = 16\n'
        "steps_per_block = 4\nanswer_length = 128\n"
    )
    preset = load_preset_file(path)
    assert preset.decoding == "diffusion"
    assert preset.diffusion.algorithm == "margin" and preset.diffusion.block_length == 16
    path.write_text(base + '\n[diffusion]\nalgorithm = "fastest"\n')
    with pytest.raises(Exception, match=r"diffusion\.algorithm"):
        load_preset_file(path)


def test_memory_plan_has_no_kv_and_canvas_sized_buffers(headers: dict[str, object]) -> None:
    from clover_local.plan import memory

    desc = headers["llada-moe"]
    p_small = memory.place(desc, ctx=256, n_gpus=0, n_gpu_layers=0, n_cpu_moe=0, n_ubatch=256)
    p_big = memory.place(desc, ctx=1024, n_gpus=0, n_gpu_layers=0, n_cpu_moe=0, n_ubatch=1024)
    assert p_small.ram_kv == 0 and p_big.ram_kv == 0
    n_vocab = desc.architecture.n_vocab
    # The output buffer holds the logits of every canvas position.
    assert p_big.ram_compute - p_small.ram_compute >= (1024 - 256) * n_vocab * 4


def test_transfer_schedules_match_the_cpp() -> None:
    assert transfer_counts_for_block(10, 4) == [3, 3, 2, 2]
    params = DiffusionParams(max_length=64, steps=8, mask_token_id=0, eps=0.001)
    remaining, total = 60, 0
    for step in range(8):
        n = transfer_count(step, 8, remaining, params, [])
        total += n
        remaining -= n
    assert remaining == 0 and total == 60  # the last step unmasks whatever is left
    with pytest.raises(ValueError, match="exactly one"):
        DiffusionParams(max_length=64, steps=8, mask_token_id=0).check(4)
    with pytest.raises(ValueError, match="multiple of the number of blocks"):
        DiffusionParams(max_length=64, steps=3, mask_token_id=0, block_length=32).check(4)


def test_mt19937_matches_std() -> None:
    rng = Mt19937(5489)
    assert rng.next_u32() == 3499211612  # std::mt19937's 1st output for the default seed
    assert parse_algorithm("Entropy") == parse_algorithm(1)
    with pytest.raises(ValueError, match="unknown diffusion algorithm"):
        parse_algorithm("best")


def test_make_plan_for_a_diffusion_gguf(headers: dict[str, object]) -> None:
    from clover_local.detect.simulate import parse_simulate
    from clover_local.plan.llama_args import llama_cpp_kwargs
    from clover_local.plan.planner import make_plan
    from clover_local.plan.types import Wishes
    from clover_local.presets import load_preset

    machine = parse_simulate("ram=16G,cpu=4")
    preset = load_preset("gemma3-270m")
    plan = make_plan(machine, preset, headers["llada-moe"], Wishes(ctx=512), "x.gguf")
    assert plan.diffusion is not None and plan.diffusion.canvas == 512
    assert plan.ctx == plan.n_batch == plan.n_ubatch == 512
    assert not plan.speculative.enabled and plan.memory.ram.kv_cache_bytes == 0
    assert any("Diffusion decoding (llada-moe)" in r.text for r in plan.reasons)
    kwargs = llama_cpp_kwargs(plan)
    assert kwargs["n_ubatch"] == kwargs["n_batch"] == kwargs["n_ctx"] == 512
    autoregressive = make_plan(machine, preset, headers["llama"], Wishes(ctx=2048), "y.gguf")
    assert autoregressive.diffusion is None and autoregressive.n_ubatch == 512
