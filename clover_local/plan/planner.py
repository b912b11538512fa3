"""The planner: a described machine, a preset (and GGUF headers when known) and the person's wishes in, a
:class:`Plan` out. Pure: no I/O, so it is tested with tables of machines.

Quant: the best quality whose weights, KV cache and buffers fit in *fast* memory (all on the GPU(s), or in the
Apple working set; on a CPU, Q8_0 only when it fits RAM comfortably and the goal is quality, because decoding is
bandwidth-bound and Q4_K_M reads half the bytes), else the smallest quant, with experts offloaded as needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from clover_local.detect.machine import Machine
from clover_local.detect.simulate import os_reserved_bytes
from clover_local.detect.units import format_bytes as fb
from clover_local.errors import ContextOutOfRange, PlanError, UsageError
from clover_local.gguf.model import ModelDescription, describe_from_preset
from clover_local.plan import memory
from clover_local.plan.diffusion import DiffusionWishes, plan_diffusion, wants_diffusion
from clover_local.plan.fit import Fit, find_fit, refit, uses_gpus
from clover_local.plan.measured import SpeedRecord, apply_measurements, machine_key, model_key
from clover_local.plan.pooled import pooled_plan
from clover_local.plan.reasons import Reason
from clover_local.plan.slots import choose_slots
from clover_local.plan.speed import SPEED_CTX_SAMPLE, LayerWork, format_tokens_per_s, predict_tokens_per_s
from clover_local.plan.threads import ThreadPlan, cpu_repack, plan_threads
from clover_local.plan.types import (
    Alternative,
    DeviceMemory,
    LoadMode,
    MemoryPlan,
    Placed,
    Plan,
    SpeculativePlan,
    Wishes,
    assemble,
)
from clover_local.plan.verify_cost import batch_costs
from clover_local.presets import TEMPLATE_COMPLETION, TEMPLATE_FROM_GGUF, Preset

CPU_COMFORT = 0.75
"""On a CPU-only machine the larger quant must use at most this share of available RAM."""
CTX_GROWTH_LIMIT = 4
"""Without ``--ctx`` the context grows at most to this multiple of the preset default."""
KV_SHARE_LIMIT = 0.10
"""...and only while the KV cache stays under this share of the weights (cheap)."""
N_BATCH, N_UBATCH = 2048, 512
SMALLEST_ADVISED_CTX = 2048
"""A plan that fits only below this many tokens of context is not worth advising: a chat outgrows it at once."""


def context_limit(preset: Preset, models: Iterable[ModelDescription] = ()) -> int:
    """The largest context a plan may use: the preset's maximum and the model's training context, the one its
    GGUF header says where a header was read (a file trained for less than the preset expects is planned for
    what it was trained for, before and after its download alike). The one answer to "how much context may
    this model have": the planner, ``--ctx``'s check, a diffusion canvas, the app's context choices and a
    picked file's first settings all ask it."""
    trained = [d.architecture.n_ctx_train for d in models if d.architecture.n_ctx_train > 0]
    return max(256, min(preset.ctx_max, preset.architecture.n_ctx_train, *trained))


def check_context(ctx: int, preset: Preset, models: Iterable[ModelDescription] = ()) -> None:
    """:class:`ContextOutOfRange` unless ``ctx`` (``--ctx``) is between 256 and :func:`context_limit`: checked
    before anything is allocated, so a wrong number is a sentence, not a failed allocation."""
    limit = context_limit(preset, models)
    if not 256 <= ctx <= limit:
        raise ContextOutOfRange(
            f"A context of {ctx} tokens is outside what {preset.display_name} supports.",
            f"Pick --ctx between 256 and {limit} (the preset's maximum and the model's training context).",
            limit=limit,
        )


def make_plan(
    machine: Machine,
    preset: Preset,
    model: ModelDescription | None = None,
    wishes: Wishes | None = None,
    model_path: str | None = None,
    *,
    models: Mapping[str, ModelDescription] | None = None,
    diffusion_wishes: DiffusionWishes | None = None,
    speed_records: Sequence[SpeedRecord] = (),
) -> Plan:
    """The plan of :func:`plan_placement` (the same arguments) with no later stage: ``decide`` adds them."""
    asked = (machine, preset, model, wishes, model_path)
    return assemble(
        plan_placement(*asked, models=models, diffusion_wishes=diffusion_wishes, speed_records=speed_records)
    )


