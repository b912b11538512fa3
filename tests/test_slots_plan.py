"""Slots in the plan (``plan.slots``): memory sized for N sequences as llama.cpp holds them (one KV stream of
``ctx`` cells per slot, recurrent state per slot, llama-server's checkpoints per slot), the default (as many as
fit beside the one-slot placement, up to 4; 1 where memory is tight), ``--parallel N`` as asked, and the
settings rendered for both engines from the same rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clover_local.cli import main
from clover_local.detect import parse_simulate
from clover_local.errors import UsageError
from clover_local.plan import memory
from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
from clover_local.plan.planner import make_plan
from clover_local.plan.slots import DEFAULT_SLOTS, MAX_SLOTS
from clover_local.plan.types import Plan, SpecMode, Wishes
from clover_local.presets import load_preset


def plan(spec: str, preset: str = "smollm2-135m", **wishes: object) -> Plan:
    return make_plan(parse_simulate(spec), load_preset(preset), None, Wishes(**wishes))  # type: ignore[arg-type]


def kv_total(p: Plan) -> int:
    return sum(g.kv_cache_bytes for g in p.memory.gpus) + p.memory.ram.kv_cache_bytes


def recurrent_total(p: Plan) -> int:
    return sum(g.recurrent_state_bytes for g in p.memory.gpus) + p.memory.ram.recurrent_state_bytes


def test_default_is_four_slots_where_they_fit_each_with_its_own_context() -> None:
    one = plan("ram=32G,cpu=8", parallel=1)
    four = plan("ram=32G,cpu=8", parallel=None)
    assert four.parallel == DEFAULT_SLOTS and one.parallel == 1
    assert four.ctx == one.ctx  # a slot's context is the one-slot plan's
    assert kv_total(four) == 4 * kv_total(one)
    assert any(r.text.startswith("4 slots:") for r in four.reasons)
    argv = llama_server_args(four)
    assert argv[argv.index("-c") + 1] == str(4 * four.ctx)  # llama.cpp splits -c evenly between slots
    assert argv[argv.index("-np") + 1] == "4" and "--no-kv-unified" in argv
    kwargs = llama_cpp_kwargs(four)
    assert kwargs["n_ctx"] == 4 * four.ctx and kwargs["n_seq_max"] == 4 and kwargs["kv_unified"] is False


def test_one_slot_where_memory_is_tight_and_the_reason_says_so() -> None:
    # Gemma 3 270M's KV cache at its context: a machine where one slot fits but not a second one beside it.
    tight = plan("ram=2.3G,cpu=2", "gemma3-270m", parallel=None)
    roomy = plan("ram=32G,cpu=2", "gemma3-270m", parallel=None)
    assert roomy.parallel > 1
    assert tight.parallel == 1
    assert any(r.text.startswith("1 slot: memory is tight") for r in tight.reasons)
    assert llama_server_args(tight)[llama_server_args(tight).index("-np") + 1] == "1"


def test_default_slots_never_move_experts_off_the_gpu() -> None:
    spec = "gpu=nvidia:24G,ram=64G"
    one = plan(spec, "clover-35b-a3b", parallel=1)
    auto = plan(spec, "clover-35b-a3b", parallel=None)
    assert (auto.n_gpu_layers, auto.n_cpu_moe) == (one.n_gpu_layers, one.n_cpu_moe)
    assert auto.fits


def test_asked_slots_are_planned_as_asked_and_a_moved_placement_is_said() -> None:
    spec = "gpu=nvidia:24G,ram=64G"
    one = plan(spec, "clover-35b-a3b", parallel=1, ctx=65536)
    many = plan(spec, "clover-35b-a3b", parallel=16, ctx=65536)
    assert many.parallel == 16
    why = next(r.text for r in many.reasons if r.code == "slots")
    assert why.startswith("16 slots, as asked")
    if many.n_cpu_moe != one.n_cpu_moe:
        assert "placement changed" in why
    assert many.n_cpu_moe >= one.n_cpu_moe


def test_recurrent_state_is_held_per_slot() -> None:
    spec = "gpu=nvidia:80G,ram=128G"
    one = plan(spec, "clover-35b-a3b", parallel=1)
    three = plan(spec, "clover-35b-a3b", parallel=3)
    assert recurrent_total(one) > 0
    assert abs(recurrent_total(three) - 3 * recurrent_total(one)) < 1024  # per-layer integer shares


def test_sliding_window_cells_per_slot() -> None:
    arch = load_preset("gemma3-270m").architecture
    one = memory.kv_cells_per_layer(arch, 4096, n_ubatch=512)
    four = memory.kv_cells_per_layer(arch, 4096, n_ubatch=512, n_seq=4)
    assert four == [4 * c for c in one]  # a stream per slot: its own window, its own full cells


def test_llama_server_checkpoints_are_pinned_and_counted_in_ram() -> None:
    spec = "ram=32G,cpu=8"
    served = plan(spec, "gemma3-270m", parallel=2, engine="llama-server")
    embedded = plan(spec, "gemma3-270m", parallel=2, engine="embedded")
    assert served.ctx_checkpoints == memory.CTX_CHECKPOINTS and embedded.ctx_checkpoints == 0
    argv = llama_server_args(served)
    assert argv[argv.index("--ctx-checkpoints") + 1] == str(memory.CTX_CHECKPOINTS)
    assert served.memory.ram.checkpoint_bytes > 0 == embedded.memory.ram.checkpoint_bytes
    assert served.memory.ram.used_bytes - embedded.memory.ram.used_bytes >= served.memory.ram.checkpoint_bytes
    # an attention-only model can be cut back to any prefix: no checkpoints
    assert plan(spec, "smollm2-135m", parallel=2, engine="llama-server").ctx_checkpoints == 0


@pytest.mark.parametrize("n", [0, -1, MAX_SLOTS + 1])
def test_slots_out_of_range_are_a_usage_error(n: int) -> None:
    with pytest.raises(UsageError, match="--parallel"):
        plan("ram=32G,cpu=8", parallel=n)


def test_plan_json_shows_slots_and_serve_defaults_to_auto(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--preset", "smollm2-135m", "--simulate", "ram=32G,cpu=8", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parallel"] == 1  # plan shows what `run`/`chat` load: one sequence
    assert (
        main(["plan", "--preset", "smollm2-135m", "--simulate", "ram=32G,cpu=8", "--parallel", "3", "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["parallel"] == 3 and data["llama_cpp_kwargs"]["n_seq_max"] == 3
    assert (
        main(
            [
                "plan",
                "--preset",
                "smollm2-135m",
                "--simulate",
                "ram=32G,cpu=8",
                "--parallel",
                "auto",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["parallel"] == DEFAULT_SLOTS
    # `command` prints the plan's command: `plan`'s one slot unless --parallel says otherwise (issue 40).
    assert main(["command", "--preset", "smollm2-135m", "--simulate", "ram=32G,cpu=8"]) == 0
    assert "-np 1" in capsys.readouterr().out
    argv = ["command", "--preset", "smollm2-135m", "--simulate", "ram=32G,cpu=8", "--parallel", "auto"]
    assert main(argv) == 0
    assert f"-np {DEFAULT_SLOTS}" in capsys.readouterr().out  # as serve decides them


@pytest.mark.parametrize("slots", [1, 3])
def test_planned_memory_for_slots_is_what_llama_cpp_allocates(gemma_path: Path, slots: int) -> None:
    """The real Gemma 3 270M loaded with the plan's settings: llama.cpp's own buffer sizes (its load log) for N
    slots are the plan's, KV cache exactly (one stream of ctx cells per slot, sliding window per slot); the plan's
    KV figure adds the caches' cell bookkeeping, which llama.cpp keeps on its heap, outside the logged buffers."""
    from clover_local.engine.loader import load_engine
    from clover_local.gguf.header import read_local_header
    from clover_local.plan.llama_args import llama_settings
    from clover_local.testing.measure import parse_buffer_log

    header = read_local_header(gemma_path)
    p = make_plan(
        parse_simulate("ram=24G,cpu=2"),
        load_preset("gemma3-270m"),
        model=header,
        wishes=Wishes(ctx=2048, parallel=slots),
        model_path=str(gemma_path),
    )
    assert p.parallel == slots
    result = load_engine(gemma_path, llama_settings(p).kwargs(), speculative=p.speculative)
    try:
        assert result.engine.slots == slots and result.engine.n_ctx == 2048
        logged = parse_buffer_log("\n".join(result.load_log))
    finally:
        result.engine.close()
    ram = p.memory.ram
    arch = header.architecture
    assert logged["kv"] == slots * memory.kv_cache_bytes(arch, 2048)
    index = memory.kv_cell_index_bytes(arch, 2048, n_seq=slots)
    # The full-attention and the sliding-window cells of every slot.
    assert index == slots * (2048 + 1024) * memory.KV_CELL_INDEX_BYTES
    assert ram.kv_cache_bytes == logged["kv"] + index
    reserved = sum(logged.values())
    assert 0.9 <= ram.used_bytes / reserved <= 1.1, (ram, logged)


