"""What the planner decides: plain frozen values, turned into llama.cpp settings by ``plan.llama_args``. A plan
is built in stages, each a value (:class:`Placed`, :class:`Provenance`, :class:`Speculation`), assembled once."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Literal

from clover_local.arch_support import ArchCheck
from clover_local.plan.diffusion import DiffusionPlan
from clover_local.plan.reasons import Reason, ReasonCode

Goal = Literal["quality", "speed"]
LoadMode = Literal["auto", "mmap", "mlock", "mmap+mlock", "none"]
FlashAttn = Literal["on", "off", "auto"]
EngineKind = Literal["embedded", "llama-server"]
SpecMode = Literal["auto", "mtp", "dflash", "dspark", "eagle3", "ngram", "off"]
"""A self-speculation mode (``--spec``; ``plan.speculation.SPEC_MODES`` lists them): what is asked for, and the
mode a plan chose (never ``auto``)."""


@dataclass(frozen=True)
class Wishes:
    """What the person asked for; None means "decide for me"."""

    quant: str = "auto"
    ctx: int | None = None
    goal: Goal = "quality"
    speculative: bool | None = None
    threads: int | None = None
    parallel: int | None = 1
    """Slots: requests decoded at once (``--parallel``); None: as many as fit, up to
    :data:`clover_local.plan.slots.DEFAULT_SLOTS`."""
    engine: EngineKind = "embedded"
    """Which engine will run the plan: they hold different memory (``plan.memory.runtime_overhead_bytes``,
    ``plan.memory.recurrent_copies``)."""


@dataclass(frozen=True)
class DeviceMemory:
    """Planned bytes in one place (a GPU or system RAM), by what they hold."""

    name: str
    """``gpu0`` ... or ``ram``."""
    capacity_bytes: int
    """Free memory the plan may use there (before the margin)."""
    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    recurrent_state_bytes: int = 0
    compute_bytes: int = 0
    margin_bytes: int = 0
    runtime_bytes: int = 0
    """What the GPU runtime itself holds in the process (CUDA context, cuBLAS, graphs): not in llama.cpp's log,
    but in the device's memory all the same."""
    checkpoint_bytes: int = 0
    """Context checkpoints at most: copies of each slot's partial state (recurrent state, sliding-window cells)
    at prompt positions, in RAM only (``plan.memory.checkpoint_bytes``)."""
    prompt_cache_bytes: int = 0
    """llama-server's prompt cache at most (``--cache-ram``): saved states of earlier prompts, in RAM only, sized
    from what the plan leaves free (``plan.memory.prompt_cache_mib``); 0 on the embedded engine, which has none."""

    @property
    def used_bytes(self) -> int:
        return (
            self.weights_bytes
            + self.kv_cache_bytes
            + self.recurrent_state_bytes
            + self.checkpoint_bytes
            + self.prompt_cache_bytes
            + self.compute_bytes
            + self.runtime_bytes
        )

    @property
    def fits(self) -> bool:
        return self.used_bytes + self.margin_bytes <= self.capacity_bytes


@dataclass(frozen=True)
class MemoryPlan:
    gpus: tuple[DeviceMemory, ...]
    ram: DeviceMemory

    @property
    def gpu_bytes(self) -> list[int]:
        return [g.used_bytes for g in self.gpus]


@dataclass(frozen=True)
class DraftMemory:
    """What a draft head adds on one device (``plan.speculation``): its weights, its own KV cache, and the draft
    context's compute buffer. Already counted in the plan's ``memory``; listed here to say what is the draft's."""

    device: str
    weights_bytes: int = 0
    kv_cache_bytes: int = 0
    recurrent_state_bytes: int = 0
    compute_bytes: int = 0

    @property
    def used_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.recurrent_state_bytes + self.compute_bytes


