"""Which self-speculation mode a plan uses, and what its draft head costs in memory. Pure: no I/O.

The modes are llama.cpp's (``docs/speculative.md`` at the pinned commit):

- ``mtp``: the model's own multi-token-prediction head (``--spec-type draft-mtp``): for qwen35moe one
  full-attention decoder block with the MoE FFN, in the model file (``blk.<n_layer>.nextn.*``) or in an
  ``mtp-`` sidecar (``-md``);
- ``dflash`` / ``dspark`` / ``eagle3``: small drafter sidecars (``-md``, ``--spec-type draft-...``);
- ``ngram``: n-gram lookup over the context (``ngram-mod``), no weights at all;
- ``off``.

``auto`` chooses from what the files offer and where the weights live: measurements from ``bench`` decide
when there are any for this model; without them a drafter head is used only when every expert is on the GPU.
Public reports on Qwen3.5/3.6-35B-A3B with an MTP head: it pays with the experts on the GPU, and halves speed
with them in RAM (94 -> 48 tok/s under ``--n-cpu-moe``), because the head is itself a 256-expert MoE layer
read once per drafted token, and each verification batch reads more experts than one token does.

The draft's memory is added to the plan's devices: the head's weights placed like the trunk's (its routed
experts in RAM when the trunk's are, as ``--n-cpu-moe`` keeps them), its own KV cache (one attention layer
per MTP block, as long as the trunk's context), and the draft context's compute buffer. An MTP context keeps
no recurrent state (llama.cpp gives it a plain KV cache, ``llama-model.cpp`` ``mtp_on_hybrid_qwen``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from clover_local.detect.units import format_bytes as fb
from clover_local.errors import UsageError
from clover_local.gguf.model import ModelDescription
from clover_local.gguf.names import DRAFT_KINDS, FFN_EXPS_REGEX, DraftKind
from clover_local.plan import memory
from clover_local.plan.reasons import Reason
from clover_local.plan.types import (
    DeviceMemory,
    DraftMemory,
    MemoryPlan,
    Placed,
    Speculation,
    SpeculativePlan,
)
from clover_local.plan.types import SpecMode as SpecMode
from clover_local.presets import Architecture

SPEC_MODES: tuple[SpecMode, ...] = ("auto", "mtp", "dflash", "dspark", "eagle3", "ngram", "off")
"""Every ``--spec`` value: the one type for a speculation mode, in every front end and the preferences."""
SERVER_ONLY_MODES: frozenset[str] = frozenset({"dflash", "dspark", "eagle3"})
"""Sidecar drafters llama-server runs and the embedded engine does not (it drafts by n-gram or MTP)."""
SPEC_TYPES: dict[str, str] = {
    "mtp": "draft-mtp",
    "dflash": "draft-dflash",
    "dspark": "draft-dspark",
    "eagle3": "draft-eagle3",
    "ngram": "ngram-mod",
}
"""Mode -> llama.cpp ``--spec-type``."""
DRAFT_N_MAX: dict[str, int] = {"mtp": 3, "dflash": 15, "dspark": 7, "eagle3": 3}
"""Tokens drafted per step: llama.cpp's default (3) for one-token heads; the block sizes of
``docs/speculative.md``'s examples for the block drafters (llama.cpp clamps them to the trained block)."""
MEASURED_GAIN_MIN = 1.05
"""A measured mode must beat plain decoding by this ratio to be chosen."""
NGRAM_RECURRENT_GPU_COST = 0.07
"""Decode speed n-gram self-speculation cost a hybrid (recurrent) model whose layers run on a GPU in the
embedded engine, even when nothing was drafted, when it rolled drafts back through llama.cpp's snapshots (the
recurrent state held 18 times: 1 + a snapshot per token of a draft of up to 16), 1.1 GiB for Clover. Measured
on an H200 with a Clover-shaped model: 216 tokens/s with it on vs 234 off. The engine now copies the state per
draft instead (``engine.checkpoints.DraftRollback``), unmeasured on a GPU, so such plans still leave it off."""
MTP_COMPUTE_FLOATS_PER_EMBD = 10
"""Draft-context compute buffer per ubatch token, in ``n_embd`` floats, besides the attention mask: calibrated
on llama.cpp's load log of the tiny MTP test model at four (context, ubatch) pairs (2.52 MiB per 512 tokens
at n_embd 128; ``tests/test_mtp_embedded.py`` checks it)."""


