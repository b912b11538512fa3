"""Pooling other machines' devices (llama.cpp RPC) in the planner, over described machines: workers parsed from
``--rpc`` and ``--simulate rpc=``, every device checked on its own, llama.cpp's device order in ``-ts``, the
network's time per token, and the comparison with this machine alone."""

from __future__ import annotations

import json
import re

import pytest

from clover_local.cli import main
from clover_local.detect import parse_simulate
from clover_local.detect.remote import ASSUMED_LINK, Link, parse_link, parse_rpc
from clover_local.errors import UsageError
from clover_local.plan import memory
from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
from clover_local.plan.network import network_cost_per_token
from clover_local.plan.planner import make_plan
from clover_local.plan.render import plan_to_dict
from clover_local.plan.types import Plan, Wishes
from clover_local.presets import load_preset

GIB = 1024**3


@pytest.fixture(autouse=True)
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def clover():
    return load_preset("clover-35b-a3b")


def pooled(spec: str, preset, **wishes) -> Plan:
    return make_plan(parse_simulate(spec), preset, None, Wishes(**wishes))


# --- parsing ---------------------------------------------------------------------------------------------


def test_rpc_list_keeps_order_and_kinds() -> None:
    specs = parse_rpc("192.168.1.20:50052, gpu:nvidia@192.168.1.21:50053,cpu@laptop.local:6000")
    assert [(s.endpoint, s.kind) for s in specs] == [
        ("192.168.1.20:50052", "unknown"),
        ("192.168.1.21:50053", "nvidia"),
        ("laptop.local:6000", "cpu"),
    ]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("192.168.1.20", "is not HOST:PORT"),
        ("192.168.1.20:0", "is not HOST:PORT"),
        ("[::1]:50052", "is not HOST:PORT"),
        ("gpu:quantum@10.0.0.1:50052", "unknown device kind"),
        ("10.0.0.1:50052,10.0.0.1:50052", "twice"),
        (" , ", "names no worker"),
    ],
)
def test_bad_rpc_lists_are_refused_by_name(text: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        parse_rpc(text)


def test_links_in_bits_lose_framing_and_take_a_round_trip() -> None:
    link = parse_link("10Gbit/0.2ms")
    assert link.bandwidth_bytes_per_s == pytest.approx(10e9 / 8 * 0.94)
    assert link.rtt_s == pytest.approx(0.0002)
    assert parse_link("300MB/s").bandwidth_bytes_per_s == 300e6
    assert parse_link("300MB/s").rtt_s == ASSUMED_LINK.rtt_s
    with pytest.raises(UsageError, match="is not a link"):
        parse_link("fast")


def test_simulated_workers_are_numbered_as_llama_cpp_numbers_them() -> None:
    machine = parse_simulate(
        "gpu=nvidia:12G,rpc=gpu:nvidia:12G@10.0.0.2:50052,rpc=cpu:30G@10.0.0.3:50052,"
        "rpc=gpu:amd:16G@10.0.0.2:50052,link=2.5Gbit/1ms"
    )
    labels = [(d.label, d.kind, d.total_bytes) for w in machine.workers for d in w.devices]
    assert labels == [
        ("10.0.0.2:50052/RPC0", "nvidia", 12 * GIB),
        ("10.0.0.2:50052/RPC1", "amd", 16 * GIB),
        ("10.0.0.3:50052/RPC2", "cpu", 30 * GIB),
    ]
    assert all(w.link.rtt_s == pytest.approx(0.001) for w in machine.workers)
    assert len(machine.gpus) == 1  # lent devices are not this machine's GPUs


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("rpc=gpu:nvidia:12G", "expected rpc=KIND:SIZE@HOST:PORT"),
        ("rpc=gpu:nvidia:lots@10.0.0.2:1", "is not a memory size"),
        ("ram=16G,link=1Gbit", "add an rpc= part"),
    ],
)
def test_bad_simulated_workers_are_refused(spec: str, fragment: str) -> None:
    with pytest.raises(UsageError, match=fragment):
        parse_simulate(spec)