def plan_placement(
    machine: Machine,
    preset: Preset,
    model: ModelDescription | None = None,
    wishes: Wishes | None = None,
    model_path: str | None = None,
    *,
    models: Mapping[str, ModelDescription] | None = None,
    diffusion_wishes: DiffusionWishes | None = None,
    speed_records: Sequence[SpeedRecord] = (),
) -> Placed:
    """The planner's stage: quant, context, placement and llama.cpp settings for ``preset`` on ``machine``.

    ``model``: the description of one local GGUF (its quant is then the only candidate). ``models``: descriptions
    per quant (e.g. from remote headers) so Q4_K_M and Q8_0 are weighed with exact sizes; quants missing from both
    are described from the preset's fallback sizes. ``speed_records``: decode speeds measured on this machine
    (:mod:`clover_local.plan.measured`), used instead of the estimate where they apply.
    """
    if machine.workers:  # devices lent by other machines (llama.cpp RPC): planned as one machine
        asked = (machine, preset, model, wishes, model_path)
        return pooled_plan(plan_placement, *asked, models=models, speed_records=speed_records)
    wishes = wishes or Wishes()
    candidates = _candidates(preset, model, models or {}, wishes)
    first = next(iter(candidates.values()))
    if wants_diffusion(preset, first):
        return _plan_diffusion_model(machine, preset, candidates, wishes, model_path, diffusion_wishes)
    ctx_limit = context_limit(preset, candidates.values())
    if wishes.ctx is not None:
        check_context(wishes.ctx, preset, candidates.values())
    ctx = wishes.ctx or min(preset.ctx_default, ctx_limit)
    spec = preset.speculative
    enabled = spec.enabled if wishes.speculative is None else wishes.speculative
    speculative = SpeculativePlan(enabled, spec.type, spec.n_match, spec.n_min, spec.n_max)
    fits: dict[str, Fit] = {}
    for q, d in candidates.items():
        copies = memory.recurrent_copies(d.architecture, speculative, wishes.engine)
        fits[q] = find_fit(machine, d, ctx, N_UBATCH, recurrent_copies=copies, engine=wishes.engine)
    quant, why_quant = _choose_quant(machine, candidates, fits, wishes)
    desc, fit = candidates[quant], fits[quant]
    reasons: list[Reason] = [Reason("quant", why_quant)]
    if wishes.ctx is None:
        fit, ctx = _grow_context(machine, desc, fit, ctx, ctx_limit)
    fit, why_slots = choose_slots(machine, desc, fit, ctx, wishes.parallel, N_UBATCH)
    fits = {**fits, quant: fit}  # the plan's memory is this fit's: its context and its slots
    reasons += _placement_reasons(machine, desc, fit)
    reasons += _context_reasons(preset, desc, fit, ctx, wishes, ctx_limit)
    reasons.append(Reason("slots", why_slots))
    if not fit.fits:
        reasons.append(_does_not_fit_advice(machine, desc, fit, ctx))
    threads = _threads(machine, wishes)
    flash = (
        "Flash attention on: llama.cpp supports it on every backend here, it keeps the compute buffer small "
        "at long context, and a quantized KV cache needs it."
    )
    reasons += [Reason("threads", threads.reason), Reason("flash-attn", flash)]
    runtime = memory.runtime_overhead_bytes(machine.offload_backend, wishes.engine)
    if runtime and fit.n_gpu_layers != 0:
        said = (
            f"Planned for the {wishes.engine} engine: {fb(runtime)} per GPU for the {machine.offload_backend} "
            "runtime itself (context, libraries), measured beside llama.cpp's own buffers."
        )
        reasons.append(Reason("runtime-overhead", said))
    reasons.append(Reason("load-mode", _load_mode(machine, fit)[1]))
    if enabled:
        copies = fit.recurrent_copies
        cost = (
            f"the recurrent state is kept {copies} times ({fb(desc.architecture.recurrent_state_bytes * copies)}) "
            "so rejected drafts can be rolled back"
            if copies > 1
            else "no extra memory"
        )
        said = (
            f"Self-speculative decoding ({spec.type}, match {spec.n_match}, draft {spec.n_min}-{spec.n_max} "
            f"tokens): drafts from text already in the context, no second model; {cost}."
        )
        reasons.append(Reason("speculation-ngram", said))
    filled = min(ctx, SPEED_CTX_SAMPLE)
    gpu_read, ram_read = memory.active_bytes_per_token(
        desc, fit.placement, filled, fit.cache_type, fit.cache_type
    )
    work = layer_work(desc, fit.placement, len(machine.gpus), filled)
    tps, speed_notes = predict_tokens_per_s(machine, gpu_read, ram_read, work, threads.threads)
    estimate = tps
    tps, speed_source, speed_why = apply_measurements(
        estimate,
        speed_records,
        machine=machine_key(machine),
        model=model_key(desc.quant, desc.file_bytes),
        n_gpu_layers=fit.n_gpu_layers,
        n_cpu_moe=fit.n_cpu_moe,
        threads=threads.threads,
    )
    if speed_source == "estimate":
        speed = Reason(
            "speed-estimate",
            f"Predicted decode ~{format_tokens_per_s(tps)} tokens/s: an estimate from memory bandwidth and "
            f"per-layer kernel costs {_filled(filled, ctx)}, not a measurement ({'; '.join(speed_notes)}); "
            "run `clover-local bench --llama-bench` to measure.",
        )
    else:
        speed = Reason(
            "speed-measured",
            f"Decode ~{format_tokens_per_s(tps)} tokens/s: {speed_why} "
            f"(the estimate alone: ~{format_tokens_per_s(estimate)}).",
        )
    reasons.append(speed)
    if not desc.exact:
        said = (
            f"Sizes are estimates from the preset ({fb(desc.file_bytes)} file); "
            "with the GGUF header they become exact."
        )
        reasons.append(Reason("sizes-estimated", said))
    on_gpu = uses_gpus(machine) and fit.n_gpu_layers != 0
    speculative = replace(speculative, batch_costs=verification_costs(desc, speculative, on_gpu=on_gpu))
    return _assemble_plan(
        machine,
        preset,
        model_path,
        quant,
        candidates,
        fits,
        threads,
        reasons,
        ctx=ctx,
        speculative=speculative,
        predicted_tokens_per_s=round(tps, 1),
        speed_source=speed_source,
        estimated_tokens_per_s=round(estimate, 1),
        n_batch=N_BATCH,
        n_ubatch=N_UBATCH,
        engine=wishes.engine,
        parallel=fit.n_seq,
        ctx_checkpoints=memory.CTX_CHECKPOINTS if fit.memory.ram.checkpoint_bytes else 0,
    )


