"""Plan over this machine and the devices other machines lend through llama.cpp's RPC backend, as one machine.

The workers' devices join the local GPUs as places for layers, each checked on its own (memory is never summed),
in llama.cpp's order: RPC devices first, then local GPUs (``llama_model_load``: "add RPC servers at the front of
the list to minimize network transfers"), so ``-ts`` lists the workers' devices first and the output head stays
on a local GPU when there is one. Experts still go to this machine's RAM with ``--n-cpu-moe`` when needed. The
speed adds the network's time per token (:mod:`clover_local.plan.network`) to the devices' time, and the plan
is compared with this machine planned alone: pooling often loses to keeping experts in local RAM.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace

from clover_local.detect.machine import Gpu, Machine
from clover_local.detect.remote import Link, RemoteDevice
from clover_local.detect.units import format_bytes as fb
from clover_local.gguf.model import ModelDescription, describe_from_preset
from clover_local.plan import memory
from clover_local.plan.fit import uses_gpus
from clover_local.plan.measured import SpeedRecord
from clover_local.plan.network import describe_links, network_cost_per_token
from clover_local.plan.reasons import Reason, find_reason
from clover_local.plan.speed import DEFAULT_RAM_BANDWIDTH, SPEED_CTX_SAMPLE, gpu_bandwidth
from clover_local.plan.types import MemoryPlan, NetworkCost, Placed, Plan, Wishes
from clover_local.presets import Preset

_GPU_NAME_RE = re.compile(r"\bgpu(\d+)\b")


def remote_devices(machine: Machine) -> tuple[RemoteDevice, ...]:
    return tuple(d for w in machine.workers for d in w.devices)


def remote_bandwidth(device: RemoteDevice) -> float:
    """Memory bandwidth of a lent device, from its kind (the RPC protocol does not report it): a typical card of
    its vendor and size, else desktop RAM (a CPU worker, or a kind ``--rpc`` did not say)."""
    if device.kind in ("nvidia", "amd", "intel", "apple"):
        probe = Gpu(0, device.kind, device.label, device.total_bytes, device.free_bytes)  # type: ignore[arg-type]
        return gpu_bandwidth(probe, device.total_bytes)[0]
    return DEFAULT_RAM_BANDWIDTH


def as_one_machine(machine: Machine) -> Machine:
    """This machine with the workers' devices as extra places for layers, in llama.cpp's device order (workers'
    devices first, then usable local GPUs); a build with RPC can offload even without a local GPU."""
    remote = remote_devices(machine)
    lent = tuple(
        Gpu(
            index=i,
            vendor=d.kind if d.kind in ("nvidia", "amd", "intel") else "intel",  # type: ignore[arg-type]
            name=d.label,
            total_bytes=d.total_bytes,
            free_bytes=d.free_bytes,
            bandwidth_bytes_per_s=remote_bandwidth(d),
            source="rpc",
        )
        for i, d in enumerate(remote)
    )
    local = tuple(
        replace(g, index=len(lent) + j) for j, g in enumerate(machine.gpus if uses_gpus(machine) else ())
    )
    backends = tuple(b for b in machine.build.backends if b != "cpu")
    build = replace(machine.build, gpu_offload=True, backends=(*backends, "rpc", "cpu"))  # type: ignore[arg-type]
    return replace(machine, gpus=(*lent, *local), build=build, workers=())


def pooled_plan(
    plan_one: Callable[..., Placed],
    machine: Machine,
    preset: Preset,
    model: ModelDescription | None,
    wishes: Wishes | None,
    model_path: str | None,
    *,
    models: Mapping[str, ModelDescription] | None,
    speed_records: Sequence[SpeedRecord] = (),
) -> Placed:
    """The plan over this machine and its workers, with the network in the predicted speed and a comparison
    with this machine alone in the reasons. ``plan_one`` is the planner for one machine (``plan_placement``, passed
    in by it: this module sits beside it, not above it)."""
    asked = (preset, model, wishes, model_path)
    alone = plan_one(replace(machine, workers=()), *asked, models=models, speed_records=speed_records)
    one = as_one_machine(machine)
    plan = plan_one(one, *asked, models=models)
    desc = model or (models or {}).get(plan.quant) or describe_from_preset(preset, plan.quant)
    remote = remote_devices(machine)
    endpoints: list[str | None] = [d.endpoint for d in remote] + [None] * (len(one.gpus) - len(remote))
    placement = memory.place(
        desc,
        ctx=plan.ctx,
        n_gpus=len(one.gpus),
        n_gpu_layers=plan.n_gpu_layers,
        n_cpu_moe=plan.n_cpu_moe,
        tensor_split=plan.tensor_split,
        type_k=plan.cache_type_k,
        type_v=plan.cache_type_v,
        n_ubatch=plan.n_ubatch,
        recurrent_copies=memory.recurrent_copies(desc.architecture, plan.speculative),
    )
    links: dict[str, Link] = {w.endpoint: w.link for w in machine.workers}
    filled = min(plan.ctx, SPEED_CTX_SAMPLE)
    net_s, net_bytes, transfers, trips = network_cost_per_token(
        desc.architecture, placement.devices, plan.n_cpu_moe, endpoints, links, filled
    )
    device_s = 1 / plan.predicted_tokens_per_s if plan.predicted_tokens_per_s > 0 else 0.0
    total_s = device_s + net_s
    tps = 1 / total_s if total_s > 0 else 0.0
    if _alone_on_gpu(machine, alone) and tps < alone.predicted_tokens_per_s:
        unused = Reason(
            "workers-unused",
            f"Workers not used ({', '.join(w.endpoint for w in machine.workers)}): this machine's GPU memory "
            f"holds everything, and pooling would be slower (~{tps:.0f} vs ~{alone.predicted_tokens_per_s:.0f} "
            "tokens/s predicted), so --rpc is left out.",
        )
        return _pooled_placement(alone, alone, reasons=(*alone.reasons, unused))
    used = {endpoints[d] for d in placement.devices if d >= 0 and endpoints[d] is not None}
    network = NetworkCost(
        seconds_per_token=net_s,
        bytes_per_token=net_bytes,
        transfers=transfers,
        round_trips=trips,
        share=net_s / total_s if total_s > 0 else 0.0,
        links=describe_links(links),
    )
    # device positions renamed; the estimate of speed on the devices alone gives way to one with the network
    names = _device_names(machine, remote)
    reasons = [
        _speed_reason(tps, device_s, network, desc)
        if r.code == "speed-estimate"
        else replace(r, text=_rename(r.text, names))
        for r in plan.reasons
    ]
    at = next((i for i, r in enumerate(reasons) if r.code == "ram"), len(reasons))
    reasons[at:at] = _pooling_reasons(machine, one, plan, remote, used)
    reasons.append(_versus_alone(alone, plan, tps))
    gpus = tuple(replace(g, name=names[i]) for i, g in enumerate(plan.memory.gpus))
    return _pooled_placement(
        plan,
        alone,
        reasons=tuple(reasons),
        memory=MemoryPlan(gpus=gpus[len(remote) :] + gpus[: len(remote)], ram=plan.memory.ram),  # local first
        predicted_tokens_per_s=round(tps, 1),
        rpc_servers=tuple(w.endpoint for w in machine.workers if w.endpoint in used),
        network=network,
        backend=machine.offload_backend if uses_gpus(machine) else "rpc",
    )


def _pooled_placement(chosen: Placed, alone: Placed, **pooled: object) -> Placed:
    """The pooling stage's placement, built once from its parts: the quant, context and settings ``chosen``
    decided (this machine alone, or the pool planned as one machine), with what pooling decides (``pooled``:
    the reasons, and for the pool the memory per device, the speed, the workers used, the network's cost and
    the backend), and ``alone``'s speed to compare with."""
    parts = {f.name: getattr(chosen, f.name) for f in fields(Placed)}
    return Placed(**{**parts, **pooled, "alone_tokens_per_s": alone.predicted_tokens_per_s})


