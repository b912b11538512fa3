"""Predicted decode speed: generating a token reads every active byte once, and runs every layer's kernels.

An estimate, not a measurement. Per device: bytes read per token over the bandwidth llama.cpp reaches there,
plus a fixed cost per layer (on a GPU a decode step is bound as much by kernel launches and their latency as by
bandwidth: measured on an H200, Clover's 40 layers take ~3.4 ms per token whatever the bytes, so bandwidth alone
predicted 6x too fast), plus a fixed cost for each token that crosses between GPU and CPU when experts or
layers are offloaded. Times add up (layers run one after another). The constants below were fitted to
llama-bench runs of a Clover-shaped Q4_K_M on one H200 (all on the GPU, and with 5 and 23 layers' experts in
RAM) and of Gemma 3 270M on a 2-core CPU; `clover-local bench --llama-bench` records this machine's own numbers,
which the planner then uses instead (:mod:`clover_local.plan.measured`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clover_local.detect.machine import Gpu, Machine

GB = 1e9
SPEED_CTX_SAMPLE = 512
"""Context filled when predicting decode speed (KV read per token): the start of a conversation, as a benchmark's
plain decoding (llama-bench's ``tg``) measures it and the speed records keep it. A fuller context decodes slower,
and not by its bytes alone: on a CPU, attention over every earlier token is computed too (SmolLM2 135M, 30 layers
of full attention: 111 tokens/s at the start, 18 with 4,000 tokens filled; docs/speed.md)."""
DEFAULT_RAM_BANDWIDTH = 50 * GB
"""Desktop dual-channel DDR4/DDR5, conservatively."""
BANDWIDTH_EFFICIENCY = 0.7
"""Share of the peak bandwidth llama.cpp reaches while decoding."""
RAM_BYTES_PER_THREAD = 8 * GB
"""Weight bytes one decode thread reads per second on a machine whose RAM was not measured (``--simulate``): what
each of the 2 threads read on a 2-core AMD EPYC VM, idle, on 6 December 2026 (16-17 GB/s together,
:data:`LLAMA_READ_SHARE`)."""
LLAMA_READ_SHARE = 0.5
"""Share of the streaming read rate measured here (``detect.ram_read``: numpy's SIMD ``max`` over a buffer no
cache holds, each thread alone up to every core at once) that llama.cpp's decode reaches on weights: its kernels
dequantise as they read and meet at a barrier after every operation. Fitted on 6 December 2026 on a 2-core AMD
EPYC VM (AVX2), idle, where plain decoding read 16-17 GB/s of weights against a 31-32 GB/s stream
for SmolLM2 135M (Q4_1), Gemma 3 270M and the full-size Clover-shaped model (Q4_K_M) alike, once the attention
over the context (:data:`CPU_ATTENTION_SECONDS`) is counted apart (``benchmarks/check_speed_prediction.py``,
docs/speed.md). A ratio of two rates on one machine, so it moves less between machines than a rate;
``clover-local bench --llama-bench`` replaces the estimate with a measurement."""
CPU_ATTENTION_SECONDS = 56e-9
"""CPU time, on one thread, of one query head over one cached token in one attention layer, per generated token:
llama.cpp's CPU flash-attention kernel costs per (head, cell) nearly whatever the head's size. Fitted on the same
VM with ``llama-bench -n 64 -d 0,512 -t 2``: 512 cached tokens added 3.9 ms a token to SmolLM2 135M (30 layers of 9
heads of 64) and 1.1 ms to Gemma 3 270M (18 layers of 4 heads of 256): 28 and 29 ns per head and cell on 2 threads.
It is why a small model slows as its context fills (SmolLM2: 155 tokens/s empty, 96 with 512 tokens), and nearly
nothing for Clover (10 attention layers of 40). A CPU-speed constant, so a faster core is predicted on the slow
side; ``bench --llama-bench`` measures."""
GPU_LAYER_SECONDS = 40e-6
"""Fixed GPU time of one attention layer per token (its ~15 kernels' launches and latency)."""
GPU_RECURRENT_EXTRA_SECONDS = 40e-6
"""Extra for a recurrent layer (Gated DeltaNet: convolution, gating and state-update kernels)."""
GPU_MOE_EXTRA_SECONDS = 15e-6
"""Extra for a MoE layer's routing (top-k, gather, expert matmuls by id)."""
CPU_LAYER_SECONDS = 15e-6
"""Fixed CPU time of one layer per token (the threads meet at a barrier after each operation)."""
HYBRID_TOKEN_SECONDS = 1.7e-3
"""Per token, when layers or experts run on both a GPU and the CPU: scheduling, synchronisation and copies
between them (measured: 1.6-1.8 ms on the H200 host with 5 and with 23 layers' experts in RAM)."""

# (max memory in GiB, bandwidth in GB/s) by vendor: a typical card of that size, conservatively.
_DISCRETE_TABLE: dict[str, tuple[tuple[float, float], ...]] = {
    "nvidia": ((8, 300), (12, 360), (16, 450), (24, 900), (48, 800), (1e9, 2000)),
    "amd": ((8, 256), (16, 500), (24, 900), (1e9, 1600)),
    "intel": ((8, 224), (1e9, 450)),
}
# Apple Silicon by unified memory: base / Pro / Max / Ultra chips.
_APPLE_TABLE: tuple[tuple[float, float], ...] = ((24, 100), (48, 200), (96, 300), (1e9, 400))


def _lookup(table: Sequence[tuple[float, float]], total_bytes: int) -> float:
    gib = total_bytes / 1024**3
    for limit, gbs in table:
        if gib <= limit + 0.5:
            return gbs * GB
    return table[-1][1] * GB


def gpu_bandwidth(gpu: Gpu, ram_bytes: int) -> tuple[float, str]:
    """Bytes per second of one GPU's memory, and where the figure came from."""
    if gpu.bandwidth_bytes_per_s:
        return gpu.bandwidth_bytes_per_s, "reported"
    if gpu.vendor == "apple":
        return _lookup(_APPLE_TABLE, ram_bytes), "typical Apple chip with this much memory"
    table = _DISCRETE_TABLE.get(gpu.vendor, _DISCRETE_TABLE["intel"])
    return _lookup(table, gpu.total_bytes), f"typical {gpu.vendor} card of this size"


def ram_bandwidth(machine: Machine) -> float:
    """Peak system RAM bandwidth; on Apple Silicon the CPU reads the same unified memory as the GPU.

    Without a measurement: a dual-channel desktop up to 8 logical cores, a workstation (quad channel) up to 16,
    a server above that. The CPU reaches it only with enough threads: see :func:`ram_read_rate`."""
    for gpu in machine.gpus:
        if gpu.unified:
            return gpu_bandwidth(gpu, machine.memory.total_bytes)[0]
    cores = machine.cpu.logical_cores
    return DEFAULT_RAM_BANDWIDTH * (1 if cores <= 8 else 2 if cores <= 16 else 4)


def ram_read_rate(machine: Machine, threads: int | None) -> tuple[float, str]:
    """Bytes per second llama.cpp's CPU backend reads weights at while decoding, and where the figure comes from.
    Measured on this machine (``detect.ram_read``): :data:`LLAMA_READ_SHARE` of what ``threads`` threads
    streamed. Not measured (a described machine): the RAM's share (:data:`BANDWIDTH_EFFICIENCY`) or what the
    threads can pull (:data:`RAM_BYTES_PER_THREAD`), whichever is less."""
    n = threads or machine.cpu.physical_cores or 1
    measured = machine.memory.ram_read
    if measured is not None:
        streamed = measured.rate(n) / GB
        source = (
            f"llama.cpp's share, {LLAMA_READ_SHARE:.0%}, of the {streamed:.0f} GB/s {n} "
            f"thread{'s' if n != 1 else ''} streamed from this machine's RAM, measured {measured.date}"
        )
        if not measured.quiet:
            source += " while other programs were busy"
        return measured.rate(n) * LLAMA_READ_SHARE, source
    peak = ram_bandwidth(machine) * BANDWIDTH_EFFICIENCY
    return min(peak, n * RAM_BYTES_PER_THREAD), "a typical machine's RAM, not measured here"


@dataclass(frozen=True)
class LayerWork:
    """What each device runs per generated token, for the fixed costs beside the bytes read."""

    gpu_layers: tuple[int, ...] = ()
    """Layers on each GPU."""
    gpu_recurrent_layers: tuple[int, ...] = ()
    """Of those, recurrent ones (Gated DeltaNet, Mamba): more kernels per layer."""
    moe: bool = False
    cpu_layers: int = 0
    """Whole layers on the CPU."""
    cpu_expert_layers: int = 0
    """Layers on a GPU whose routed experts run on the CPU (``--n-cpu-moe``)."""
    cpu_attention_head_cells: int = 0
    """For the layers on the CPU: query heads times the cached tokens each attends over (the context filled)."""


def predict_tokens_per_s(
    machine: Machine,
    gpu_bytes: Sequence[float],
    ram_bytes: float,
    work: LayerWork | None = None,
    threads: int | None = None,
) -> tuple[float, list[str]]:
    """Tokens per second for the bytes read per token on each GPU and in RAM, plus the fixed per-layer cost on
    each device, with one note per device."""
    work = work or LayerWork()
    seconds = 0.0
    notes: list[str] = []
    for gpu, n_bytes in zip(machine.gpus, gpu_bytes, strict=False):
        i = gpu.index
        n_layers = work.gpu_layers[i] if i < len(work.gpu_layers) else 0
        if n_bytes <= 0 and n_layers == 0:
            continue
        bw, source = gpu_bandwidth(gpu, machine.memory.total_bytes)
        n_rec = work.gpu_recurrent_layers[i] if i < len(work.gpu_recurrent_layers) else 0
        # kernel launches and their latency, whatever the bytes
        moe = GPU_MOE_EXTRA_SECONDS if work.moe else 0.0
        recurrent = GPU_LAYER_SECONDS + GPU_RECURRENT_EXTRA_SECONDS + moe
        fixed = n_rec * recurrent + (n_layers - n_rec) * (GPU_LAYER_SECONDS + moe)
        seconds += n_bytes / (bw * BANDWIDTH_EFFICIENCY) + fixed
        notes.append(
            f"gpu{i}: {n_bytes / GB:.2f} GB per token at {bw / GB:.0f} GB/s ({source}) "
            f"+ {fixed * 1e3:.1f} ms of kernel launches for {n_layers} layers"
        )
    if ram_bytes > 0:
        rate, source = ram_read_rate(machine, threads)
        n_threads = threads or machine.cpu.physical_cores or 1
        attention = work.cpu_attention_head_cells * CPU_ATTENTION_SECONDS / n_threads
        seconds += ram_bytes / rate + work.cpu_layers * CPU_LAYER_SECONDS + attention
        said = f"RAM: {ram_bytes / GB:.2f} GB per token at {rate / GB:.0f} GB/s ({source})"
        if attention >= 0.5e-3:
            said += f" + {attention * 1e3:.1f} ms of attention over the context"
        notes.append(said)
    if any(work.gpu_layers) and (work.cpu_layers or work.cpu_expert_layers):
        seconds += HYBRID_TOKEN_SECONDS
        notes.append(f"GPU and CPU hand over each token: +{HYBRID_TOKEN_SECONDS * 1e3:.1f} ms")
    if seconds <= 0:
        return 0.0, notes
    return 1.0 / seconds, notes


def format_tokens_per_s(tokens_per_s: float) -> str:
    """A speed as every screen writes it: rounded to a tenth first (as the plan keeps it), then one decimal below
    10 tokens/s and whole numbers above. The plan's summary and its reasons both write through this, so
    2.54 tokens/s reads "2.5" in both, never "about 2" in one and "~3" in the other."""
    tenths = round(tokens_per_s, 1)
    return f"{tenths:.1f}" if tenths < 10 else f"{tenths:.0f}"