@dataclass(frozen=True)
class HeadOffer:
    """A drafter the files offer for the chosen quant."""

    kind: DraftKind
    where: Literal["embedded", "sidecar"]
    file: str | None = None
    """The sidecar: a local path when downloaded, else its name in the repo. None when embedded."""
    description: ModelDescription | None = None
    """The sidecar's GGUF header (exact sizes); for an embedded head, the model's own."""


def offered_heads(
    model: ModelDescription | None, sidecars: Mapping[DraftKind, tuple[str, ModelDescription | None]] = {}
) -> tuple[HeadOffer, ...]:
    """The heads to choose from, in llama.cpp's order of preference (mtp, dspark, dflash, eagle3): an MTP head
    inside the model file first (no second file to load), then each sidecar."""
    offers: list[HeadOffer] = []
    if model is not None and model.architecture.n_nextn_layers > 0:
        offers.append(HeadOffer("mtp", "embedded", None, model))
    for kind in DRAFT_KINDS:
        if kind in sidecars and not (kind == "mtp" and offers):
            path, desc = sidecars[kind]
            offers.append(HeadOffer(kind, "sidecar", path, desc))
    return tuple(offers)


def speculate(
    placed: Placed,
    model: ModelDescription,
    offers: Sequence[HeadOffer],
    requested: SpecMode = "auto",
    measured: Mapping[str, float] | None = None,
) -> Speculation:
    """The speculation stage of a placement: the mode chosen (and why), the draft's memory added to its devices.

    ``requested``: ``--spec``. ``measured``: mode -> decode speed ratio over plain, from ``bench`` on this machine
    and model (None or empty: none measured). A head asked for that the files do not have is a
    :class:`UsageError` naming what they have."""
    if requested not in SPEC_MODES:
        raise UsageError(f"--spec {requested!r} is not a mode.", f"Use one of: {', '.join(SPEC_MODES)}.")
    recurrent = model.architecture.recurrent_state_bytes > 0
    mode, head, why = choose_mode(placed, offers, requested, measured or {}, recurrent=recurrent)
    base, fits = placed.speculative, placed.fits
    if mode == "off":
        spec = replace(base, enabled=False, mode="off", requested=requested, why=why)
        return Speculation(
            speculative=spec,
            memory=with_recurrent_copies(placed, model, spec),
            fits=fits,
            reasons=(Reason("speculation-off", f"Speculation off: {why}"),),
            overrules=("speculation-ngram",),  # the planner's n-gram drafting reason no longer holds
        )
    if head is None:  # n-gram
        spec = replace(base, enabled=True, type="ngram-mod", mode="ngram", requested=requested, why=why)
        said = Reason("speculation-mode", f"Speculation by n-gram lookup: {why}")
        return Speculation(speculative=spec, memory=placed.memory, fits=fits, reasons=(said,))
    experts_in_ram = placed.n_cpu_moe > 0 or placed.n_gpu_layers == 0
    draft = draft_memory(placed, model, head, experts_in_ram)
    spec = replace(
        base,
        enabled=True,
        type=SPEC_TYPES[mode],
        mode=mode,
        requested=requested,
        head=head.where,
        sidecar=head.file,
        draft_n_max=DRAFT_N_MAX[mode],
        head_experts_in_ram=experts_in_ram and head.kind == "mtp",
        head_overrides=head_overrides(model, head, experts_in_ram),
        draft_memory=draft,
        why=why,
    )
    mem = add_draft_memory(placed.memory, draft)
    with_draft = fits and all(d.fits for d in (*mem.gpus, mem.ram))
    cost = ", ".join(f"{d.device} {fb(d.used_bytes)}" for d in draft if d.used_bytes)
    where = "in the model file" if head.where == "embedded" else f"sidecar {head.file}"
    reason = f"Speculation by the {mode} head ({where}): {why} The draft adds {cost or 'nothing measurable'}."
    if fits and not with_draft:
        reason += " With it the plan no longer fits well: `--spec ngram` drafts without weights."
    said = Reason("speculation-mode", reason)
    return Speculation(speculative=spec, memory=mem, fits=with_draft, reasons=(said,))