def _alone_on_gpu(machine: Machine, alone: Placed) -> bool:
    """This machine alone runs everything from its GPU memory (nothing a worker could speed up)."""
    return uses_gpus(machine) and alone.fits and alone.n_gpu_layers < 0 and alone.n_cpu_moe == 0


def _device_names(machine: Machine, remote: tuple[RemoteDevice, ...]) -> list[str]:
    """Pooled device position -> the name people see: ``host:port/RPCn`` for lent devices, ``gpuN`` (its own
    index) for local GPUs."""
    local = machine.gpus if uses_gpus(machine) else ()
    return [d.label for d in remote] + [f"gpu{g.index}" for g in local]


def _rename(text: str, names: list[str]) -> str:
    return _GPU_NAME_RE.sub(
        lambda m: names[int(m.group(1))] if int(m.group(1)) < len(names) else m.group(0), text
    )


def _speed_reason(tps: float, device_s: float, net: NetworkCost, desc: ModelDescription) -> Reason:
    arch = desc.architecture
    return Reason(
        "speed-estimate",
        f"Predicted decode ~{tps:.0f} tokens/s with the network in the path (an estimate; `clover-local bench` "
        f"measures): {device_s * 1e3:.1f} ms per token reading weights on the devices, from memory bandwidth at "
        f"{SPEED_CTX_SAMPLE} tokens of context, + {net.seconds_per_token * 1e3:.2f} ms on the network "
        f"({net.share:.0%} of the time): {net.transfers} transfers ({fb(net.bytes_per_token)}) and "
        f"{net.round_trips} round trips per token; a boundary carries {fb(arch.n_embd * 4)} of activations, "
        f"the logits {fb(arch.n_vocab * 4)} when the output head is on a worker. Links: "
        + "; ".join(net.links)
        + ".",
    )