@dataclass(frozen=True)
class SpeculativePlan:
    enabled: bool
    type: str = "ngram-mod"
    """llama.cpp's ``--spec-type``: ``ngram-mod``, or a drafter (``draft-mtp``, ``draft-dflash``...)."""
    n_match: int = 24
    n_min: int = 2
    n_max: int = 16
    batch_costs: tuple[float, ...] = ()
    """Relative cost of verifying 1, 2, ... tokens in one batch (``plan.verify_cost``); fixed when the plan is
    made so drafting never depends on timings. Empty: a linear CPU-like model."""
    costs_source: str = "model"
    """``measured`` (timed on this machine by the engine, ``engine.verify_probe``) or ``model`` (the fixed model
    of ``plan.verify_cost``, until the engine has measured)."""
    costs_key: str = ""
    """Where this plan's measured costs are kept (``plan.measured.verify_costs_key``); empty: never measured (a
    plan made without a machine to key it by)."""
    mode: SpecMode = "ngram"
    """``ngram``, ``mtp``, ``dflash``, ``dspark``, ``eagle3`` or ``off`` (``plan.speculation``)."""
    requested: SpecMode = "auto"
    """What the person asked for (``--spec``)."""
    head: str | None = None
    """Where the drafter's weights are: ``embedded`` (MTP blocks in the model file) or ``sidecar``."""
    sidecar: str | None = None
    """The drafter file llama.cpp loads with ``-md`` (a local path; the repo file name before download)."""
    draft_n_max: int = 3
    """Tokens a drafter head proposes per step (``--spec-draft-n-max``)."""
    head_experts_in_ram: bool = False
    """The head's routed experts stay in RAM, as the trunk's do under ``--n-cpu-moe``."""
    head_overrides: tuple[str, ...] = ()
    """``<regex>=CPU`` tensor overrides that keep an embedded head's experts in RAM (``-ot``)."""
    draft_memory: tuple[DraftMemory, ...] = ()
    why: str = ""
    """One sentence: why this mode."""


@dataclass(frozen=True)
class Alternative:
    """Another choice the planner weighed, and why it was not taken."""

    quant: str
    fits: bool
    why_not: str


@dataclass(frozen=True)
class CommunityPick:
    """A smaller quant of another GGUF repo of the model that fits where the plan's own quants do not
    (``plan.community``): what it is, what its plan on this machine would be, and the command that gets it."""

    repo: str
    quant: str
    """As its file names carry it (``Q3_K_XL`` of ``...-UD-Q3_K_XL.gguf``): what ``--quant`` takes."""
    files: tuple[str, ...]
    file_bytes: int
    ctx: int
    n_gpu_layers: int
    n_cpu_moe: int
    ram_bytes: int
    gpu_bytes: tuple[int, ...]
    predicted_tokens_per_s: float
    size_source: str
    """Where its sizes came from (its GGUF header on the Hub, or the repo listing's file size)."""
    command: str
    """The one command that gets it (``clover-local download --repo ... --quant ...``)."""
    why: str
    quality: str = ""
    """What its publisher says it costs in quality, in their words (empty: they say nothing)."""


@dataclass(frozen=True)
class NetworkCost:
    """What one generated token costs on the network when devices of other machines are pooled (RPC)."""

    seconds_per_token: float
    bytes_per_token: int
    transfers: int
    """Tensors sent or received per token (activations at each boundary, logits when the head is remote)."""
    round_trips: int
    """Waits for a worker's answer per token (one each time computation comes back from a worker)."""
    share: float
    """The network's share of the predicted time per token."""
    links: tuple[str, ...] = ()
    """One line per worker: its link and where the figures came from."""


@dataclass(frozen=True)
class Placed:
    """The planner's stage (``plan.planner.plan_placement``): what it decides for a machine, before the others."""

    preset: str
    model_path: str | None
    """A local GGUF (first shard) when known; None before download."""
    quant: str
    file_bytes: int
    ctx: int
    """Tokens of context each slot holds (``-c`` is ``ctx * parallel``, split evenly between the slots)."""
    n_gpu_layers: int
    """-1 = all layers. 0 on CPU-only plans."""
    n_cpu_moe: int
    """Expert tensors of the first N layers stay in RAM (llama.cpp ``--n-cpu-moe N``)."""
    fits: bool
    memory: MemoryPlan
    speculative: SpeculativePlan
    predicted_tokens_per_s: float
    """Decode tokens/s: measured on this machine, calibrated from measurements, or estimated (``speed_source``)."""
    reasons: tuple[Reason, ...]
    """Why each choice, one sentence each (``plan.reasons``): code finds a reason by its code, never its text."""
    threads: int
    threads_batch: int
    core_cpus: tuple[int, ...] = ()
    """llama-server's cores, one CPU each (``--cpu-mask``; ``plan.threads.bound``); empty: not bound."""
    n_batch: int = 2048
    n_ubatch: int = 512
    flash_attn: FlashAttn = "auto"
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    load_mode: LoadMode = "mmap"
    split_mode: Literal["none", "layer"] = "layer"
    main_gpu: int = 0
    tensor_split: tuple[float, ...] = ()
    """Per-GPU proportions for several GPUs; empty for one or none."""
    chat_template: str = "gguf"
    """From the preset: ``gguf``, a llama.cpp built-in name, or ``completion``."""
    backend: str = "cpu"
    engine: str = "embedded"
    """The engine whose memory the plan budgets (``Wishes.engine``)."""
    alternatives: tuple[Alternative, ...] = field(default=())
    estimated: bool = True
    """True when sizes came from the preset, not an exact GGUF tensor table."""
    speed_source: str = "estimate"
    """``measured``, ``calibrated`` or ``estimate`` (:mod:`clover_local.plan.measured`)."""
    estimated_tokens_per_s: float = 0.0
    """The speed model's own estimate, whatever ``speed_source`` says."""
    rpc_servers: tuple[str, ...] = ()
    """Workers (``host:port``) whose devices the plan uses through llama.cpp's RPC backend (``--rpc``)."""
    network: NetworkCost | None = None
    """The network's part of the predicted time, when workers are pooled."""
    alone_tokens_per_s: float | None = None
    """With workers: the predicted speed of this machine planned alone, for comparison."""
    diffusion: DiffusionPlan | None = None
    """Set for diffusion models: decode by denoising steps over the canvas (n_ctx = n_batch = n_ubatch)."""
    parallel: int = 1
    """Slots: sequences decoded at once, each with its own ``ctx`` cells of KV cache and its own recurrent state
    (llama.cpp's ``n_seq_max``, llama-server's ``-np``); chosen by ``plan.slots``."""
    ctx_checkpoints: int = 0
    """Context checkpoints each slot may keep (llama-server's ``--ctx-checkpoints``; the embedded engine's
    ``engine.checkpoints``), counted in RAM; 0: none planned (a model whose cache can be cut back)."""
    prompt_cache_mib: int = 0
    """llama-server's prompt cache (``--cache-ram``, MiB; 0 turns it off): the RAM the plan leaves free, up to
    upstream's own default (``plan.memory.prompt_cache_mib``). Never left to that default, which no plan sized."""
    repack: bool = True
    """llama.cpp may repack weights into its extra CPU buffer types (``--no-repack`` when False)."""
    recurrent: bool = False
    """The model keeps a recurrent state (a recurrent or hybrid architecture): speculation on it needs rollback
    snapshots and a batch that holds a whole verification (``plan.llama_args``)."""


