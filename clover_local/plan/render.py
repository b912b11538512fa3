"""A plan for people and programs: the ``--json`` object (:func:`plan_to_dict`), the terminal report with a
memory table per device (:func:`describe_plan`, ``clover-local plan``) and the app's short summary
(:func:`plan_summary`, the plan screen). Pure: no I/O.

The words both front ends share come from one function each, so the app and the command line never disagree:
whether it fits (:func:`fit_verdict`, :func:`device_verdict`), what runs it (:func:`runs_with`), and which
reasons lead (``reasons.leading_reasons``; the rest are folded behind ``plan --why`` and the app's expander)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from clover_local.arch_support import check_to_dict
from clover_local.detect.units import format_bytes as fb
from clover_local.detect.units import gigabytes
from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
from clover_local.plan.reasons import LEADING, folded_reasons, leading_reasons
from clover_local.plan.speed import format_tokens_per_s
from clover_local.plan.types import DeviceMemory, Plan
from clover_local.presets import Preset


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The ``--json`` object: the plan's fields, per-device memory with totals, argv and kwargs."""
    out = asdict(plan)
    out["memory"] = {
        "gpu_bytes": plan.memory.gpu_bytes,
        "ram_bytes": plan.memory.ram.used_bytes,
        "gpus": [_device(d) for d in plan.memory.gpus],
        "ram": _device(plan.memory.ram),
    }
    out["reasons"] = [r.text for r in plan.reasons]  # the sentences: what scripts have always read
    out["why"] = [{"code": r.code, "text": r.text, "leads": r.code in LEADING} for r in plan.reasons]
    out["fit_verdict"] = fit_verdict(plan)
    out["runs_with"] = runs_with(plan)
    out["size_sources"] = dict(plan.size_sources)
    if plan.architecture is not None:
        out["architecture"] = check_to_dict(plan.architecture)
    out["llama_server_args"] = llama_server_args(plan)
    out["llama_cpp_kwargs"] = llama_cpp_kwargs(plan)
    return out


def _device(d: DeviceMemory) -> dict[str, Any]:
    return {**asdict(d), "used_bytes": d.used_bytes, "fits": d.fits}


def fit_verdict(plan: Plan) -> str:
    """Whether the plan fits, in the words every front end uses ("fits", "does not fit well": it may still load,
    paging weights from disk)."""
    return "fits" if plan.fits else "does not fit well"


def device_verdict(device: DeviceMemory) -> str:
    """One device's verdict (the memory table, the app's bars): "" when it fits, else what it lacks."""
    over = device.used_bytes + device.margin_bytes - device.capacity_bytes
    return "" if device.fits else f"short by {fb(max(over, 0))}"


def runs_with(plan: Plan) -> str:
    """What runs the plan, in a few words (the plan's "Runs with" line, the app's machine panel): an installed
    runtime, the release to install, or the engine the plan was budgeted for."""
    arch = plan.architecture
    if arch is not None and (arch.runtime or arch.install or not arch.supported):
        return arch.runs_with
    if plan.engine == "llama-server":
        return "llama-server (its own llama.cpp)"
    return "the embedded engine (the pinned llama.cpp, llama-cpp-python)"