# --- the network term ------------------------------------------------------------------------------------


def test_network_cost_counts_boundaries_round_trips_and_logits() -> None:
    arch = load_preset("gemma3-270m").architecture
    n = arch.n_layers
    # first third on this machine's CPU, then worker a, then worker b with the output head
    devices = [-1] * 6 + [0] * 6 + [1] * (n - 12) + [1]
    links = {"a:1": Link(1e9, 0.001, "t"), "b:2": Link(1e8, 0.002, "t")}
    ctx = 1024
    seconds, n_bytes, transfers, trips = network_cost_per_token(arch, devices, 0, ["a:1", "b:2"], links, ctx)
    act, inputs, logits = arch.n_embd * 4, 4 + 2 * ctx, arch.n_vocab * 4
    # CPU -> a (send), a -> b (wait for a, read, send to b), b -> this machine (wait, read the logits)
    assert (transfers, trips) == (4, 2)
    assert n_bytes == (act + inputs) + act + (act + inputs) + logits
    expected = (act + inputs) / 1e9 + 0.001 + act / 1e9 + (act + inputs) / 1e8 + 0.002 + logits / 1e8
    assert seconds == pytest.approx(expected)


def test_experts_in_local_ram_bounce_every_offloaded_layer(clover) -> None:
    arch = clover.architecture
    n = arch.n_layers
    devices = [0] * n + [1]  # all layers on the worker, output head on a local GPU
    links = {"w:1": Link(1e9, 0.0005, "t")}
    base = network_cost_per_token(arch, devices, 0, ["w:1", None], links, 4096)
    moe = network_cost_per_token(arch, devices, 3, ["w:1", None], links, 4096)
    assert (base[2], base[3]) == (2, 1)
    assert (moe[2] - base[2], moe[3] - base[3]) == (6, 3)  # out and back for each of the 3 layers


# --- pooled plans ----------------------------------------------------------------------------------------


def test_a_worker_gpu_pools_with_the_local_gpu(clover) -> None:
    spec = "gpu=nvidia:12G,ram=32G,rpc=gpu:nvidia:12G@192.168.1.20:50052"
    plan = pooled(spec, clover)
    alone = make_plan(parse_simulate("gpu=nvidia:12G,ram=32G"), clover, None, Wishes())
    names = [d.name for d in plan.memory.gpus]
    assert names == ["gpu0", "192.168.1.20:50052/RPC0"]  # local GPUs first, then each worker's
    for d in plan.memory.gpus:
        assert d.capacity_bytes == 12 * GIB
        assert d.used_bytes + memory.GPU_MARGIN_BYTES <= d.capacity_bytes, d
    assert plan.n_cpu_moe < alone.n_cpu_moe  # the worker's memory keeps experts off local RAM
    argv = llama_server_args(plan)
    assert argv[argv.index("--rpc") + 1] == "192.168.1.20:50052"
    split = [float(x) for x in argv[argv.index("-ts") + 1].split(",")]
    assert split == list(plan.tensor_split) and len(split) == 2
    # llama.cpp's order: the RPC device first; the output head (and its logits buffer) on the local GPU
    local, worker = plan.memory.gpus
    assert local.compute_bytes > worker.compute_bytes
    assert plan.network is not None and 0 < plan.network.share < 1
    assert plan.alone_tokens_per_s == alone.predicted_tokens_per_s
    assert "--rpc" not in json.dumps(llama_cpp_kwargs(plan))