@dataclass(frozen=True)
class Plan(Placed):
    """A decided plan: the planner's :class:`Placed` with the later stages, assembled once (:func:`assemble`)."""

    size_sources: tuple[tuple[str, str], ...] = ()
    """(quant, where its sizes came from) for each quant weighed, e.g. ``("Q4_K_M", "exact, from the GGUF
    header of X.gguf on the Hub")``; from :class:`Provenance`."""
    architecture: ArchCheck | None = None
    """What the llama.cpp here makes of the model's ``general.architecture``: loadable, by what runner, and why;
    from :class:`Provenance` (``decide`` refuses an unsupported one unless forced)."""
    community: CommunityPick | None = None
    """When this plan does not fit well: the best smaller quant of the preset's community repos that does
    (``plan.community``); assembled from ``decide``'s pick."""


@dataclass(frozen=True, kw_only=True)
class Stage:
    """What a stage after the planner says: reasons that follow the planner's, and the codes of the planner's
    reasons it overrules (they no longer hold)."""

    reasons: tuple[Reason, ...] = ()
    overrules: tuple[ReasonCode, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Provenance(Stage):
    """Where the plan's model comes from (``decide``, from the facts): its file, where its sizes came from and
    its architecture check."""

    model_path: str | None
    size_sources: tuple[tuple[str, str], ...]
    architecture: ArchCheck


@dataclass(frozen=True, kw_only=True)
class Speculation(Stage):
    """The speculation stage (``plan.speculation.speculate``), fitted to a placement: the mode chosen, the
    memory with the draft's, and whether the placement still fits with it."""

    speculative: SpeculativePlan
    memory: MemoryPlan
    fits: bool


def plan_fits(placed: Placed, speculation: Speculation | None) -> bool:
    """Whether the plan fits: the placement's, with the draft's memory when it speculates."""
    return placed.fits if speculation is None else speculation.fits


def assemble(
    placed: Placed,
    source: Provenance | None = None,
    speculation: Speculation | None = None,
    *said: Stage,
    chat_template: str | None = None,
    community: CommunityPick | None = None,
) -> Plan:
    """The plan, assembled once from its stages: the placement, where its model comes from, its speculation,
    and what later stages say (``said``), their reasons after the planner's in that order; ``chat_template``
    overrides the preset's."""
    stages = [s for s in (source, speculation, *said) if s is not None]
    overruled = {code for s in stages for code in s.overrules}
    decided = {f.name: getattr(placed, f.name) for f in fields(Placed)}
    if source is not None:
        decided.update(
            model_path=source.model_path, size_sources=source.size_sources, architecture=source.architecture
        )
    if speculation is not None:
        decided.update(speculative=speculation.speculative, memory=speculation.memory)
    reasons = [r for r in placed.reasons if r.code not in overruled] + [r for s in stages for r in s.reasons]
    decided.update(fits=plan_fits(placed, speculation), reasons=tuple(reasons), community=community)
    return Plan(**{**decided, "chat_template": chat_template or placed.chat_template})