def _assemble_plan(
    machine: Machine,
    preset: Preset,
    model_path: str | None,
    quant: str,
    candidates: Mapping[str, ModelDescription],
    fits: Mapping[str, Fit],
    threads: ThreadPlan,
    reasons: Sequence[Reason],
    **decoding: Any,
) -> Placed:
    """The :class:`Placed` of the chosen quant: what every plan takes from its fit, threads and preset, plus
    ``decoding`` (context, batches, speculation, speed: what autoregressive and diffusion plans decide apart)."""
    desc, fit = candidates[quant], fits[quant]
    repack, why_not = cpu_repack(machine.cpu.features)
    if repack and not memory.room_to_repack(fit.memory.ram):
        repack, why_not = False, memory.NO_ROOM_TO_REPACK
    if why_not:
        reasons = (*reasons, Reason("repack", why_not))
    plan_memory, cache_mib = fit.memory, 0
    if decoding.get("diffusion") is None:
        plan_memory, cache_mib, why_cache = _prompt_cache(fit)
        reasons = (*reasons, Reason("prompt-cache", why_cache)) if why_cache else reasons
        if plan_memory.ram.prompt_cache_bytes:  # RAM holds more than the placement said
            ram = ram_reason(plan_memory.ram)
            reasons = tuple(ram if r.code == "ram" else r for r in reasons)
    return Placed(
        preset=preset.name,
        model_path=model_path,
        quant=quant,
        file_bytes=desc.file_bytes,
        n_gpu_layers=fit.n_gpu_layers,
        n_cpu_moe=fit.n_cpu_moe,
        fits=fit.fits,
        memory=plan_memory,
        prompt_cache_mib=cache_mib,
        reasons=tuple(reasons),
        threads=threads.threads,
        threads_batch=threads.threads_batch,
        core_cpus=threads.core_cpus,
        flash_attn="on",
        cache_type_k=fit.cache_type,
        cache_type_v=fit.cache_type,
        load_mode=_load_mode(machine, fit)[0],
        tensor_split=fit.tensor_split,
        chat_template=preset.chat_template,
        backend=machine.offload_backend,
        alternatives=_alternatives(machine, quant, candidates, fits),
        estimated=not desc.exact,
        repack=repack,
        recurrent=desc.architecture.recurrent_state_bytes > 0,
        **decoding,
    )