@pytest.mark.parametrize(
    "spec",
    [
        "gpu=nvidia:12G,ram=32G,rpc=gpu:nvidia:12G@10.0.0.2:50052",
        "gpu=nvidia:12G,ram=32G,rpc=gpu:nvidia:12G@10.0.0.2:50052,link=100Mbit/2ms",
        "gpu=nvidia:24G,ram=64G,rpc=gpu:nvidia:24G@10.0.0.2:50052,link=10Gbit/0.1ms",
        "gpu=nvidia:8G,ram=32G,rpc=cpu:64G@10.0.0.2:50052",
        "ram=16G,rpc=gpu:nvidia:16G@10.0.0.2:50052,rpc=gpu:nvidia:16G@10.0.0.3:50052",
        "unified=36G,rpc=gpu:apple:48G@10.0.0.2:50052,link=10Gbit",
    ],
)
def test_every_pooled_plan_fits_per_device_and_says_whether_pooling_pays(spec: str, clover) -> None:
    plan = pooled(spec, clover)
    machine = parse_simulate(spec)
    alone = make_plan(parse_simulate(re.sub(r",(rpc|link)=[^,]+", "", spec)), clover, None, Wishes())
    lent = [d for w in machine.workers for d in w.devices]
    if not plan.rpc_servers:  # this machine's GPU holds everything and is faster alone: workers left out
        assert any(r.text.startswith("Workers not used") for r in plan.reasons)
        assert plan.memory == alone.memory and "--rpc" not in llama_server_args(plan)
        assert plan.alone_tokens_per_s == alone.predicted_tokens_per_s
        return
    assert len(plan.memory.gpus) == len(machine.gpus) + len(lent)
    assert [d.name for d in plan.memory.gpus[len(machine.gpus) :]] == [d.label for d in lent]
    if plan.fits:
        for d in plan.memory.gpus:
            assert d.fits, d
    verdict = next(r.text for r in plan.reasons if r.code == "versus-alone")
    assert f"~{alone.predicted_tokens_per_s:.0f} tokens/s" in verdict
    if "pooling is faster" in verdict:
        assert plan.predicted_tokens_per_s > alone.predicted_tokens_per_s
    if "does not beat" in verdict or "is not faster" in verdict:
        assert plan.predicted_tokens_per_s <= alone.predicted_tokens_per_s * 1.05
    speed = next(r.text for r in plan.reasons if r.code == "speed-estimate")
    assert "on the network" in speed and "round trips per token" in speed
    # device names in the reasons are this machine's GPUs or host:port/RPCn, never the pooled positions
    named = {int(i) for r in plan.reasons for i in re.findall(r"\bgpu(\d+)\b", r.text)}
    assert named <= {g.index for g in machine.gpus}


def test_a_slower_link_predicts_fewer_tokens(clover) -> None:
    fast = pooled("gpu=nvidia:12G,ram=32G,rpc=gpu:nvidia:12G@10.0.0.2:50052,link=10Gbit/0.1ms", clover)
    slow = pooled("gpu=nvidia:12G,ram=32G,rpc=gpu:nvidia:12G@10.0.0.2:50052,link=100Mbit/5ms", clover)
    assert slow.network.seconds_per_token > fast.network.seconds_per_token  # type: ignore[union-attr]
    assert slow.predicted_tokens_per_s < fast.predicted_tokens_per_s


def test_cpu_only_machine_with_cpu_workers_puts_the_head_on_the_last_worker() -> None:
    gemma = load_preset("gemma3-270m")
    plan = pooled("ram=16G,cpu=2,rpc=cpu:8G@127.0.0.1:50052,rpc=cpu:8G@127.0.0.1:50053", gemma)
    assert plan.n_gpu_layers == -1
    assert plan.rpc_servers == ("127.0.0.1:50052", "127.0.0.1:50053")
    assert plan.network is not None
    assert plan.network.bytes_per_token >= gemma.architecture.n_vocab * 4  # the logits come back each token
    assert any("logits cross the network" in r.text for r in plan.reasons)


