"""``speculative`` in the plan: which mode ``--spec auto`` picks and why (heads the files offer, where the
experts live, bench's measurements), what a head asked for but missing says, the draft's memory per device,
and the llama-server argv for each mode. Pure planner tables, then ``plan --json`` on the tiny MTP models
(local files, and a fake-Hub repo with the head as a sidecar whose header is read before download)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hub_server import HubServer

from clover_local import settings
from clover_local.cli import main
from clover_local.detect import parse_simulate
from clover_local.errors import UsageError
from clover_local.fetch import remote_header
from clover_local.gguf.header import read_local_header
from clover_local.measure.records import load_spec_ratios, save_spec_ratios
from clover_local.plan import memory
from clover_local.plan.llama_args import llama_server_args
from clover_local.plan.planner import make_plan
from clover_local.plan.speculation import HeadOffer, offered_heads, speculate
from clover_local.plan.types import EngineKind, Plan, Wishes, assemble
from clover_local.presets import load_preset
from clover_local.testing.models import tiny_mtp_model
from clover_local.testing.presets import tiny_qwen35moe_preset


def plan_speculation(plan: Plan, *args: Any) -> Plan:
    """``plan`` with only its speculation stage (``plan.speculation.speculate``) after the placement."""
    return assemble(plan, None, speculate(plan, *args))


CLOVER = load_preset("clover-35b-a3b")


@pytest.fixture(scope="module")
def embedded() -> Path:
    return tiny_mtp_model("embedded")[0]


@pytest.fixture(scope="module")
def sidecar() -> tuple[Path, Path]:
    model, side = tiny_mtp_model("sidecar")
    assert side is not None
    return model, side


def clover(  # type: ignore[no-untyped-def]
    simulate: str,
    offers: tuple[HeadOffer, ...],
    spec: str = "auto",
    measured: dict | None = None,
    engine: EngineKind = "embedded",
):
    plan = make_plan(parse_simulate(simulate), CLOVER, None, Wishes(quant="Q4_K_M", engine=engine))
    from clover_local.gguf.model import describe_from_preset

    return plan_speculation(plan, describe_from_preset(CLOVER, "Q4_K_M"), offers, spec, measured)


MTP_SIDECAR = (HeadOffer("mtp", "sidecar", "/m/mtp-Clover-Q4_K_M.gguf", None),)


def test_experts_on_the_gpu_take_the_mtp_head() -> None:
    plan = clover("gpu=nvidia:48G,ram=64G", MTP_SIDECAR)
    assert plan.n_cpu_moe == 0
    s = plan.speculative
    assert (s.mode, s.type, s.head, s.sidecar) == ("mtp", "draft-mtp", "sidecar", "/m/mtp-Clover-Q4_K_M.gguf")
    argv = llama_server_args(plan)
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("-md") + 1] == "/m/mtp-Clover-Q4_K_M.gguf"
    assert argv[argv.index("-ngld") + 1] == "all" and "-cmoed" not in argv
    assert "--spec-ngram-mod-n-match" not in argv
    assert "every expert is on the GPU" in s.why
    # The draft's memory is on the GPU and counted in the plan's.
    (gpu,) = [d for d in s.draft_memory if d.device == "gpu0"]
    assert gpu.weights_bytes > 0 and gpu.kv_cache_bytes > 0 and gpu.compute_bytes > 0
    without = make_plan(parse_simulate("gpu=nvidia:48G,ram=64G"), CLOVER, None, Wishes(quant="Q4_K_M"))
    assert plan.memory.gpus[0].used_bytes == without.memory.gpus[0].used_bytes + gpu.used_bytes


def test_experts_in_ram_take_ngram_and_say_why() -> None:
    plan = clover("gpu=nvidia:12G,ram=64G", MTP_SIDECAR, engine="llama-server")
    assert plan.n_cpu_moe > 0
    s = plan.speculative
    assert (s.mode, s.type, s.head, s.draft_memory) == ("ngram", "ngram-mod", None, ())
    assert "in RAM" in s.why and "94 -> 48" in s.why and "mtp (sidecar)" in s.why
    assert "--spec-ngram-mod-n-match" in llama_server_args(plan)


@pytest.mark.parametrize("offers", [MTP_SIDECAR, ()])
def test_hybrid_layers_on_a_gpu_in_the_embedded_engine_turn_ngram_off(offers: tuple[HeadOffer, ...]) -> None:
    """Clover keeps recurrent state: with its layers on a GPU in the embedded engine, rolling back n-gram drafts
    through llama.cpp's 17 snapshots cost 7% per token even when nothing was drafted (216 vs 234 tok/s on an
    H200), and the engine's per-draft copy of the state is unmeasured on a GPU, so ``auto`` turns it off there and
    the plan stops budgeting the copy."""
    simulate = "gpu=nvidia:12G,ram=64G" if offers else "gpu=nvidia:48G,ram=64G"
    plan = clover(simulate, offers)
    s = plan.speculative
    assert plan.n_gpu_layers != 0 and (s.mode, s.enabled, s.draft_memory) == ("off", False, ())
    assert "recurrent state" in s.why and "216 vs 234" in s.why and "7%" in s.why
    assert "--spec-type" not in llama_server_args(plan)
    assert not any(r.code == "speculation-ngram" for r in plan.reasons)
    assert any(r.text.startswith("Speculation off: ") for r in plan.reasons if r.code == "speculation-off")
    # The planner budgeted the state and the copy a draft is rolled back to; off, one is left.
    planned = make_plan(parse_simulate(simulate), CLOVER, None, Wishes(quant="Q4_K_M"))
    copies = memory.recurrent_copies(CLOVER.architecture, planned.speculative)
    assert copies == 2
    before = sum(d.recurrent_state_bytes for d in (*planned.memory.gpus, planned.memory.ram))
    after = sum(d.recurrent_state_bytes for d in (*plan.memory.gpus, plan.memory.ram))
    assert before > 0 and after == pytest.approx(before / copies, abs=len(plan.memory.gpus) + 1)
    # Asked for, n-gram still runs; on a CPU or in llama-server, auto keeps it.
    assert clover(simulate, offers, spec="ngram").speculative.mode == "ngram"
    assert clover("ram=64G", offers).speculative.mode == "ngram"
    assert clover(simulate, offers, engine="llama-server").speculative.mode in ("ngram", "mtp")


def test_cpu_only_takes_ngram() -> None:
    plan = clover("ram=64G", MTP_SIDECAR)
    assert plan.speculative.mode == "ngram" and "CPU only" in plan.speculative.why


def test_forcing_mtp_with_experts_in_ram_keeps_its_experts_in_ram() -> None:
    plan = clover("gpu=nvidia:12G,ram=64G", MTP_SIDECAR, spec="mtp")
    s = plan.speculative
    assert s.mode == "mtp" and s.head_experts_in_ram
    assert "-cmoed" in llama_server_args(plan)
    ram = next(d for d in s.draft_memory if d.device == "ram")
    per_layer = CLOVER.architecture
    assert ram.weights_bytes >= 0.5 * plan.file_bytes / per_layer.n_layers  # one MoE layer's experts


def test_measurements_decide_when_there_are_any() -> None:
    faster = clover("gpu=nvidia:12G,ram=64G", MTP_SIDECAR, measured={"mtp": 1.8, "ngram": 1.3, "dflash": 3.0})
    assert faster.speculative.mode == "mtp"  # dflash is not offered: its measurement cannot count
    assert "bench measured" in faster.speculative.why and "mtp 1.80x" in faster.speculative.why
    slower = clover("gpu=nvidia:48G,ram=64G", MTP_SIDECAR, measured={"mtp": 0.9, "ngram": 1.01})
    assert slower.speculative.mode == "off" and not slower.speculative.enabled
    assert "--spec-type" not in llama_server_args(slower)


def test_off_ngram_and_a_missing_head() -> None:
    assert clover("gpu=nvidia:48G,ram=64G", MTP_SIDECAR, spec="off").speculative.enabled is False
    assert clover("gpu=nvidia:48G,ram=64G", MTP_SIDECAR, spec="ngram").speculative.mode == "ngram"
    with pytest.raises(UsageError) as err:
        clover("gpu=nvidia:48G,ram=64G", MTP_SIDECAR, spec="dflash")
    assert "no dflash head" in err.value.what and "mtp (sidecar)" in err.value.what
    with pytest.raises(UsageError):
        clover("gpu=nvidia:48G,ram=64G", (), spec="bogus")


def test_block_drafter_sidecars() -> None:
    offers = (HeadOffer("dflash", "sidecar", "/m/dflash-Clover.gguf", None),)
    plan = clover("gpu=nvidia:48G,ram=64G", offers)
    argv = llama_server_args(plan)
    assert plan.speculative.mode == "dflash"
    assert (
        argv[argv.index("--spec-type") + 1] == "draft-dflash"
        and argv[argv.index("--spec-draft-n-max") + 1] == "15"
    )


def test_embedded_head_in_the_tiny_model(embedded: Path) -> None:
    desc = read_local_header(embedded)
    arch = desc.architecture
    assert (arch.n_layers, arch.n_nextn_layers) == (8, 1)  # block_count 9: the trunk is still 8 layers
    offers = offered_heads(desc)
    assert [(o.kind, o.where) for o in offers] == [("mtp", "embedded")]
    plan = make_plan(parse_simulate("gpu=nvidia:8G,ram=16G"), CLOVER, desc, Wishes(ctx=4096), str(embedded))
    plan = plan_speculation(plan, desc, offers)
    s = plan.speculative
    assert (s.mode, s.head, s.sidecar) == ("mtp", "embedded", None)
    (gpu,) = [d for d in s.draft_memory if d.device == "gpu0"]
    head = [t for t in desc.tensors or () if t.layer == 8]
    assert gpu.weights_bytes == sum(t.n_bytes for t in head)  # the whole block, experts too, on the GPU
    assert gpu.kv_cache_bytes == memory.pad_cells(4096) * memory.kv_bytes_per_cell(
        arch
    )  # one attention layer
    argv = llama_server_args(plan)
    assert "-md" not in argv and argv[argv.index("--spec-type") + 1] == "draft-mtp"
    forced = plan_speculation(
        replace(plan, n_cpu_moe=2), desc, offers, "mtp"
    )  # experts in RAM: the head's follow, by -ot on block 8
    argv = llama_server_args(forced)
    assert argv[argv.index("-ot") + 1] == r"blk\.8\.ffn_(up|down|gate|gate_up)_(ch|)exps=CPU"


def test_plan_json_on_a_local_file_finds_the_sidecar_beside_it(
    sidecar: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model, side = sidecar
    args = ["plan", "--model", str(model), "--simulate", "gpu=nvidia:8G,ram=16G", "--ctx", "4096", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    spec = out["speculative"]
    assert (spec["mode"], spec["head"], spec["sidecar"]) == ("mtp", "sidecar", str(side))
    devices = {d["device"]: d for d in spec["draft_memory"]}
    assert (
        devices["gpu0"]["kv_cache_bytes"] > 0 and devices["ram"]["weights_bytes"] > 0
    )  # its token embedding
    assert out["llama_server_args"][out["llama_server_args"].index("-md") + 1] == str(side)

    assert main([*args[:-1], "--spec", "off", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["speculative"]["mode"] == "off"


def test_bench_measurements_steer_auto(
    sidecar: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    model, _ = sidecar
    save_spec_ratios(str(model), {"mtp": 0.7, "ngram": 1.6}, engine="llama-server")
    assert main(["plan", "--model", str(model), "--simulate", "gpu=nvidia:8G,ram=16G", "--json"]) == 0
    spec = json.loads(capsys.readouterr().out)["speculative"]
    assert spec["mode"] == "ngram" and "bench measured" in spec["why"]


HUB_REPO = "acme/Tiny-MTP-GGUF"
PRESET = tiny_qwen35moe_preset("tiny-mtp", HUB_REPO, {"F16": 6_000_000}, default_quant="F16")


def test_hub_sidecar_header_is_read_before_download(
    hub_server: HubServer,
    sidecar: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    model, side = sidecar
    presets = settings.user_presets_dir()
    presets.mkdir(parents=True, exist_ok=True)
    (presets / "tiny-mtp.toml").write_text(PRESET)
    hub_server.add_file(HUB_REPO, "Tiny-MTP-F16.gguf", model)
    hub_server.add_file(HUB_REPO, "mtp-Tiny-MTP-F16.gguf", side)
    hub_server.add_file(HUB_REPO, "mmproj-Tiny-MTP-F16.gguf", b"GGUF" + b"\0" * 100)
    monkeypatch.setattr(remote_header, "FIRST_READ_REMOTE", 64 * 1024)

    assert main(["plan", "--preset", "tiny-mtp", "--simulate", "gpu=nvidia:8G,ram=16G", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    spec = out["speculative"]
    assert (spec["mode"], spec["head"], spec["sidecar"]) == ("mtp", "sidecar", "mtp-Tiny-MTP-F16.gguf")
    head = read_local_header(side)
    (gpu,) = [d for d in spec["draft_memory"] if d["device"] == "gpu0"]
    blocks = sum(t.n_bytes for t in head.tensors or () if t.layer == 8)
    out_bytes = memory.embedding_and_output_bytes(head)[1]
    assert gpu["weights_bytes"] == blocks + out_bytes  # exact: from the sidecar's header on the Hub
    assert 0 < hub_server.bytes_served(HUB_REPO, "mtp-Tiny-MTP-F16.gguf") < side.stat().st_size
    assert hub_server.bytes_served(HUB_REPO, "mmproj-Tiny-MTP-F16.gguf") == 0


def test_drafters_the_embedded_engine_lacks_move_to_llama_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clover_local.errors import ServerError
    from clover_local.launch import LaunchRequest, choose_runner

    dflash = LaunchRequest(spec="dflash")
    with pytest.raises(ServerError) as err:
        choose_runner(dflash, None, find_binary=lambda _configured: None)
    assert "dflash drafter runs only in llama-server" in err.value.what and "--llama-server" in (
        err.value.fix or ""
    )
    with pytest.raises(UsageError, match="--engine embedded cannot run this"):
        choose_runner(LaunchRequest(spec="dflash", engine="embedded"), None)
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CLOVER_LLAMA_SERVER", str(fake))
    moved = choose_runner(dflash, None)
    assert moved.kind == "llama-server" and "dflash drafter runs only in llama-server" in moved.why
    for kept in ("mtp", "ngram", "auto"):
        assert choose_runner(LaunchRequest(spec=kept), None).kind == "embedded"  # run in-process
    # The embedded runner is offered only the heads it runs, so an auto plan never picks a sidecar drafter.
    assert "dflash" not in choose_runner(LaunchRequest(), None).drafters


def test_bench_spec_modes_on_the_embedded_engine(capsys: pytest.CaptureFixture[str]) -> None:
    """``bench --spec-modes`` with the embedded engine: plain, n-gram and MTP side by side on the tiny MTP model,
    a head the files lack reported as not run, the ratios remembered for ``--spec auto``."""
    model, _ = tiny_mtp_model("embedded")
    args = [
        "bench",
        "--spec-modes",
        "off,ngram,mtp,eagle3",
        "--spec-engine",
        "embedded",
        "--model",
        str(model),
    ]
    args += [
        "--rounds",
        "1",
        "--max-tokens",
        "24",
        "--ctx",
        "2048",
        "--threads",
        "1",
        "--workloads",
        "code_rewrite",
    ]
    assert main(args) != 0  # the embedded engine does not run EAGLE-3
    assert "does not run eagle3" in capsys.readouterr().err
    args[2] = "off,ngram,mtp"
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["engine"] == "embedded" and data["modes"] == ["off", "ngram", "mtp"]
    mtp = [s for s in data["samples"] if s["mode"] == "mtp"]
    assert mtp and all(s["drafted_tokens"] > 0 and s["completion_tokens"] == 24 for s in mtp)
    assert set(data["ratios"]) == {"ngram", "mtp"}
    assert load_spec_ratios(str(model)) == data["ratios"]
    assert main([*args[:-1], "code_rewrite"]) == 0
    table = capsys.readouterr().out
    assert "vs plain" in table and "mtp" in table and "Remembered for --spec auto" in table
