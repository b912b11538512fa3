"""The memory model: how many bytes llama.cpp will hold where, for a model, a context and a GPU placement.

Pure functions that mirror llama.cpp at the vendored commit (0c1e570):

- KV cache (``src/llama-kv-cache*.cpp``): only layers with attention hold KV; cells are padded to 256. Sliding-window
  layers (Gemma 3) hold ``min(ctx, window + n_ubatch)`` cells, padded to 256 (``llama_kv_cache_iswa``), unless
  ``swa_full``. With ``n_seq`` slots the cache is one stream per slot (``kv_unified`` off, what ``-np N`` gives):
  ``-c`` is split evenly (``n_ctx_seq = n_ctx / n_seq_max``, ``llama-context.cpp``), so each slot holds its own
  ``ctx`` cells and its own sliding window, and the whole cache is ``n_seq`` times one slot's. Each stream's cell
  index (``llama-kv-cells.h``) lives on the host heap, wherever the cells do: :data:`KV_CELL_INDEX_BYTES` a cell.
- Recurrent state (``llama-memory-recurrent.cpp``): a fixed size per sequence, whatever the context; one cell per
  slot (``mem_size = max(1, n_seq_max)``), each kept ``1 + n_rs_seq`` times.
- Context checkpoints (llama-server's ``--ctx-checkpoints``, ``server-context.cpp``; the embedded engine's
  ``engine.checkpoints``): on models whose cache cannot be cut back (recurrent state; on llama-server a sliding
  window too), each slot keeps copies of its partial state in RAM so the next turn can resume from one: at most
  ``n_ctx_checkpoints`` per slot, each the slot's recurrent state (and, on llama-server, its SWA cells).
- Compute buffer: calibrated on the real ``sched_reserve: CPU compute buffer size`` log line. For Gemma 3 270M
  (n_vocab 262,144, n_embd 640, n_ubatch 512) llama.cpp reserves 514.50 MiB at 4K and 16K context, flash attention
  on or off = ``n_ubatch * (n_vocab + 2 * n_embd) * 4`` bytes exactly: the logits of a full ubatch dominate.
- Placement (``llama_model::load_tensors``): the token embedding stays on the CPU; layer ``il`` goes to a GPU when
  ``il >= n_layer + 1 - n_gpu_layers``; the output head counts as layer ``n_layer``; several GPUs take consecutive
  layer ranges by ``tensor_split``; ``--n-cpu-moe N`` keeps the routed-expert tensors of layers ``< N`` on the CPU.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

from clover_local.gguf.model import ModelDescription
from clover_local.plan.types import DeviceMemory, SpeculativePlan
from clover_local.presets import Architecture

MIB = 1024**2
GIB = 1024**3
CELL_PADDING = 256
"""llama.cpp pads the KV cache (and the SWA cache) to a multiple of 256 cells."""

KV_TYPE_BYTES: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "bf16": 2.0,
    "q8_0": 34 / 32,
    "q5_1": 24 / 32,
    "q5_0": 22 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
    "iq4_nl": 18 / 32,
}
"""Bytes per element of each KV cache type llama.cpp accepts (``-ctk``/``-ctv``): block size / 32 values."""

GPU_MARGIN_BYTES = 1 * GIB
"""Left free on every GPU: driver context, fragmentation, other programs (llama.cpp's ``--fit`` uses 1 GiB too)."""
RAM_MARGIN_FRACTION = 0.05
RAM_MARGIN_MIN_BYTES = 1 * GIB


def pad_cells(n: int) -> int:
    """Round a cell count up to llama.cpp's 256-cell padding."""
    return -(-n // CELL_PADDING) * CELL_PADDING


def is_swa_layer(arch: Architecture, il: int) -> bool:
    """Sliding-window layer? Mirrors ``llama_hparams::set_swa_pattern``: every Nth layer is global."""
    p = arch.sliding_window_pattern
    return bool(arch.sliding_window and p and il % p < p - 1)


def kv_cells_per_layer(arch: Architecture, ctx: int, n_ubatch: int = 512, n_seq: int = 1) -> list[int]:
    """KV cells each layer holds for ``n_seq`` slots of ``ctx`` tokens each (0 for recurrent layers): one stream
    per slot, as llama.cpp splits ``-c`` without ``--kv-unified`` (and without ``swa_full``, which plans pin off)."""
    base = pad_cells(ctx)
    swa = pad_cells(min(base, arch.sliding_window + n_ubatch))
    attention = set(arch.attention_layers)
    return [
        0 if il not in attention else n_seq * (swa if is_swa_layer(arch, il) else base)
        for il in range(arch.n_layers)
    ]


def kv_bytes_per_cell(arch: Architecture, type_k: str = "f16", type_v: str = "f16") -> float:
    """K and V bytes of one cell in one attention layer."""
    return arch.n_head_kv * arch.head_dim * (KV_TYPE_BYTES[type_k] + KV_TYPE_BYTES[type_v])


def kv_bytes_per_layer(
    arch: Architecture,
    ctx: int,
    type_k: str = "f16",
    type_v: str = "f16",
    n_ubatch: int = 512,
    n_seq: int = 1,
) -> list[int]:
    """KV cache bytes of each layer."""
    per_cell = kv_bytes_per_cell(arch, type_k, type_v)
    return [int(c * per_cell) for c in kv_cells_per_layer(arch, ctx, n_ubatch, n_seq)]


def kv_cache_bytes(arch: Architecture, ctx: int, type_k: str = "f16", type_v: str = "f16") -> int:
    """The whole KV cache of one slot in bytes (all layers)."""
    return sum(kv_bytes_per_layer(arch, ctx, type_k, type_v))


KV_CELL_INDEX_BYTES = 148
"""RAM llama.cpp keeps for each cell of each KV stream beside its K and V data, wherever those live
(``llama_kv_cells``, ``llama-kv-cells.h``): a position, an extended position (12 bytes), a shift and a set of the
256 sequences that may hold the cell (52 bytes for every cell), and for a used cell a node in the set of used
cells and one in its sequence's position index (two ``std::set`` nodes, 48 bytes each with glibc's allocator).
Every cell is counted as used: a slot's context may fill. Measured: the tiny hybrid's 4096-cell slots took
0.57 MiB each in RAM beyond llama.cpp's buffers (``benchmarks/check_memory_model.py --slots 3``); this counts 0.58."""


def kv_cell_index_bytes(arch: Architecture, ctx: int, n_ubatch: int = 512, n_seq: int = 1) -> int:
    """RAM for the cell bookkeeping of the KV caches (:data:`KV_CELL_INDEX_BYTES` per cell): one index per stream
    of the full-attention cache and, on a model with sliding-window layers, of the sliding-window cache."""
    cells = kv_cells_per_layer(arch, ctx, n_ubatch, n_seq)
    # Layers share their cache's index: one entry per cache (sliding-window or not) with its cells.
    caches = {(is_swa_layer(arch, il), c) for il, c in enumerate(cells) if c}
    return KV_CELL_INDEX_BYTES * sum(c for _, c in caches)


def kv_bytes_per_token(arch: Architecture, type_k: str = "f16", type_v: str = "f16") -> int:
    """KV bytes one more token of context costs in the full-attention layers (Clover: 20 KiB at f16)."""
    full = [il for il in arch.attention_layers if not is_swa_layer(arch, il)]
    return int(len(full) * kv_bytes_per_cell(arch, type_k, type_v))


def recurrent_layers(arch: Architecture) -> tuple[int, ...]:
    """Layers that carry recurrent state instead of a KV cache (hybrid models)."""
    if not arch.recurrent_state_bytes:
        return ()
    attention = set(arch.attention_layers)
    return tuple(il for il in range(arch.n_layers) if il not in attention)


def rollback_snapshots(speculative: SpeculativePlan) -> int:
    """Recurrent-state snapshots per sequence the embedded engine asks llama.cpp for (``n_rs_seq``) on recurrent
    and hybrid models when a drafter head (MTP) speculates: one per drafted token, so a rejected draft can be
    rolled back. None for n-gram drafts, as on llama-server (``need_n_rs_seq``): snapshots put ``n_rs_seq + 1``
    copies of each layer's convolution state in every step's graph, which cost a hybrid model's plain steps
    8-12% on a 2-core CPU; an n-gram draft is rolled back from one copy of the state instead
    (``engine.checkpoints.DraftRollback``, counted by :func:`recurrent_copies`)."""
    return speculative.n_max + 1 if speculative.enabled and speculative.mode != "ngram" else 0


def recurrent_copies(arch: Architecture, speculative: SpeculativePlan, engine: str = "embedded") -> int:
    """How many times a slot's recurrent state is held: llama.cpp allocates it ``1 + n_rs_seq`` times
    (``llama-memory-recurrent.cpp``: Clover's 63 MiB state would be ~1.1 GiB with the 17 snapshots of MTP drafts
    up to 16 tokens), and the embedded engine's n-gram drafting keeps one copy more (in RAM; counted with the
    state, a bound where it is on a GPU). llama-server asks for snapshots only for drafter heads
    (``need_n_rs_seq`` in ``common/common.h``: ``draft.n_max`` for draft-mtp/eagle3/dflash/dspark); n-gram drafts
    it rolls back from a checkpoint of the state (``common_context_can_seq_rm`` finds no partial removal:
    "speculative decoding will use checkpoints")."""
    if not arch.recurrent_state_bytes:
        return 1
    if engine == "llama-server":
        drafter = speculative.enabled and speculative.type.startswith("draft-")
        return 1 + (speculative.n_max if drafter else 0)
    return 1 + rollback_snapshots(speculative) + (1 if rolls_back_from_a_copy(speculative) else 0)


def rolls_back_from_a_copy(speculative: SpeculativePlan) -> bool:
    """Whether the embedded engine rolls rejected drafts back from one copy of the recurrent state (taken before
    each verification, in RAM) rather than through llama.cpp's snapshots: n-gram drafts do."""
    return speculative.enabled and not rollback_snapshots(speculative)


RUNTIME_OVERHEAD_BYTES: dict[tuple[str, str], int] = {
    ("cuda", "embedded"): int(1.2 * GIB),
    ("cuda", "llama-server"): int(0.55 * GIB),
    ("rocm", "embedded"): int(1.2 * GIB),
    ("rocm", "llama-server"): int(0.55 * GIB),
    ("vulkan", "embedded"): int(0.5 * GIB),
    ("vulkan", "llama-server"): int(0.5 * GIB),
    ("sycl", "embedded"): int(0.5 * GIB),
    ("sycl", "llama-server"): int(0.5 * GIB),
}
"""Memory the GPU runtime holds in a process that runs llama.cpp, beyond llama.cpp's own buffers. Measured on an
H200 (CUDA 13) with a Clover-shaped model: the embedded engine's process held 1.16-1.19 GiB more than its
model, KV, recurrent and compute buffers in each of 4 loads; llama-server 0.35-0.54 GiB in 3 loads (issue 10).
Metal and the CPU: none beyond the buffers (Metal's is in the working-set limit already)."""


CTX_CHECKPOINTS = 8
"""Context checkpoints each slot may keep, on either engine: the embedded engine takes two per turn (at the
prompt's end and a few tokens before it, ``engine.checkpoints``), so the last four turns can be resumed;
llama-server gets the same count (``--ctx-checkpoints``; upstream's 32 would hold, for a hybrid model, 32 copies
of each slot's recurrent state in RAM): the plan pins and counts them."""


def keeps_checkpoints(arch: Architecture, engine: str) -> bool:
    """Whether the engine checkpoints a slot's context: on models whose cache cannot be cut back to a prefix.
    llama-server does on a recurrent state or sliding-window layers; the embedded engine on a recurrent state
    (a sliding window it re-evaluates)."""
    if arch.recurrent_state_bytes:
        return True
    return engine == "llama-server" and any(is_swa_layer(arch, il) for il in arch.attention_layers)


def checkpoint_bytes(
    arch: Architecture, ctx: int, type_k: str, type_v: str, n_ubatch: int, n_seq: int, engine: str
) -> int:
    """RAM the context checkpoints may take at most: per slot :data:`CTX_CHECKPOINTS` copies of what a partial
    state holds (``llama_state_seq_get_data_ext`` with ``LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY``: its recurrent
    state and, on llama-server, its sliding-window KV cells; never the full attention cache)."""
    if not keeps_checkpoints(arch, engine):
        return 0
    swa = 0
    if engine == "llama-server":
        per_cell = kv_bytes_per_cell(arch, type_k, type_v)
        one_slot = kv_cells_per_layer(arch, ctx, n_ubatch, 1)
        swa = sum(int(c * per_cell) for il, c in enumerate(one_slot) if is_swa_layer(arch, il))
    return CTX_CHECKPOINTS * n_seq * (arch.recurrent_state_bytes + swa)


def room_to_repack(ram: DeviceMemory) -> bool:
    """Whether RAM holds a repacked copy of the weights read from it beside the file's own pages.

    Repacking (llama.cpp's extra CPU buffer types, ``ggml-cpu/repack.cpp``: Q4_K as 8x8 blocks on AVX2, and the
    like) reads each tensor through the page cache and writes its repacked copy to anonymous memory, which the
    kernel cannot page out; the file's pages stay cached until reclaimed. Where RAM cannot hold both, the load
    evicts pages of tensors that are not repacked and are still read every token, and each prompt reads them
    from disk again. Measured on the full-size Clover-shaped model (19.7 GiB, 24 GB, 2 cores, llama-server,
    docs/speed.md): repacking off loaded in 7.7 s instead of 38 s, read a 500-token prompt at 1.6x and held 2
    GiB less; it decoded as fast on an AVX2 CPU and at 0.88x on an AVX-512 one, whose repacked kernels are
    faster (llama-bench, 6 interleaved rounds)."""
    return (
        ram.weights_bytes == 0 or ram.capacity_bytes - ram.used_bytes - ram.margin_bytes >= ram.weights_bytes
    )


NO_ROOM_TO_REPACK = (
    "Weight repacking off (--no-repack): RAM cannot hold a repacked copy of the weights beside the file's pages, "
    "so repacking would evict weights still in use and read them from disk again at each prompt (measured at "
    "full size: loads 5x faster and prompts 1.6x faster without it; decoding as fast on AVX2 CPUs, about a "
    "tenth slower on AVX-512 ones; docs/speed.md)."
)


PROMPT_CACHE_MAX_MIB = 8192
"""llama-server's own default for ``--cache-ram`` (``common.h``, ``cache_ram_mib``): the most the plan gives it."""
PROMPT_CACHE_MIN_MIB = 64
"""Below this the cache is turned off (``--cache-ram 0``): too small to hold one conversation's saved state."""


def prompt_cache_mib(free_bytes: int) -> int:
    """MiB for llama-server's prompt cache (``--cache-ram``): the RAM a plan leaves free after everything else
    and the margin, at most upstream's default, none when that is too little to be worth it.

    The cache (``server_prompt_cache``, ``tools/server/server-task.cpp``) keeps the whole state of each earlier
    prompt (KV cells, recurrent state, checkpoints) so a client that comes back resumes without reading its prompt
    again; it grows until its limit and evicts the oldest entry. Left at upstream's 8 GiB it grew into memory no
    plan counted (a 30-minute soak: +150 MiB per 10 minutes, docs/reliability.md); sized here, it is counted."""
    mib = max(free_bytes, 0) // MIB
    return min(mib, PROMPT_CACHE_MAX_MIB) if mib >= PROMPT_CACHE_MIN_MIB else 0


def runtime_overhead_bytes(backend: str, engine: str) -> int:
    return RUNTIME_OVERHEAD_BYTES.get((backend, engine), 0)


def recurrent_bytes_per_layer(arch: Architecture, n_seq: int = 1) -> list[int]:
    """Recurrent state of each layer for ``n_seq`` sequences; independent of the context size."""
    layers = set(recurrent_layers(arch))
    if not layers:
        return [0] * arch.n_layers
    per = arch.recurrent_state_bytes * n_seq // len(layers)
    return [per if il in layers else 0 for il in range(arch.n_layers)]


def compute_buffer_bytes(arch: Architecture, n_ubatch: int = 512, holds_output: bool = True) -> int:
    """Scratch memory llama.cpp reserves for one ubatch on one device.

    The device that computes the output head holds the logits of a full ubatch (``n_vocab`` floats per token)
    plus activations; the others only activations. Calibrated on the real log (see module docstring); MoE
    routing scratch (``n_expert_used * expert_ffn`` per token) is added for MoE models.
    """
    activations = 2 * arch.n_embd + 3 * arch.n_expert_used * arch.expert_ffn
    logits = arch.n_vocab if holds_output else 2 * arch.n_embd
    return n_ubatch * (logits + activations) * 4


def output_buffer_bytes(arch: Architecture, n_outputs: int = 1) -> int:
    """The host buffer llama.cpp keeps for returned logits: one token's worth per slot while generating (its
    ``output buffer size`` log line: 1 MiB per slot for Gemma's 262K vocabulary)."""
    return arch.n_vocab * 4 * n_outputs


def ram_margin_bytes(total_ram_bytes: int) -> int:
    return max(RAM_MARGIN_MIN_BYTES, int(total_ram_bytes * RAM_MARGIN_FRACTION))


# ---------------------------------------------------------------------------------------------------------------
# Where each layer lives


def offloaded_layer_count(n_layers: int, n_gpu_layers: int) -> int:
    """Layers (output head included, as in llama.cpp) that go to the GPUs; ``n_gpu_layers < 0`` means all."""
    if n_gpu_layers < 0:
        return n_layers + 1
    return min(n_gpu_layers, n_layers + 1)


def layer_devices(
    n_layers: int, n_gpu_layers: int, n_gpus: int, tensor_split: Sequence[float] = ()
) -> list[int]:
    """Device of each layer and, last, of the output head: a GPU index, or -1 for the CPU.

    Mirrors ``get_layer_buft_list`` in ``llama-model.cpp``: offloaded layers are the last ones; with several GPUs
    layer ``j`` of the offloaded range goes to the first GPU whose cumulative split exceeds ``j / offloaded``.
    """
    act = offloaded_layer_count(n_layers, n_gpu_layers) if n_gpus else 0
    start = n_layers + 1 - act
    splits = list(tensor_split) if tensor_split and any(tensor_split) else [1.0] * max(n_gpus, 1)
    total = sum(splits)
    cumulative: list[float] = []
    running = 0.0
    for s in splits:
        running += s
        cumulative.append(running / total)
    out: list[int] = []
    for il in range(n_layers + 1):
        if il < start:
            out.append(-1)
        else:
            out.append(min(bisect.bisect_right(cumulative, (il - start) / act), n_gpus - 1))
    return out


def embedding_and_output_bytes(model: ModelDescription) -> tuple[int, int]:
    """(token embedding, output head + final norm) bytes. With tied embeddings (no ``output.weight``) the output
    head is the embedding itself: see :func:`tied_output_bytes`."""
    if model.tensors is None:
        glob = model.global_bytes()
        return glob // 2, glob - glob // 2
    embd = model.tensor_bytes("token_embd.weight")
    return embd, model.global_bytes() - embd


def tied_output_bytes(model: ModelDescription) -> int:
    """Extra bytes when the output head reuses the token embedding (Gemma): llama.cpp copies it to the output
    head's device when that is a GPU (the embedding itself stays on the CPU); on the CPU it is shared."""
    if model.tensors is None or model.tensor_bytes("output.weight"):
        return 0
    return model.tensor_bytes("token_embd.weight")


@dataclass(frozen=True)
class Placement:
    """Bytes per device for one GPU placement: index ``i`` is GPU ``i``; ``ram`` is system memory."""

    gpu_weights: tuple[int, ...]
    gpu_kv: tuple[int, ...]
    gpu_recurrent: tuple[int, ...]
    gpu_compute: tuple[int, ...]
    ram_weights: int
    ram_kv: int
    ram_recurrent: int
    ram_compute: int
    devices: tuple[int, ...]
    """Device of each layer then the output head (-1: CPU)."""
    n_cpu_moe: int = 0
    """Routed experts of the first N layers stay in RAM."""


def place(
    model: ModelDescription,
    *,
    ctx: int,
    n_gpus: int,
    n_gpu_layers: int,
    n_cpu_moe: int,
    tensor_split: Sequence[float] = (),
    type_k: str = "f16",
    type_v: str = "f16",
    n_ubatch: int = 512,
    n_seq: int = 1,
    recurrent_copies: int = 1,
) -> Placement:
    """Split weights, KV cache, recurrent state and compute buffers between the GPUs and RAM.
    ``recurrent_copies``: the state's copies per sequence (rollback snapshots, see :func:`recurrent_copies`)."""
    arch = model.architecture
    n = arch.n_layers
    devices = layer_devices(n, n_gpu_layers, n_gpus, tensor_split) if n_gpus else [-1] * (n + 1)
    dense = model.dense_bytes_per_layer()
    experts = model.expert_bytes_per_layer()
    # A diffusion model keeps no KV cache and returns the logits of the whole canvas (one ubatch) each step.
    diffusion = model.diffusion is not None
    kv = [0] * n if diffusion else kv_bytes_per_layer(arch, ctx, type_k, type_v, n_ubatch, n_seq)
    # llama.cpp reserves one row of returned logits per sequence when the context is made
    # (``output_reserve(n_seq_max)``): a slot's next token.
    n_outputs = n_ubatch if diffusion else n_seq
    rec = recurrent_bytes_per_layer(arch, n_seq * recurrent_copies)
    embd, output = embedding_and_output_bytes(model)

    g_w, g_kv, g_rec = [0] * n_gpus, [0] * n_gpus, [0] * n_gpus
    # The caches' cell bookkeeping stays in RAM, wherever the cells' K and V live.
    r_kv = 0 if diffusion else kv_cell_index_bytes(arch, ctx, n_ubatch, n_seq)
    r_w, r_rec = embd, 0
    for il in range(n):
        d = devices[il]
        expert_on_cpu = il < n_cpu_moe
        if d < 0:
            r_w += dense[il] + experts[il]
            r_kv += kv[il]
            r_rec += rec[il]
        else:
            g_w[d] += dense[il] + (0 if expert_on_cpu else experts[il])
            r_w += experts[il] if expert_on_cpu else 0
            g_kv[d] += kv[il]
            g_rec[d] += rec[il]
    out_dev = devices[n]
    if out_dev < 0:
        r_w += output
    else:
        g_w[out_dev] += output + tied_output_bytes(model)

    used = {d for d in devices if d >= 0}
    g_compute = [
        compute_buffer_bytes(arch, n_ubatch, holds_output=(g == out_dev)) if g in used else 0
        for g in range(n_gpus)
    ]
    # The CPU always runs the input layer and keeps the returned logits; it needs the full scratch when it
    # computes the output head or any layer (CPU-only or partial plans).
    cpu_busy = out_dev < 0 or n_cpu_moe > 0 or any(d < 0 for d in devices[:n])
    r_compute = output_buffer_bytes(arch, n_outputs) + compute_buffer_bytes(
        arch, n_ubatch, holds_output=out_dev < 0
    )
    if not cpu_busy:
        r_compute = output_buffer_bytes(arch, n_outputs) + n_ubatch * arch.n_embd * 4 * 2
    return Placement(
        gpu_weights=tuple(g_w),
        gpu_kv=tuple(g_kv),
        gpu_recurrent=tuple(g_rec),
        gpu_compute=tuple(g_compute),
        ram_weights=r_w,
        ram_kv=r_kv,
        ram_recurrent=r_rec,
        ram_compute=r_compute,
        devices=tuple(devices),
        n_cpu_moe=n_cpu_moe,
    )


def active_bytes_per_token(
    model: ModelDescription, placement: Placement, ctx_used: int, type_k: str = "f16", type_v: str = "f16"
) -> tuple[list[float], float]:
    """Bytes read per generated token, per GPU and in RAM: every non-expert weight, the routed experts' active
    share (``n_expert_used / n_expert``), the output head, the KV cache up to ``ctx_used`` tokens, and the
    recurrent state (read and written)."""
    arch = model.architecture
    n = arch.n_layers
    share = arch.n_expert_used / arch.n_expert if arch.n_expert else 1.0
    dense = model.dense_bytes_per_layer()
    experts = model.expert_bytes_per_layer()
    per_cell = kv_bytes_per_cell(arch, type_k, type_v)
    cells = kv_cells_per_layer(arch, ctx_used)
    rec = recurrent_bytes_per_layer(arch)
    _, output = embedding_and_output_bytes(model)
    gpu = [0.0] * len(placement.gpu_weights)
    ram = 0.0

    def add(device: int, n_bytes: float) -> None:
        nonlocal ram
        if device < 0:
            ram += n_bytes
        else:
            gpu[device] += n_bytes

    for il in range(n):
        d = placement.devices[il]
        add(d, dense[il] + cells[il] * per_cell + 2 * rec[il])
        expert_dev = -1 if d < 0 or il < placement.n_cpu_moe else d
        add(expert_dev, experts[il] * share)
    add(placement.devices[n], output + tied_output_bytes(model))  # the logits read the whole head
    return gpu, ram
