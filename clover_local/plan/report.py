"""Shared by ``clover-local plan`` and ``clover-local command``: their options, making the plan from them, and
showing it (a JSON object, or text with a memory table per device).

Without ``--model`` each quant is described by ``fetch.describe.describe_quants``: exact sizes from a
downloaded file or from the GGUF header on the Hub (read before anything is downloaded), else the preset's
estimate; where each quant's sizes came from is said among the reasons and in ``--json`` as ``size_sources``."""

from __future__ import annotations

import argparse
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from clover_local.detect.units import format_bytes as fb
from clover_local.errors import UsageError
from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
from clover_local.plan.types import DeviceMemory, Goal, Plan, Wishes
from clover_local.presets import Preset

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine
    from clover_local.fetch.describe import QuantDescriptions


def add_plan_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--preset", metavar="NAME", help="preset name or path to a .toml (default: clover-35b-a3b)"
    )
    parser.add_argument("--quant", default="auto", metavar="auto|Q4_K_M|Q8_0", help="quant (default: auto)")
    parser.add_argument("--ctx", type=int, metavar="N", help="context size in tokens (default: decided)")
    parser.add_argument("--goal", choices=("quality", "speed"), default="quality", help="what to favour")
    parser.add_argument(
        "--simulate",
        metavar="SPEC",
        help="plan for a described machine, e.g. ram=32G,gpu=nvidia:12G (see README)",
    )
    parser.add_argument("--model", metavar="PATH", help="a local GGUF: plan with its exact tensor sizes")
    add_rpc_options(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def add_rpc_options(parser: argparse.ArgumentParser) -> None:
    """``--rpc`` and ``--link``: pool devices other machines lend through llama.cpp's RPC backend."""
    parser.add_argument(
        "--rpc",
        metavar="[KIND@]HOST:PORT,...",
        help="workers started with `clover-local worker` on other machines: their devices are read and planned "
        "with this machine's (KIND: cpu, gpu:nvidia, gpu:amd, gpu:intel, gpu:apple; see README)",
    )
    parser.add_argument(
        "--link",
        metavar="BW[/RTT]",
        help="the network to the workers, e.g. 1Gbit/0.5ms or 300MB/s (default: measured through the worker)",
    )


def machine_for(simulate: str | None, rpc: str | None, link: str | None = None) -> Machine:
    """This machine (or the ``--simulate`` one) with the ``--rpc`` workers read through the RPC protocol."""
    from clover_local.detect import detect_machine, parse_simulate

    machine = parse_simulate(simulate) if simulate is not None else detect_machine()
    if link is not None and rpc is None:
        raise UsageError(
            "--link describes the network to --rpc workers.", "Add --rpc HOST:PORT, or drop --link."
        )
    if rpc is None:
        return machine
    if machine.workers:
        raise UsageError(
            "Workers are given twice: with --rpc and with rpc= in --simulate.",
            "Describe them one way: --rpc probes real workers, rpc= describes imagined ones.",
        )
    from clover_local.rpc.probe import probe_workers

    return replace(machine, workers=probe_workers(rpc, link=link))


def add_size_options(parser: argparse.ArgumentParser) -> None:
    """Options of commands that read GGUF headers from the Hub (``plan``, ``command``)."""
    parser.add_argument(
        "--offline",
        action="store_true",
        help="ask no server: sizes from downloaded files and headers read before, else the preset's estimate",
    )


def plan_from_args(args: argparse.Namespace) -> tuple[Plan, Preset]:
    """:func:`plan_for` with the options of :func:`add_plan_options` (and ``--offline``)."""
    return plan_for(
        args.preset,
        model=args.model,
        quant=args.quant,
        ctx=args.ctx,
        goal=args.goal,
        simulate=args.simulate,
        offline=getattr(args, "offline", False),
        rpc=getattr(args, "rpc", None),
        link=getattr(args, "link", None),
    )


def plan_for(
    preset_name: str | None,
    *,
    model: str | None = None,
    quant: str = "auto",
    ctx: int | None = None,
    goal: Goal = "quality",
    simulate: str | None = None,
    offline: bool = False,
    rpc: str | None = None,
    link: str | None = None,
) -> tuple[Plan, Preset]:
    """Detect (or simulate) the machine, describe the model (a local file's header, else each quant's from
    ``describe_quants``), and plan. A quant already on this machine is planned with its file as the model."""
    from pathlib import Path

    from clover_local.plan.planner import make_plan
    from clover_local.presets import load_preset

    preset = load_preset(preset_name)
    machine = machine_for(simulate, rpc, link)
    wishes = Wishes(quant=quant, ctx=ctx, goal=goal)
    if model:
        from clover_local.gguf.header import read_local_header

        path = Path(model).expanduser()
        if not path.is_file():
            raise UsageError(f"--model {model}: no such file.", "Give the path of a local .gguf file.")
        plan = make_plan(machine, preset, read_local_header(path), wishes, str(path))
        source = f"exact, from the local file {path}"
        return replace(
            plan,
            reasons=(*plan.reasons, f"Sizes of {plan.quant}: {source}."),
            size_sources=((plan.quant, source),),
        ), preset

    from clover_local.fetch.describe import describe_quants

    described = describe_quants(
        preset,
        offline=True if offline else None,
        quants=None if quant == "auto" else [quant],  # an unknown quant: make_plan says so
    )
    return plan_with_sizes(machine, preset, wishes, described), preset


def plan_with_sizes(machine: Machine, preset: Preset, wishes: Wishes, described: QuantDescriptions) -> Plan:
    """Plan over each quant's described sizes; the plan names its quant's local file when there is one and says
    in its reasons where every quant's sizes came from."""
    from clover_local.plan.planner import make_plan

    plan = make_plan(machine, preset, None, wishes, models=described.models)
    local = described.paths.get(plan.quant)
    return replace(
        plan,
        model_path=str(local) if local is not None else None,
        reasons=(*plan.reasons, *(f"Sizes of {q}: {text}." for q, text in described.sources.items())),
        size_sources=tuple(described.sources.items()),
    )


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The ``--json`` object: the plan's fields, per-device memory with totals, argv and kwargs."""
    out = asdict(plan)
    out["memory"] = {
        "gpu_bytes": plan.memory.gpu_bytes,
        "ram_bytes": plan.memory.ram.used_bytes,
        "gpus": [_device(d) for d in plan.memory.gpus],
        "ram": _device(plan.memory.ram),
    }
    out["reasons"] = list(plan.reasons)
    out["size_sources"] = dict(plan.size_sources)
    out["llama_server_args"] = llama_server_args(plan)
    out["llama_cpp_kwargs"] = llama_cpp_kwargs(plan)
    return out


def _device(d: DeviceMemory) -> dict[str, Any]:
    return {**asdict(d), "used_bytes": d.used_bytes, "fits": d.fits}


def describe_plan(plan: Plan, preset: Preset) -> list[str]:
    """Text for people: the recommendation, a memory table per device, the reasons and the alternatives."""
    where = (
        "CPU only"
        if plan.n_gpu_layers == 0
        else "all layers on the GPU"
        if plan.n_cpu_moe == 0 and plan.n_gpu_layers < 0
        else f"GPU, experts of {plan.n_cpu_moe} layers in RAM"
        if plan.n_gpu_layers < 0
        else f"{plan.n_gpu_layers} layers on the GPU"
    )
    width = max([8, *(len(d.name) for d in plan.memory.gpus)])
    lines = [
        f"{preset.display_name}: {plan.quant} ({fb(plan.file_bytes)}), context {plan.ctx}, {where}, "
        f"KV {plan.cache_type_k}, ~{plan.predicted_tokens_per_s:.0f} tokens/s (estimate)"
        + ("" if plan.fits else "  [DOES NOT FIT WELL]"),
        "",
        f"{'memory':{width}} {'weights':>11} {'KV cache':>11} {'recurrent':>11} {'compute':>11} {'total':>11} "
        f"{'available':>11} {'margin':>10}",
    ]
    for d in (*plan.memory.gpus, plan.memory.ram):
        lines.append(
            f"{d.name:{width}} {fb(d.weights_bytes):>11} {fb(d.kv_cache_bytes):>11} {fb(d.recurrent_state_bytes):>11} "
            f"{fb(d.compute_bytes):>11} {fb(d.used_bytes):>11} {fb(d.capacity_bytes):>11} {fb(d.margin_bytes):>10}"
            + ("" if d.fits else "  short")
        )
    lines += ["", "Why:"] + [f"  - {r}" for r in plan.reasons]
    if plan.alternatives:
        lines += ["", "Alternatives:"] + [f"  - {a.quant}: {a.why_not}" for a in plan.alternatives]
    return lines