def head_overrides(model: ModelDescription, head: HeadOffer, experts_in_ram: bool) -> tuple[str, ...]:
    """``-ot`` patterns that keep an embedded MTP head's routed experts in RAM, as ``--n-cpu-moe`` keeps the
    trunk's (it covers only blocks below its count; the head is block ``n_layer``)."""
    if head.kind != "mtp" or head.where != "embedded" or not experts_in_ram:
        return ()
    first, n = model.architecture.n_layers, model.architecture.n_nextn_layers
    return tuple(f"blk\\.{il}{FFN_EXPS_REGEX}=CPU" for il in range(first, first + max(n, 1)))


def choose_mode(
    plan: Placed,
    offers: Sequence[HeadOffer],
    requested: SpecMode,
    measured: Mapping[str, float],
    *,
    recurrent: bool = False,
) -> tuple[SpecMode, HeadOffer | None, str]:
    """(mode, the head it runs or None, why in one sentence). ``recurrent``: the model keeps recurrent state
    (a hybrid like Clover), which every rolled-back draft must restore."""
    by_kind: dict[str, HeadOffer] = {o.kind: o for o in offers}
    have = ", ".join(f"{o.kind} ({o.where})" for o in offers) or "none"
    if requested == "off":
        return "off", None, "asked for with --spec off."
    if requested == "ngram":
        return "ngram", None, "asked for with --spec ngram; it drafts from text already in the context."
    if requested != "auto":
        if requested not in by_kind:
            raise UsageError(
                f"--spec {requested}: the model's files have no {requested} head (drafter heads found: {have}).",
                "Download the repo's sidecar with the model (`clover-local download`, without --no-draft), or"
                " pick --spec auto, ngram or off.",
            )
        return requested, by_kind[requested], f"asked for with --spec {requested}."
    if not plan.speculative.enabled:
        return "off", None, "the preset turns self-speculation off."
    usable = {"ngram", *by_kind}
    ratios = {m: measured[m] for m in SPEC_MODES if m in measured and m in usable}
    if ratios:
        best = max(ratios, key=lambda m: ratios[m])
        table = ", ".join(f"{m} {r:.2f}x" for m, r in sorted(ratios.items(), key=lambda kv: -kv[1]))
        if ratios[best] < MEASURED_GAIN_MIN:
            return "off", None, f"bench measured no mode faster than plain decoding here ({table})."
        return best, by_kind.get(best), f"bench measured it fastest on this machine ({table} over plain)."
    ngram_costs = (
        recurrent and plan.engine == "embedded" and plan.n_gpu_layers != 0 and bool(plan.memory.gpus)
    )
    if ngram_costs and (not offers or plan.n_cpu_moe > 0):
        why = (
            f"the model keeps recurrent state and its layers run on the GPU in the embedded engine: rolling back"
            f" an n-gram draft there either holds {1 + plan.speculative.n_max + 1} copies of the state in every"
            f" step (llama.cpp's snapshots: {NGRAM_RECURRENT_GPU_COST:.0%} per token even when nothing is drafted,"
            f" 216 vs 234 tokens/s measured on an H200) or copies it off the GPU for each draft (the embedded"
            f" engine's way, as llama-server does it, unmeasured on a GPU); heads offered:"
            f" {', '.join(o.kind for o in offers) or 'none'}."
        )
        return "off", None, why
    if not offers:
        return "ngram", None, "the model's files offer no drafter head; n-gram lookup needs none."
    if plan.n_gpu_layers == 0:
        why = (
            f"CPU only: a drafter head costs a MoE layer per drafted token and the verification batch is not"
            f" free on a CPU, while n-gram lookup drafts for nothing (heads offered: {have})."
        )
        return "ngram", None, why
    if plan.n_cpu_moe > 0:
        why = (
            f"experts of {plan.n_cpu_moe} layers are in RAM: an MTP head is itself a MoE layer, and verifying"
            f" drafts reads more experts from RAM; reports show MTP halving speed there (94 -> 48 tok/s under"
            f" --n-cpu-moe). Heads offered: {have}; run `clover-local bench` to measure them here."
        )
        return "ngram", None, why
    head = offers[0]
    why = (
        f"every expert is on the GPU, where a trained head drafts well for little (llama.cpp's preference:"
        f" mtp, dspark, dflash, eagle3; offered: {have})."
    )
    return head.kind, head, why


