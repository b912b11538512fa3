"""llama-server's prompt cache (``--cache-ram``) is sized by the plan from the RAM it leaves free, counted in the
memory picture, and passed on every launch: never left at upstream's 8 GiB default, which grew into memory no
plan counted (the 30-minute soak, docs/reliability.md)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from helpers_runner import launch_request

from clover_local.detect import parse_simulate
from clover_local.engine.types import GenerationRequest
from clover_local.gguf.header import read_local_header
from clover_local.launch import decide_launch
from clover_local.llamacpp.server import start_llama_server
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.plan import memory
from clover_local.plan.llama_args import llama_server_args
from clover_local.plan.planner import make_plan
from clover_local.plan.render import describe_plan
from clover_local.plan.types import Plan, Wishes
from clover_local.presets import load_preset
from clover_local.testing.models import tiny_model

MIB = memory.MIB


def _cache_flag(argv: list[str]) -> int:
    assert argv.count("--cache-ram") == 1, argv
    return int(argv[argv.index("--cache-ram") + 1])


def _free_before_cache(plan: Plan) -> int:
    ram = plan.memory.ram
    return ram.capacity_bytes - (ram.used_bytes - ram.prompt_cache_bytes) - ram.margin_bytes


@pytest.mark.parametrize(
    ("simulate", "expect"),
    [("ram=128G,cpu=16", "default"), ("ram=28G,cpu=8", "free"), ("ram=24G,cpu=2", "none")],
)
def test_the_cache_is_what_the_plan_leaves_free_at_most_upstreams_default(simulate: str, expect: str) -> None:
    plan = make_plan(
        parse_simulate(simulate), load_preset("clover-35b-a3b"), None, Wishes(engine="llama-server")
    )
    free = _free_before_cache(plan)
    ram = plan.memory.ram
    if expect == "default":
        assert plan.prompt_cache_mib == memory.PROMPT_CACHE_MAX_MIB and free > 8192 * MIB
    elif expect == "free":
        assert 64 <= plan.prompt_cache_mib < memory.PROMPT_CACHE_MAX_MIB
        assert plan.prompt_cache_mib == free // MIB
    else:
        assert free < 64 * MIB and plan.prompt_cache_mib == 0
    # counted: the RAM picture holds it, and the plan still fits as well as it did without it
    assert ram.prompt_cache_bytes == plan.prompt_cache_mib * MIB
    assert ram.used_bytes + ram.margin_bytes <= ram.capacity_bytes or not plan.fits
    assert _cache_flag(llama_server_args(plan)) == plan.prompt_cache_mib
    said = [r.text for r in plan.reasons if "--cache-ram" in r.text]
    assert len(said) == 1 and f"--cache-ram {plan.prompt_cache_mib}" in said[0]
    if plan.prompt_cache_mib:
        assert any("prompt cache" in line for line in describe_plan(plan, load_preset("clover-35b-a3b"))[:5])


def test_the_embedded_engine_holds_no_prompt_cache_but_a_printed_command_gets_one() -> None:
    plan = make_plan(parse_simulate("ram=128G,cpu=16"), load_preset("clover-35b-a3b"), None, Wishes())
    assert plan.engine == "embedded" and plan.memory.ram.prompt_cache_bytes == 0
    assert not any("--cache-ram" in r.text for r in plan.reasons)
    assert _cache_flag(llama_server_args(plan)) == memory.PROMPT_CACHE_MAX_MIB


def test_a_diffusion_plan_passes_no_cache_flag() -> None:
    header = read_local_header(tiny_model("llada-moe"))
    plan = make_plan(
        parse_simulate("ram=64G,cpu=8"), load_preset("gemma3-270m"), header, Wishes(ctx=512), "x.gguf"
    )
    assert plan.diffusion is not None and "--cache-ram" not in llama_server_args(plan)


@pytest.mark.slow
@pytest.mark.parametrize("route", ["pinned", "runtime"])
def test_the_running_server_keeps_its_cache_within_the_plans_bound(
    route: str, monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, tmp_path: Path
) -> None:
    """On each route a model takes (the pinned build; the runtime that loads clover_moe): the launch's child
    runs with the planned ``--cache-ram``, and on a machine that leaves it 64 MiB the server evicts its oldest
    saved prompt rather than growing past that (SmolLM2's ~20 MiB per saved prompt: a few prompts fill it)."""
    request = launch_request(route, monkeypatch, smollm2_path, tmp_path)
    here = decide_launch(request)
    assert _cache_flag(list(here.argv)) == here.plan.prompt_cache_mib
    # The same launch on this machine with only 64 MiB left over after the plan's own memory.
    free = _free_before_cache(here.plan)
    tight = replace(
        here.machine,
        memory=replace(
            here.machine.memory, available_bytes=here.machine.memory.available_bytes - free + 64 * MIB
        ),
    )
    launch = decide_launch(request, machine=tight)
    assert launch.plan.prompt_cache_mib == 64 and launch.plan.memory.ram.prompt_cache_bytes == 64 * MIB
    process = start_llama_server(launch.argv, binary=launch.runner.binary, adapt=launch.server_argv is None)
    engine = LlamaServerEngine(process, model_name="model", slots=1)
    try:
        with open(f"/proc/{process.pid}/cmdline", "rb") as f:
            argv = f.read().decode().split("\0")
        assert _cache_flag(argv) == 64
        if route == "runtime":
            # The tiny hybrid's saved state is a few hundred KiB: hundreds of prompts would be needed to fill
            # 64 MiB. That its llama-server takes the flag is what this route shows; the bound, the pinned one.
            assert engine.count_tokens("alpha") > 0 and "--cache-ram" not in process.log_tail(400)
            return
        words = engine.count_tokens("alpha beta gamma delta ") / 4
        n = int((engine.n_ctx - 64) / words / 4) * 4
        evicted = False
        for i in range(40):  # each distinct prompt's state is saved when the next one takes the slot
            text = f"{i} " + " ".join(("alpha", "beta", "gamma", "delta")[(i + k) % 4] for k in range(n))
            for _ in engine.generate(GenerationRequest(prompt=text, max_tokens=1, temperature=0.0)):
                pass
            log = process.log_tail(400)
            if "removing oldest entry" in log:
                evicted = True
                break
        assert evicted, process.log_tail(60)
    finally:
        engine.close()