def _threads(machine: Machine, wishes: Wishes) -> ThreadPlan:
    cpu, busy = machine.cpu, machine.cpu.others_busy_cores
    return plan_threads(
        cpu.physical_cores,
        cpu.logical_cores,
        wishes.threads,
        engine=wishes.engine,
        others_busy=busy,
        core_cpus=cpu.core_cpus if wishes.engine == "llama-server" else (),
    )


def _prompt_cache(fit: Fit) -> tuple[MemoryPlan, int, str | None]:
    """llama-server's prompt cache (``--cache-ram``, MiB) sized from the RAM the fit leaves free; counted in RAM
    and said in a reason when llama-server runs the plan (the embedded engine keeps no such cache, and a command
    line printed from its plan gets the same size)."""
    ram = fit.memory.ram
    mib = memory.prompt_cache_mib(ram.capacity_bytes - ram.used_bytes - ram.margin_bytes)
    if fit.engine != "llama-server":
        return fit.memory, mib, None
    if not mib:
        why = (
            "No prompt cache (--cache-ram 0): the plan leaves no RAM free for llama-server to keep earlier "
            "prompts' states; a conversation that comes back is read again."
        )
        return fit.memory, 0, why
    cache = mib * memory.MIB
    bound = "upstream's default" if mib == memory.PROMPT_CACHE_MAX_MIB else "the RAM the plan leaves free"
    why = (
        f"Prompt cache {fb(cache)} (--cache-ram {mib}, {bound}): llama-server keeps earlier prompts' states so a "
        "client that comes back resumes without reading its prompt again; counted in RAM, so it never grows "
        "into the margin."
    )
    return replace(fit.memory, ram=replace(ram, prompt_cache_bytes=cache)), mib, why


def _candidates(
    preset: Preset, model: ModelDescription | None, models: Mapping[str, ModelDescription], wishes: Wishes
) -> dict[str, ModelDescription]:
    if model is not None:
        name = model.quant or "file"
        if wishes.quant not in ("auto", name):
            raise UsageError(
                f"--quant {wishes.quant} asked, but the model file is {name}.",
                "Drop --quant, or point --model at a file of that quant.",
            )
        return {name: model}
    if wishes.quant != "auto" and wishes.quant not in preset.quants:
        raise UsageError(
            f"Preset {preset.name} has no quant {wishes.quant!r}.",
            f"Choose one of: auto, {', '.join(preset.quants)}.",
        )
    names = list(preset.quants) if wishes.quant == "auto" else [wishes.quant]
    if not names:
        raise PlanError(f"Preset {preset.name} offers no quant to plan.")
    return {q: models.get(q) or describe_from_preset(preset, q) for q in names}


def _is_fast(machine: Machine, fit: Fit) -> bool:
    """Runs entirely from fast memory: all on the GPU(s)/working set, or comfortably in RAM on a CPU."""
    if uses_gpus(machine):
        return fit.fits and fit.all_on_gpu
    ram = fit.memory.ram
    return fit.fits and ram.used_bytes <= CPU_COMFORT * ram.capacity_bytes