def with_recurrent_copies(plan: Placed, model: ModelDescription, spec: SpeculativePlan) -> MemoryPlan:
    """The plan's memory with the recurrent state held as many times as ``spec`` needs in the plan's engine
    (the planner budgeted the preset's n-gram drafting: 1 + 17 copies in the embedded engine)."""
    arch = model.architecture
    before = memory.recurrent_copies(arch, plan.speculative, plan.engine)
    after = memory.recurrent_copies(arch, spec, plan.engine)
    if before == after:
        return plan.memory

    def scale(dev: DeviceMemory) -> DeviceMemory:
        return replace(dev, recurrent_state_bytes=dev.recurrent_state_bytes * after // before)

    return MemoryPlan(gpus=tuple(scale(g) for g in plan.memory.gpus), ram=scale(plan.memory.ram))


def draft_memory(
    plan: Placed, model: ModelDescription, head: HeadOffer, experts_in_ram: bool
) -> tuple[DraftMemory, ...]:
    """Bytes the draft adds per device: weights (placed like the trunk's last layer; routed experts of an MTP
    head in RAM when ``experts_in_ram``), the draft context's KV cache and compute buffer."""
    desc = head.description or model
    arch = desc.architecture
    on_gpu = plan.n_gpu_layers != 0 and bool(plan.memory.gpus)
    gpu = plan.memory.gpus[-1].name if on_gpu else "ram"
    if head.kind == "mtp":
        first = arch.n_layers
        blocks = [t for t in desc.tensors or () if t.layer is not None and t.layer >= first]
        expert = sum(t.n_bytes for t in blocks if t.is_expert)
        dense = sum(t.n_bytes for t in blocks if not t.is_expert)
        n_kv_layers = max(arch.n_nextn_layers, 1)
        if not blocks:  # no header: one trunk layer's worth
            expert = model.expert_bytes_per_layer()[-1]
            dense = model.dense_bytes_per_layer()[-1]
    else:
        expert, dense = 0, sum(t.n_bytes for t in desc.tensors or ()) or desc.file_bytes
        n_kv_layers = len(arch.attention_layers)
    embd, out = (0, 0)
    if head.where == "sidecar":  # a second model: its own token embedding (always in RAM) and output head
        embd, out = memory.embedding_and_output_bytes(desc) if desc.tensors else (0, 0)
        dense -= embd + out if head.kind != "mtp" else 0
    kv = memory.pad_cells(plan.ctx) * memory.kv_bytes_per_cell(arch, plan.cache_type_k, plan.cache_type_v)
    kv = int(kv * n_kv_layers)
    compute = draft_compute_bytes(arch, plan.ctx, plan.n_ubatch)
    out_buf = memory.output_buffer_bytes(arch, 1) + arch.n_embd * 4  # one output: logits and its hidden row
    rows: dict[str, DraftMemory] = {}

    def add(device: str, **bytes_: int) -> None:
        row = rows.get(device, DraftMemory(device))
        rows[device] = replace(row, **{k: getattr(row, k) + v for k, v in bytes_.items()})

    add(gpu, weights_bytes=dense + out, kv_cache_bytes=kv, compute_bytes=compute)
    add("ram" if experts_in_ram and head.kind == "mtp" else gpu, weights_bytes=expert)
    add("ram", weights_bytes=embd, compute_bytes=out_buf)
    order = [d.name for d in plan.memory.gpus] + ["ram"]
    return tuple(rows[d] for d in order if d in rows)


def draft_compute_bytes(arch: Architecture, n_ctx: int, n_ubatch: int) -> int:
    """The draft context's compute buffer for a full ubatch: the attention mask (``n_ctx`` x ``n_ubatch`` f16,
    the largest part at long context) and one block's activations per token. It returns one output, so no
    ubatch of logits, unlike the trunk."""
    mask = memory.pad_cells(n_ctx) * n_ubatch * 2
    return mask + n_ubatch * MTP_COMPUTE_FLOATS_PER_EMBD * arch.n_embd * 4


def add_draft_memory(mem: MemoryPlan, draft: Sequence[DraftMemory]) -> MemoryPlan:
    """The plan's memory with the draft's bytes added to each device."""
    by_device = {d.device: d for d in draft}

    def grow(dev: DeviceMemory) -> DeviceMemory:
        d = by_device.get(dev.name)
        parts = ("weights_bytes", "kv_cache_bytes", "recurrent_state_bytes", "compute_bytes")
        return dev if d is None else replace(dev, **{k: getattr(dev, k) + getattr(d, k) for k in parts})

    return MemoryPlan(gpus=tuple(grow(g) for g in mem.gpus), ram=grow(mem.ram))