@pytest.mark.parametrize(
    ("spec", "parallel", "slots"), [("mtp", None, 1), ("ngram", None, DEFAULT_SLOTS), ("mtp", 3, 3)]
)
def test_default_slots_keep_an_embedded_mtp_head(spec: SpecMode, parallel: int | None, slots: int) -> None:
    """The embedded engine's MTP head follows one sequence: default slots would switch it off, so a plan drafting
    with it keeps one slot and says why; n-gram drafting takes the default slots, and slots asked for are given."""
    from clover_local.decide import MTP_ONE_SLOT
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.testing.models import tiny_mtp_model

    model, _ = tiny_mtp_model("embedded")
    request = LaunchRequest(
        model=str(model),
        ctx=2048,
        spec=spec,
        engine="embedded",
        parallel=parallel,
    )
    launch = decide_launch(request, machine=parse_simulate("ram=32G,cpu=8"))
    assert launch.plan.speculative.mode == spec
    assert launch.plan.parallel == slots
    assert (MTP_ONE_SLOT in launch.plan.reasons) == (spec == "mtp" and parallel is None)
    assert launch.settings.kwargs()["n_seq_max"] == slots  # what loads is what the plan says


def test_memory_picture_shows_the_slots_the_plan_holds() -> None:
    """The plan report, ``plan --json`` and the app's memory bars are drawn from the plan's memory for its N
    slots: N KV streams, not one slot's."""
    from clover_local.detect.units import format_bytes
    from clover_local.plan.render import describe_plan, plan_to_dict
    from clover_local.tui.widgets.memory import memory_segments

    one = plan("ram=4G,cpu=8", parallel=1, ctx=8192)
    four = plan("ram=4G,cpu=8", parallel=4, ctx=8192)
    kv = four.memory.ram.kv_cache_bytes
    assert four.parallel == 4 and kv == 4 * one.memory.ram.kv_cache_bytes
    assert plan_to_dict(four)["memory"]["ram"]["kv_cache_bytes"] == kv
    report = describe_plan(four, load_preset("smollm2-135m"))
    assert "context 8192 x 4 slots" in report[0]
    ram_row = next(line for line in report if line.startswith("ram "))
    columns = [
        ram_row[i : i + 12].strip() for i in range(8, 8 + 12 * 5, 12)
    ]  # weights KV recurrent compute total
    assert columns[1] == format_bytes(kv) and columns[4] == format_bytes(four.memory.ram.used_bytes)
    width = 400
    bars = {n: dict(memory_segments(p.memory.ram, width)) for n, p in ((1, one), (4, four))}
    scale = max(four.memory.ram.capacity_bytes, four.memory.ram.used_bytes + four.memory.ram.margin_bytes)
    assert abs(bars[4]["kv"] - width * kv / scale) <= 1
    assert bars[4]["kv"] > 3 * bars[1]["kv"] >= 3