def test_plan_json_has_one_entry_per_device_local_first(clover, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "gpu=nvidia:12G,ram=32G,rpc=gpu:nvidia:12G@10.0.0.2:50052,rpc=cpu:32G@10.0.0.3:50052"
    assert main(["plan", "--offline", "--simulate", spec, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["memory"]["gpu_bytes"]) == 3
    assert [g["name"] for g in out["memory"]["gpus"]] == [
        "gpu0",
        "10.0.0.2:50052/RPC0",
        "10.0.0.3:50052/RPC1",
    ]
    assert out["network"]["seconds_per_token"] > 0 and 0 < out["network"]["share"] < 1
    assert out["llama_server_args"][:2] == ["--rpc", "10.0.0.2:50052,10.0.0.3:50052"]
    assert out["rpc_servers"] == ["10.0.0.2:50052", "10.0.0.3:50052"]
    from clover_local.launch import LaunchRequest, decide_launch

    # the same plan asked of the launch directly (it also chooses the speculation mode, as the CLI does)
    launch = decide_launch(LaunchRequest(clover, simulate=spec, describe=False))
    direct = json.loads(json.dumps(plan_to_dict(launch.plan)))
    assert (direct["memory"], direct["network"]) == (out["memory"], out["network"])


def test_plan_text_names_devices_host_port_device(clover, capsys: pytest.CaptureFixture[str]) -> None:
    spec = "gpu=nvidia:12G,ram=32G,rpc=gpu:nvidia:12G@10.0.0.2:50052"
    assert main(["plan", "--offline", "--simulate", spec]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^10\.0\.0\.2:50052/RPC0\s+\d", out, re.MULTILINE)
    assert "This machine alone" in out and "on the network" in out


def test_rpc_and_simulated_workers_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["plan", "--offline", "--simulate", "rpc=cpu:8G@10.0.0.2:1", "--rpc", "10.0.0.3:50052"])
    assert code == 2
    assert "given twice" in capsys.readouterr().err


def test_link_without_rpc_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--offline", "--link", "1Gbit"]) == 2
    assert "--link describes the network to --rpc workers" in capsys.readouterr().err


def test_unreachable_worker_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from clover_local.llamacpp.server import free_port

    port = free_port()
    assert main(["plan", "--offline", "--rpc", f"127.0.0.1:{port}"]) == 1
    err = capsys.readouterr().err
    assert f"Cannot reach the worker at 127.0.0.1:{port}" in err and "clover-local worker" in err


def test_the_embedded_engine_refuses_a_pooled_plan() -> None:
    from clover_local.launch import LaunchRequest, choose_runner

    with pytest.raises(UsageError, match="no RPC backend"):
        choose_runner(LaunchRequest("gemma3-270m", engine="embedded", rpc="127.0.0.1:50052"), None)


def test_a_pooled_plan_runs_in_llama_server_before_it_is_planned(tmp_path) -> None:
    """With workers and no --engine, the runner is llama-server (the embedded engine has no RPC backend),
    decided before planning, so the plan is budgeted for it."""
    from clover_local.launch import LaunchRequest, choose_runner

    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    runner = choose_runner(LaunchRequest("gemma3-270m", rpc="127.0.0.1:50052", llama_server=str(fake)), None)
    assert runner.kind == "llama-server" and runner.binary is not None and runner.binary.path == fake


# --- beyond RPC: vLLM and SGLang commands ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "tp"),
    [
        ("gpu=nvidia:80G,gpu=nvidia:80G,ram=256G", 2),
        ("gpu=nvidia:24G,gpu=nvidia:24G,gpu=nvidia:24G", 2),
        ("ram=64G", 1),
    ],
)
def test_gpu_server_commands_carry_the_plans_context_and_parallelism(
    spec: str, tp: int, capsys: pytest.CaptureFixture[str]
) -> None:
    for engine, ctx_flag, tp_flag in (
        ("vllm", "--max-model-len", "--tensor-parallel-size"),
        ("sglang", "--context-length", "--tp-size"),
    ):
        assert main(["plan", "--offline", "--simulate", spec, "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert main(["command", "--offline", "--simulate", spec, "--engine", engine, "--json"]) == 0
        out = json.loads(capsys.readouterr().out)
        argv = out["argv"]
        assert argv[argv.index(ctx_flag) + 1] == str(plan["ctx"])
        assert argv[argv.index(tp_flag) + 1] == str(tp)
        assert "Diffuspace/Clover-35B-A3B-Preview" in argv and "--trust-remote-code" in argv
        assert not any("GGUF" in a for a in argv)
        if "gpu=" not in spec:
            assert any("no usable GPU" in n for n in out["notes"])
