"""Find the GPU placement for one model and context: all layers on the GPUs when they fit, else the routed experts
of the first N layers in RAM (``--n-cpu-moe N``, N as small as fits), else fewer layers on the GPUs.

Every GPU is checked on its own (memory is never summed); several GPUs get consecutive layer ranges sized to
their free memory (``tensor_split``). Apple unified memory is checked against the Metal working-set limit and,
because GPU and CPU share the same RAM, against RAM as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clover_local.detect.machine import Machine
from clover_local.gguf.model import ModelDescription
from clover_local.plan import memory
from clover_local.plan.memory import Placement
from clover_local.plan.types import DeviceMemory, MemoryPlan

KV_TYPES_BY_PREFERENCE = ("f16", "q8_0")
"""f16 unless memory is tight; q8_0 halves the KV cache (needs flash attention, which plans turn on)."""


@dataclass(frozen=True)
class Fit:
    """One placement and its memory, per device."""

    n_gpu_layers: int
    """-1: all layers and the output head. 0: CPU only."""
    n_cpu_moe: int
    tensor_split: tuple[float, ...]
    cache_type: str
    memory: MemoryPlan
    placement: Placement
    recurrent_copies: int = 1
    """Copies of the recurrent state held per sequence (1 + rollback snapshots for speculation)."""
    engine: str = "embedded"
    """The engine the memory was planned for (its runtime overhead and recurrent copies differ)."""
    n_seq: int = 1
    """Slots the memory holds: each its own ``ctx`` KV cells, recurrent state and checkpoints."""

    @property
    def gpus_fit(self) -> bool:
        return all(g.fits for g in self.memory.gpus)

    @property
    def fits(self) -> bool:
        return self.gpus_fit and self.memory.ram.fits

    @property
    def all_on_gpu(self) -> bool:
        return self.n_gpu_layers < 0 and self.n_cpu_moe == 0 and bool(self.memory.gpus)


def placement_words(n_gpu_layers: int, n_cpu_moe: int) -> str:
    """Where a placement puts the layers, in the words every reason uses (``n_gpu_layers`` below 0: all)."""
    if n_gpu_layers == 0:
        return "CPU only"
    if n_gpu_layers < 0:
        return f"experts of {n_cpu_moe} layers in RAM" if n_cpu_moe else "all on the GPU"
    return f"{n_gpu_layers} layers on the GPU"


def uses_gpus(machine: Machine) -> bool:
    return machine.offload_backend != "cpu" and bool(machine.gpus)


def evaluate(
    machine: Machine,
    model: ModelDescription,
    ctx: int,
    *,
    n_gpu_layers: int,
    n_cpu_moe: int,
    cache_type: str,
    n_ubatch: int = 512,
    margin_scale: float = 1.0,
    recurrent_copies: int = 1,
    engine: str = "embedded",
    n_seq: int = 1,
) -> Fit:
    """Memory per device for one placement of ``n_seq`` slots of ``ctx`` tokens; for several GPUs the layer
    split is balanced to free memory."""
    gpus = machine.gpus if uses_gpus(machine) else ()
    split: tuple[float, ...] = ()
    if len(gpus) > 1:
        split = _balanced_split(
            machine, model, ctx, n_gpu_layers, n_cpu_moe, cache_type, n_ubatch, recurrent_copies, n_seq
        )
    p = memory.place(
        model,
        ctx=ctx,
        n_gpus=len(gpus),
        n_gpu_layers=n_gpu_layers if gpus else 0,
        n_cpu_moe=n_cpu_moe if gpus else 0,
        tensor_split=split,
        type_k=cache_type,
        type_v=cache_type,
        n_ubatch=n_ubatch,
        n_seq=n_seq,
        recurrent_copies=recurrent_copies,
    )
    gpu_mem = tuple(
        DeviceMemory(
            name=f"gpu{g.index}",
            capacity_bytes=g.free_bytes,
            weights_bytes=p.gpu_weights[i],
            kv_cache_bytes=p.gpu_kv[i],
            recurrent_state_bytes=p.gpu_recurrent[i],
            compute_bytes=p.gpu_compute[i],
            margin_bytes=int(memory.GPU_MARGIN_BYTES * margin_scale),
            runtime_bytes=memory.runtime_overhead_bytes(machine.offload_backend, engine)
            if i in set(p.devices)
            else 0,
        )
        for i, g in enumerate(gpus)
    )
    ram_capacity = machine.memory.available_bytes
    if machine.unified_memory:
        ram_capacity -= sum(g.used_bytes for g in gpu_mem)  # the same memory: what Metal holds, RAM lacks
    ram = DeviceMemory(
        name="ram",
        capacity_bytes=max(ram_capacity, 0),
        weights_bytes=p.ram_weights,
        kv_cache_bytes=p.ram_kv,
        recurrent_state_bytes=p.ram_recurrent,
        compute_bytes=p.ram_compute,
        margin_bytes=int(memory.ram_margin_bytes(machine.memory.total_bytes) * margin_scale),
        checkpoint_bytes=0
        if model.diffusion is not None
        else memory.checkpoint_bytes(
            model.architecture, ctx, cache_type, cache_type, n_ubatch, n_seq, engine
        ),
    )
    return Fit(
        n_gpu_layers=n_gpu_layers if gpus else 0,
        n_cpu_moe=n_cpu_moe if gpus else 0,
        tensor_split=split,
        cache_type=cache_type,
        memory=MemoryPlan(gpus=gpu_mem, ram=ram),
        placement=p,
        recurrent_copies=recurrent_copies,
        engine=engine,
        n_seq=n_seq,
    )


def _candidates(model: ModelDescription) -> list[tuple[int, int]]:
    """(n_gpu_layers, n_cpu_moe) from fastest to slowest."""
    n = model.architecture.n_layers
    out = [(-1, 0)]
    if model.architecture.is_moe:
        out += [(-1, k) for k in range(1, n + 1)]
    moe_all = n if model.architecture.is_moe else 0
    out += [(layers, moe_all) for layers in range(n, 0, -1)]
    return out


def find_fit(
    machine: Machine,
    model: ModelDescription,
    ctx: int,
    n_ubatch: int = 512,
    *,
    recurrent_copies: int = 1,
    engine: str = "embedded",
    n_seq: int = 1,
) -> Fit:
    """The fastest placement whose GPUs all fit; f16 KV first, q8_0 when that saves a step. When RAM is then
    short too (more offload only moves bytes to RAM), the result has ``fits == False``."""

    def at(n_gpu_layers: int, n_cpu_moe: int, cache_type: str) -> Fit:
        return evaluate(
            machine,
            model,
            ctx,
            n_gpu_layers=n_gpu_layers,
            n_cpu_moe=n_cpu_moe,
            cache_type=cache_type,
            n_ubatch=n_ubatch,
            recurrent_copies=recurrent_copies,
            engine=engine,
            n_seq=n_seq,
        )

    if not uses_gpus(machine):
        fits = [at(0, 0, t) for t in KV_TYPES_BY_PREFERENCE]
        return next((f for f in fits if f.fits), fits[-1])
    for ngl, moe in _candidates(model):
        for cache_type in KV_TYPES_BY_PREFERENCE:
            fit = at(ngl, moe, cache_type)
            if fit.gpus_fit:
                return fit
    # Not even one layer fits on the GPU: the CPU does all the work.
    return at(0, 0, "f16")


def refit(
    machine: Machine,
    model: ModelDescription,
    fit: Fit,
    ctx: int,
    *,
    n_ubatch: int = 512,
    n_seq: int | None = None,
    margin_scale: float = 1.0,
) -> Fit:
    """``fit``'s placement (layers, experts in RAM, KV type, state copies, engine) at another context, number of
    slots (None: ``fit``'s) or margin."""
    return evaluate(
        machine,
        model,
        ctx,
        n_gpu_layers=fit.n_gpu_layers,
        n_cpu_moe=fit.n_cpu_moe,
        cache_type=fit.cache_type,
        n_ubatch=n_ubatch,
        margin_scale=margin_scale,
        recurrent_copies=fit.recurrent_copies,
        engine=fit.engine,
        n_seq=fit.n_seq if n_seq is None else n_seq,
    )


def _balanced_split(
    machine: Machine,
    model: ModelDescription,
    ctx: int,
    n_gpu_layers: int,
    n_cpu_moe: int,
    cache_type: str,
    n_ubatch: int,
    recurrent_copies: int = 1,
    n_seq: int = 1,
) -> tuple[float, ...]:
    """Layers per GPU (as ``tensor_split`` proportions, output head counted on the last GPU), filling each GPU
    in proportion to its free memory after margin and compute buffer."""
    arch = model.architecture
    n = arch.n_layers
    gpus = machine.gpus
    dense = model.dense_bytes_per_layer()
    experts = model.expert_bytes_per_layer()
    kv = memory.kv_bytes_per_layer(arch, ctx, cache_type, cache_type, n_ubatch, n_seq)
    rec = memory.recurrent_bytes_per_layer(arch, recurrent_copies * n_seq)
    _, output = memory.embedding_and_output_bytes(model)
    act = memory.offloaded_layer_count(n, n_gpu_layers)
    start = n + 1 - act
    sizes: list[int] = [
        dense[il] + (0 if il < n_cpu_moe else experts[il]) + kv[il] + rec[il] for il in range(start, n)
    ]
    sizes.append(output + memory.tied_output_bytes(model))
    room = [
        max(
            g.free_bytes
            - memory.GPU_MARGIN_BYTES
            - memory.compute_buffer_bytes(arch, n_ubatch, holds_output=i == len(gpus) - 1),
            1,
        )
        for i, g in enumerate(gpus)
    ]
    return tuple(float(c) for c in _fill(sizes, room))


def _fill(sizes: Sequence[int], room: Sequence[int]) -> list[int]:
    """Counts of consecutive items per bin, each bin taking a share of the total proportional to its room."""
    total, total_room = sum(sizes), sum(room)
    counts = [0] * len(room)
    g, filled = 0, 0.0
    target_end = total * room[0] / total_room
    for size in sizes:
        while g < len(room) - 1 and filled + size / 2 > target_end:
            g += 1
            target_end += total * room[g] / total_room
        counts[g] += 1
        filled += size
    return counts