def _choose_quant(
    machine: Machine, descs: Mapping[str, ModelDescription], fits: Mapping[str, Fit], wishes: Wishes
) -> tuple[str, str]:
    by_size = sorted(descs, key=lambda q: descs[q].file_bytes, reverse=True)
    smallest = by_size[-1]
    where = "the GPU" if uses_gpus(machine) else "RAM"
    if len(by_size) == 1:
        return smallest, f"{smallest} ({fb(descs[smallest].file_bytes)}): the only quant to plan."
    if wishes.quant != "auto":
        return wishes.quant, f"{wishes.quant} ({fb(descs[wishes.quant].file_bytes)}): as asked with --quant."
    if wishes.goal == "speed":
        return smallest, (
            f"{smallest} ({fb(descs[smallest].file_bytes)}): goal is speed, and decoding reads every active byte "
            "per token, so the smallest quant is the fastest."
        )
    for q in by_size:
        if q != smallest and _is_fast(machine, fits[q]) and machine.offload_backend != "cpu":
            return q, (
                f"{q} ({fb(descs[q].file_bytes)}): the best quality, and weights, KV cache and buffers all fit "
                f"in GPU memory with margin."
            )
        if q != smallest and _is_fast(machine, fits[q]):
            ram = fits[q].memory.ram
            return q, (
                f"{q} ({fb(descs[q].file_bytes)}): the best quality, goal is quality, and it uses "
                f"{ram.used_bytes / max(ram.capacity_bytes, 1):.0%} of available RAM (limit {CPU_COMFORT:.0%}); "
                "expect about half the speed of the smaller quant."
            )
    return smallest, (
        f"{smallest} ({fb(descs[smallest].file_bytes)}): larger quants do not fit in {where} with margin, and "
        "offloading their experts to slower memory would cost more speed than the quality is worth."
    )


def _grow_context(
    machine: Machine, desc: ModelDescription, fit: Fit, ctx: int, limit: int
) -> tuple[Fit, int]:
    """A larger context when memory allows cheaply: same placement, still fits with double margin, and a KV
    cache under 10% of the weights."""
    weights = sum(g.weights_bytes for g in fit.memory.gpus) + fit.memory.ram.weights_bytes
    best, best_ctx, candidate = fit, ctx, ctx * 2
    while fit.fits and candidate <= min(limit, ctx * CTX_GROWTH_LIMIT):
        grown = refit(machine, desc, fit, candidate, margin_scale=2.0)
        kv = sum(g.kv_cache_bytes for g in grown.memory.gpus) + grown.memory.ram.kv_cache_bytes
        if not grown.fits or kv > KV_SHARE_LIMIT * weights:
            break
        best_ctx, candidate = candidate, candidate * 2
    if best_ctx != ctx:
        best = refit(machine, desc, fit, best_ctx)
    return best, best_ctx


def _placement_reasons(machine: Machine, desc: ModelDescription, fit: Fit) -> list[Reason]:
    out = [Reason("placement", _placement(machine, desc, fit))]
    mem = fit.memory
    if len(mem.gpus) > 1:
        split = ",".join(f"{s:g}" for s in fit.tensor_split)
        said = (
            f"Layers split across GPUs by free memory (tensor split {split} layers), each GPU checked on its "
            "own; memory is never summed."
        )
        out.append(Reason("gpu-split", said))
    if machine.unified_memory:
        said = (
            f"Unified memory: planned against the Metal working set ({machine.gpus[0].note}) and against RAM."
        )
        out.append(Reason("unified-memory", said))
    out.append(ram_reason(mem.ram))
    return out


def ram_reason(ram: DeviceMemory) -> Reason:
    """What the plan puts in RAM, from the same figures as the memory table and bar: said again once the prompt
    cache is counted (:func:`_prompt_cache`), so the reason and the table never give two totals."""
    cache = (
        f" ({fb(ram.prompt_cache_bytes)} of it llama-server's prompt cache)" if ram.prompt_cache_bytes else ""
    )
    return Reason(
        "ram",
        f"RAM: {fb(ram.used_bytes)} planned of {fb(ram.capacity_bytes)} available{cache}, "
        f"{fb(ram.margin_bytes)} kept free.",
    )


def _filled(filled: int, ctx: int) -> str:
    """How full the context is where the speed is predicted: the plan's whole context, or its first tokens."""
    if filled >= ctx:
        return f"with the context full ({ctx} tokens)"
    return f"at the start of a conversation ({filled} of {ctx} tokens; a fuller context decodes slower)"


