"""Slots: how many requests one loaded model decodes at once (llama.cpp's ``n_seq_max``, llama-server's ``-np``).

Each slot holds its own context (one KV stream of ``ctx`` cells, ``plan.memory``), its own recurrent state (and
rollback snapshots) and, on llama-server, its own context checkpoints. The default is as many as fit beside the
placement already chosen for one slot, up to :data:`DEFAULT_SLOTS`: more slots never move weights or experts off
the GPU. A number asked for (``--parallel N``) is planned as asked, and the reasons say what it cost.
"""

from __future__ import annotations

from clover_local.detect.machine import Machine
from clover_local.detect.units import format_bytes as fb
from clover_local.errors import UsageError
from clover_local.gguf.model import ModelDescription
from clover_local.plan.fit import Fit, find_fit, placement_words, refit, uses_gpus

DEFAULT_SLOTS = 4
"""Slots when none are asked for and memory allows (llama-server's own default is 4)."""
MAX_SLOTS = 64
"""The most ``--parallel`` accepts (llama.cpp's limit is 256 sequences; each slot costs a whole context)."""
CPU_SLOT_COMFORT = 0.75
"""On a CPU, default slots may bring planned RAM up to this share of what is available (as the quant rule)."""


def _comfortable(machine: Machine, fit: Fit) -> bool:
    if not fit.fits:
        return False
    if uses_gpus(machine) and fit.n_gpu_layers != 0:
        return True
    ram = fit.memory.ram
    return ram.used_bytes <= CPU_SLOT_COMFORT * ram.capacity_bytes


def choose_slots(
    machine: Machine, model: ModelDescription, fit: Fit, ctx: int, wished: int | None, n_ubatch: int
) -> tuple[Fit, str]:
    """The fit for the slots to plan (``fit.n_seq``) and one sentence why. ``fit``: the placement planned for one
    slot; ``wished``: ``--parallel`` (None: decide)."""
    per_slot = _slot_cost(fit, refit(machine, model, fit, ctx, n_ubatch=n_ubatch, n_seq=2))
    if wished is not None:
        if not 1 <= wished <= MAX_SLOTS:
            raise UsageError(
                f"--parallel {wished} is not a number of slots this server can hold.",
                f"Pick --parallel between 1 and {MAX_SLOTS} (each slot holds a whole context).",
            )
        if wished == 1:
            return fit, "1 slot (--parallel 1): one request is decoded at a time; others wait their turn."
        copies, engine = fit.recurrent_copies, fit.engine
        grown = find_fit(machine, model, ctx, n_ubatch, recurrent_copies=copies, engine=engine, n_seq=wished)
        moved = (grown.n_gpu_layers, grown.n_cpu_moe) != (fit.n_gpu_layers, fit.n_cpu_moe)
        cost = (
            f"; to hold them, the placement changed from the one-slot plan ({_where(fit)} -> {_where(grown)})"
            if moved
            else ""
        )
        return grown, (
            f"{wished} slots, as asked (--parallel): {wished} requests decode at once in one batch, each with its "
            f"own {ctx}-token context ({fb(per_slot)} per slot: KV cache, recurrent state, checkpoints, a row of "
            f"logits){cost}."
        )
    for n in range(DEFAULT_SLOTS, 1, -1):
        grown = refit(machine, model, fit, ctx, n_ubatch=n_ubatch, n_seq=n)
        if _comfortable(machine, grown):
            return grown, (
                f"{n} slots: {n} requests decode at once in one batch (agents fan out), each with its own "
                f"{ctx}-token context; {fb(per_slot)} per slot (KV cache, recurrent state, checkpoints, a row of "
                f"logits) fits beside the same placement (--parallel N to change)."
            )
    return fit, (
        f"1 slot: memory is tight, and a second slot ({fb(per_slot)} more) would not fit beside this placement; "
        "requests are decoded one at a time (--parallel N asks for more, and may move layers off the GPU)."
    )


def _slot_cost(one: Fit, two: Fit) -> int:
    used = sum(g.used_bytes for g in two.memory.gpus) + two.memory.ram.used_bytes
    return used - (sum(g.used_bytes for g in one.memory.gpus) + one.memory.ram.used_bytes)


def _where(fit: Fit) -> str:
    return placement_words(fit.n_gpu_layers, fit.n_cpu_moe)