def describe_plan(plan: Plan, preset: Preset, *, every_reason: bool = False) -> list[str]:
    """Text for people: the recommendation, a memory table per device, the reasons that decide it (every reason
    with ``every_reason``: ``plan --why``) and the alternatives."""
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
        f"{preset.display_name}: {plan.quant} ({fb(plan.file_bytes)}), context {plan.ctx}"
        + (f" x {plan.parallel} slots" if plan.parallel > 1 else "")
        + f", {where}, "
        + (
            f"diffusion ({plan.diffusion.schedule} schedule, {plan.diffusion.steps_per_block} steps per block)"
            if plan.diffusion is not None
            else f"KV {plan.cache_type_k}, ~{format_tokens_per_s(plan.predicted_tokens_per_s)} tokens/s ({plan.speed_source})"
        )
        + ("" if plan.fits else f"  [{fit_verdict(plan).upper()}]"),
        f"Runs with: {runs_with(plan)}",
        *([_fits_instead(plan)] if plan.community is not None else []),
        "",
        f"{'memory':{width}} {'weights':>11} {'KV cache':>11} {'recurrent':>11} {'compute':>11} {'total':>11} "
        f"{'available':>11} {'margin':>10}",
    ]
    checkpoints = plan.memory.ram.checkpoint_bytes
    prompt_cache = plan.memory.ram.prompt_cache_bytes
    runtime = any(d.runtime_bytes for d in plan.memory.gpus)
    if runtime:
        lines[-1] += f" {'GPU runtime':>11}"
    if checkpoints:
        lines[-1] += f" {'checkpoints':>11}"
    if prompt_cache:
        lines[-1] += f" {'prompt cache':>12}"
    for d in (*plan.memory.gpus, plan.memory.ram):
        lines.append(
            f"{d.name:{width}} {fb(d.weights_bytes):>11} {fb(d.kv_cache_bytes):>11} {fb(d.recurrent_state_bytes):>11} "
            f"{fb(d.compute_bytes):>11} {fb(d.used_bytes):>11} {fb(d.capacity_bytes):>11} {fb(d.margin_bytes):>10}"
            + (f" {fb(d.runtime_bytes):>11}" if runtime else "")
            + (f" {fb(d.checkpoint_bytes):>11}" if checkpoints else "")
            + (f" {fb(d.prompt_cache_bytes):>12}" if prompt_cache else "")
            + ("" if d.fits else f"  {device_verdict(d)}")
        )
    lines += ["", "Why:"]
    lines += [f"  - {r.text}" for r in leading_reasons(plan.reasons)]
    folded = folded_reasons(plan.reasons)
    if every_reason:
        lines += [f"  - {r.text}" for r in folded]
    elif folded:
        lines.append(f"  ({len(folded)} more reasons: add --why to read every one)")
    if plan.alternatives:
        lines += ["", "Alternatives:"] + [f"  - {a.quant}: {a.why_not}" for a in plan.alternatives]
    return lines


def plan_summary(plan: Plan) -> str:
    """The recommendation in four lines (the app's plan screen): quant, context, offload, speed, whether it fits."""
    where = "all layers on GPU" if plan.n_gpu_layers == -1 else f"{plan.n_gpu_layers} layers on GPU"
    if plan.backend == "cpu":
        where = "CPU only"
    experts = f", experts of {plan.n_cpu_moe} layers in RAM" if plan.n_cpu_moe else ""
    spec = "on" if plan.speculative.enabled else "off"
    est = " (estimated sizes)" if plan.estimated else ""
    head = [
        f"{plan.quant} · {gigabytes(plan.file_bytes)}{est} · context {plan.ctx:,} tokens"
        + (f" · {plan.parallel} slots" if plan.parallel > 1 else ""),
        f"{where}{experts} · speculative decoding {spec}",
        f"Predicted speed: about {format_tokens_per_s(plan.predicted_tokens_per_s)} tokens/s"
        if plan.diffusion is None
        else f"Diffusion: {plan.diffusion.schedule} schedule, {plan.diffusion.steps_per_block} steps per block",
        fit_verdict(plan).upper() + ("" if plan.fits else ": see Why"),
        f"Runs with: {runs_with(plan)}",
    ]
    if plan.community is not None:
        head.append(_fits_instead(plan))
    return "\n".join(head)


def _fits_instead(plan: Plan) -> str:
    """The smaller community quant that fits where the plan does not, and the command that gets it."""
    c = plan.community
    assert c is not None
    return f"Fits instead: {c.quant} of {c.repo} ({fb(c.file_bytes)}): `{c.command}`"