def _placement(machine: Machine, desc: ModelDescription, fit: Fit) -> str:
    """Where the layers run, in one sentence."""
    n = desc.architecture.n_layers
    if not uses_gpus(machine):
        if machine.gpus and not machine.build.gpu_offload:
            hint = " ".join(machine.hints) or "Rebuild llama-cpp-python with GPU support (docs/engines.md)."
            return f"CPU only: a GPU is present but this llama.cpp build cannot offload to it. {hint}"
        return "CPU only: no usable GPU, so every layer runs from RAM (n_gpu_layers 0)."
    if fit.n_gpu_layers == 0:
        return "CPU only: not even one layer fits in GPU memory next to the compute buffer."
    if fit.all_on_gpu:
        return f"All {n} layers and the output head on the GPU: {_gpu_summary(fit)}."
    if fit.n_gpu_layers < 0:
        return (
            f"Attention, recurrent and shared weights and the output head on the GPU; routed experts of the "
            f"first {fit.n_cpu_moe} of {n} layers in RAM (--n-cpu-moe {fit.n_cpu_moe}), the smallest number "
            f"that fits: {_gpu_summary(fit)}."
        )
    return (
        f"Only {fit.n_gpu_layers} of {n + 1} layers (output head counted) fit on the GPU; the rest run "
        f"from RAM: {_gpu_summary(fit)}."
    )


def _gpu_summary(fit: Fit) -> str:
    return "; ".join(
        f"{g.name} {fb(g.used_bytes)} of {fb(g.capacity_bytes)} free, {fb(g.margin_bytes)} kept free"
        for g in fit.memory.gpus
    )


def _context_reasons(
    preset: Preset, desc: ModelDescription, fit: Fit, ctx: int, wishes: Wishes, limit: int
) -> list[Reason]:
    arch = desc.architecture
    per_token = memory.kv_bytes_per_token(arch, fit.cache_type, fit.cache_type)
    kv = sum(g.kv_cache_bytes for g in fit.memory.gpus) + fit.memory.ram.kv_cache_bytes
    kv //= max(fit.n_seq, 1)  # one slot's
    how = _context_how(preset, ctx, wishes, limit)
    n_swa = sum(memory.is_swa_layer(arch, il) for il in arch.attention_layers)
    which = (
        f"only {len(arch.attention_layers)} of {arch.n_layers} layers hold KV"
        if len(arch.attention_layers) < arch.n_layers
        else f"{n_swa} of {arch.n_layers} layers keep only a {arch.sliding_window}-token window"
        if n_swa
        else "every layer holds KV"
    )
    index = memory.kv_cell_index_bytes(arch, ctx, N_UBATCH)  # one slot's, in RAM wherever the cells are
    in_ram = f"; {fb(index)} of it in RAM, llama.cpp's index of the cells" if index else ""
    out = [
        Reason(
            "context",
            f"Context {ctx} tokens ({how}); KV cache {fb(kv)}{' per slot' if fit.n_seq > 1 else ''} at {fit.cache_type} ({fb(per_token)} per token: {which}{in_ram}).",
        )
    ]
    if fit.cache_type != "f16":
        said = f"KV cache {fit.cache_type}: memory is tight, and it halves the KV cache against f16."
        out.append(Reason("kv-cache-type", said))
    if arch.recurrent_state_bytes:
        said = f"Recurrent state {fb(arch.recurrent_state_bytes)} per sequence, whatever the context."
        out.append(Reason("recurrent-state", said))
    checkpoints = fit.memory.ram.checkpoint_bytes
    if checkpoints:
        what = "recurrent state" if fit.engine == "embedded" else "recurrent state and sliding-window cells"
        if not arch.recurrent_state_bytes:
            what = "sliding-window cells"
        per = "each slot's" if fit.n_seq > 1 else "the"
        engine = "the embedded engine" if fit.engine == "embedded" else fit.engine
        said = (
            f"Context checkpoints: {engine} keeps up to {memory.CTX_CHECKPOINTS} copies of {per} {what} in "
            f"RAM (at most {fb(checkpoints)}), taken at the end of each prompt, so a conversation that grows "
            "re-evaluates only its new tokens where this model's cache cannot be cut back."
        )
        out.append(Reason("checkpoints", said))
    template = preset.chat_template
    if template not in (TEMPLATE_FROM_GGUF, TEMPLATE_COMPLETION):
        said = f"Chat template: llama.cpp's built-in {template!r} (the GGUF has none)."
        out.append(Reason("chat-template", said))
    return out


def _context_how(preset: Preset, ctx: int, wishes: Wishes, limit: int) -> str:
    """Where the context's size came from, in a few words: asked for, the preset's default, grown from it, or the
    most the model takes when that is less than the default (never "grown" for a context smaller than it)."""
    if wishes.ctx:
        return "as asked"
    if ctx == preset.ctx_default:
        return f"the preset default {preset.ctx_default}"
    if ctx > preset.ctx_default:
        return f"grown from the default {preset.ctx_default} because memory allows it cheaply"
    return f"the most this model takes ({limit}), below the preset default {preset.ctx_default}"