def _pooling_reasons(
    machine: Machine, one: Machine, plan: Placed, remote: tuple[RemoteDevice, ...], used: set[str | None]
) -> list[Reason]:
    workers = ", ".join(w.endpoint for w in machine.workers)
    unused = ", ".join(w.endpoint for w in machine.workers if w.endpoint not in used)
    head = (
        " and the output head stays on this machine's GPU"
        if len(one.gpus) > len(remote)
        else "; with no local GPU the output head is on the last worker, so the logits cross the network every token"
    )
    split = (
        f" (-ts {','.join(f'{s:g}' for s in plan.tensor_split)} in that order)" if plan.tensor_split else ""
    )
    pooling = (
        f"Pooled over llama.cpp's RPC backend with {len(machine.workers)} worker(s) ({workers}): their "
        f"{len(remote)} device(s) are places for layers like local GPUs, each checked on its own. llama.cpp puts "
        f"RPC devices before local GPUs, so the workers take the first offloaded layers{head}{split}."
    )
    idle = f"Not used (no layer left for them): {unused}; left out of --rpc."
    trust = (
        "RPC has no authentication or encryption: use workers only on a network you trust. The embedded "
        "engine (llama-cpp-python) has no RPC backend, so this plan runs with llama-server."
    )
    return [
        Reason("pooling", pooling),
        *([Reason("workers-idle", idle)] if unused else []),
        Reason("rpc-trust", trust),
    ]


def _versus_alone(alone: Placed, plan: Placed, tps: float) -> Reason:
    where = (
        "CPU only"
        if alone.n_gpu_layers == 0
        else "all layers on the GPU"
        if alone.n_gpu_layers < 0 and alone.n_cpu_moe == 0
        else f"experts of {alone.n_cpu_moe} layers in local RAM"
        if alone.n_gpu_layers < 0
        else f"{alone.n_gpu_layers} layers on the GPU"
    )
    head = (
        f"This machine alone: {alone.quant}, context {alone.ctx}, {where}, ~{alone.predicted_tokens_per_s:.0f} tokens/s predicted"
        + ("" if alone.fits else ", and it does not fit well")
    )
    if not alone.fits and plan.fits:
        verdict = "pooling is what makes it fit."
    elif tps > alone.predicted_tokens_per_s * 1.05:
        verdict = f"pooling is faster (~{tps:.0f} vs ~{alone.predicted_tokens_per_s:.0f} tokens/s)."
    elif plan.quant != alone.quant and plan.file_bytes > alone.file_bytes:
        verdict = (
            f"pooling buys the larger {plan.quant} at ~{tps:.0f} tokens/s instead; for speed, drop --rpc "
            f"or use --quant {alone.quant}."
        )
    else:
        verdict = (
            f"pooling does not beat keeping experts in local RAM here (~{tps:.0f} vs "
            f"~{alone.predicted_tokens_per_s:.0f} tokens/s): the network costs more than it saves; drop --rpc "
            "unless you need the memory (a larger context)."
            if alone.n_cpu_moe
            else f"pooling is not faster (~{tps:.0f} vs ~{alone.predicted_tokens_per_s:.0f} tokens/s): drop --rpc "
            "unless you need the memory."
        )
    return Reason("versus-alone", f"{head}: {verdict}")


def pooling_summary(plan: Plan) -> str | None:
    """One line for ``serve`` and ``run``: which workers the plan uses and what the network costs, or why the
    workers were left out; None for a plan made without workers."""
    if plan.alone_tokens_per_s is None:
        return None
    if not plan.rpc_servers:
        unused = find_reason(plan.reasons, "workers-unused")
        return unused.text if unused else None
    share = plan.network.share if plan.network else 0.0
    return (
        f"pooled with {', '.join(plan.rpc_servers)} over RPC: predicted ~{plan.predicted_tokens_per_s:.0f} tokens/s, "
        f"{share:.0%} of the time on the network (this machine alone: ~{plan.alone_tokens_per_s:.0f} tokens/s)"
    )