def _does_not_fit_advice(machine: Machine, desc: ModelDescription, fit: Fit, ctx: int) -> Reason:
    """What is short, and only the changes that would make it fit: a smaller context when one of at least
    :data:`SMALLEST_ADVISED_CTX` tokens does (planned as ``fit`` was; a diffusion canvas is its own ubatch),
    closing other programs when what they hold covers the shortfall."""

    def fit_at(c: int) -> Fit:
        ubatch = c if desc.diffusion is not None else N_UBATCH
        copies, engine = fit.recurrent_copies, fit.engine
        return find_fit(machine, desc, c, ubatch, recurrent_copies=copies, engine=engine, n_seq=fit.n_seq)

    short = [d for d in (*fit.memory.gpus, fit.memory.ram) if not d.fits]
    lacking = ", ".join(
        f"{d.name} needs {fb(d.used_bytes + d.margin_bytes)} but has {fb(d.capacity_bytes)}" for d in short
    )
    tips = []
    smaller = ctx // 2
    while smaller >= SMALLEST_ADVISED_CTX:
        if fit_at(smaller).fits:
            tips.append(f"a smaller context (--ctx {smaller})")
            break
        smaller //= 2
    if desc.quant and desc.quant != "Q4_K_M":
        tips.append("the smaller Q4_K_M quant")
    held = _held_by_others(machine)
    if held and sum(_over(d) for d in short) <= held:
        tips.append(f"closing other programs (they hold about {fb(held)} of RAM)")
    tips.append("more RAM")
    return Reason(
        "does-not-fit",
        f"Does not fit well: {lacking}. It may still load with mmap, paging weights from disk, but slowly. "
        f"Try {', '.join(tips)}.",
    )


def _held_by_others(machine: Machine) -> int:
    """RAM other programs hold beyond what the system itself keeps (as ``--simulate`` reserves it): what
    closing them could free."""
    total = machine.memory.total_bytes
    return max(total - machine.memory.available_bytes - os_reserved_bytes(total), 0)


def _load_mode(machine: Machine, fit: Fit) -> tuple[LoadMode, str]:
    if fit.all_on_gpu and not machine.unified_memory:
        return "none", (
            "Load mode none (no mmap): every weight lives on the GPU, so reading the file once into GPU "
            "memory is enough and no mapping of the whole file is kept in RAM; mlock is never used by default."
        )
    return "mmap", (
        "Load mode mmap: weights used from RAM are read straight from the page cache, shared with other "
        "tools, and loading starts fast; mlock is never used by default (it can starve the rest of the system)."
    )


def _alternatives(
    machine: Machine, chosen: str, descs: Mapping[str, ModelDescription], fits: Mapping[str, Fit]
) -> tuple[Alternative, ...]:
    out: list[Alternative] = []
    for q, fit in fits.items():
        if q == chosen:
            continue
        size = fb(descs[q].file_bytes)
        if not fit.fits:
            short = [d for d in (*fit.memory.gpus, fit.memory.ram) if not d.fits]
            why = f"{size}: does not fit well ({', '.join(f'{d.name} short by {fb(_over(d))}' for d in short)})."
        elif uses_gpus(machine) and not fit.all_on_gpu:
            why = f"{size}: fits only with experts of {fit.n_cpu_moe} layers in RAM, slower than {chosen}."
        elif descs[q].file_bytes > descs[chosen].file_bytes:
            why = f"{size}: fits, but reads more bytes per token, so decodes slower (goal or comfort rule)."
        else:
            why = f"{size}: fits and is faster, but lower quality; use --goal speed or --quant {q}."
        out.append(Alternative(quant=q, fits=fit.fits, why_not=why))
    return tuple(out)


def _over(d: DeviceMemory) -> int:
    return d.used_bytes + d.margin_bytes - d.capacity_bytes


def verification_costs(
    desc: ModelDescription, speculative: SpeculativePlan, *, on_gpu: bool
) -> tuple[float, ...]:
    """The fixed cost model the drafter decides with (:mod:`clover_local.plan.verify_cost`) for this model and
    placement: routed experts read per distinct expert, everything else once per batch."""
    arch = desc.architecture
    experts = sum(desc.expert_bytes_per_layer())
    share = arch.n_expert_used / arch.n_expert if arch.n_expert else 0.0
    _, output = memory.embedding_and_output_bytes(desc)
    return batch_costs(
        n_max_batch=speculative.n_max + 1,
        on_gpu=on_gpu,
        dense_bytes=sum(desc.dense_bytes_per_layer()) + output,
        expert_bytes=experts * share,
        n_expert=arch.n_expert,
        n_expert_used=arch.n_expert_used,
    )


def layer_work(desc: ModelDescription, placement: memory.Placement, n_gpus: int, filled: int) -> LayerWork:
    """Which device runs each layer per token (for the speed model's fixed per-layer costs), and the attention
    the CPU's layers compute over ``filled`` tokens of context."""
    arch = desc.architecture
    recurrent = set(memory.recurrent_layers(arch))
    cells = memory.kv_cells_per_layer(arch, filled)
    heads = arch.n_head or arch.n_head_kv
    gpu_layers, gpu_rec = [0] * n_gpus, [0] * n_gpus
    cpu_layers = cpu_experts = cpu_attention = 0
    for il, d in enumerate(placement.devices[: arch.n_layers]):
        if d < 0:
            cpu_layers += 1
            cpu_attention += heads * cells[il]
            continue
        gpu_layers[d] += 1
        gpu_rec[d] += il in recurrent
        cpu_experts += il < placement.n_cpu_moe and arch.n_expert > 0
    return LayerWork(
        gpu_layers=tuple(gpu_layers),
        gpu_recurrent_layers=tuple(gpu_rec),
        moe=arch.n_expert > 0,
        cpu_layers=cpu_layers,
        cpu_expert_layers=cpu_experts,
        cpu_attention_head_cells=cpu_attention,
    )


def _plan_diffusion_model(
    machine: Machine,
    preset: Preset,
    candidates: dict[str, ModelDescription],
    wishes: Wishes,
    model_path: str | None,
    diffusion_wishes: DiffusionWishes | None,
) -> Placed:
    """A diffusion model: the canvas (prompt + answer) is the context and one batch; no KV cache, no
    speculation; placement and quant as for any model, with the compute and output buffers of the canvas."""
    desc0 = next(iter(candidates.values()))
    canvas_limit = context_limit(preset, [desc0])
    if wishes.ctx is not None and not 256 <= wishes.ctx <= canvas_limit:
        raise UsageError(
            f"A canvas of {wishes.ctx} tokens is outside what {preset.display_name} supports.",
            f"Pick --ctx between 256 and {canvas_limit}.",
        )
    dplan, dreasons = plan_diffusion(desc0, preset.diffusion, diffusion_wishes, wishes.ctx)
    canvas = dplan.canvas
    fits = {q: find_fit(machine, d, canvas, canvas) for q, d in candidates.items()}
    quant, why_quant = _choose_quant(machine, candidates, fits, wishes)
    desc, fit = candidates[quant], fits[quant]
    reasons = [Reason("quant", why_quant), *dreasons, *_placement_reasons(machine, desc, fit)]
    if not fit.fits:
        reasons.append(_does_not_fit_advice(machine, desc, fit, canvas))
    threads = _threads(machine, wishes)
    reasons += [
        Reason("threads", f"{threads.reason.rstrip('.')}; every step is one {canvas}-token batch."),
        Reason("load-mode", _load_mode(machine, fit)[1]),
        Reason(
            "speculation-off",
            "No speculative decoding: a diffusion model already writes many tokens per step.",
        ),
        Reason(
            "speed-not-predicted",
            "Speed is not predicted for diffusion (each step is one canvas-sized batch, compute-bound): "
            "`clover-local bench --model FILE` measures block lengths and steps per block side by side.",
        ),
    ]
    if not desc.exact:
        said = f"Sizes are estimates from the preset ({fb(desc.file_bytes)} file)."
        reasons.append(Reason("sizes-estimated", said))
    return _assemble_plan(
        machine,
        preset,
        model_path,
        quant,
        candidates,
        fits,
        threads,
        reasons,
        ctx=canvas,
        speculative=SpeculativePlan(enabled=False),
        predicted_tokens_per_s=0.0,
        n_batch=canvas,
        n_ubatch=canvas,
        diffusion=dplan,
    )
