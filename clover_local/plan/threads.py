"""How many CPU threads llama.cpp gets: the one place that decides it, for both engines.

llama.cpp's CPU threads meet at a barrier after every operation of the graph and wait there by spinning
(``ggml_barrier`` in ggml-cpu.c spins on an atomic; there is no sleeping wait). When the threads fill every
core and any other process wants one (a browser, a build), one thread loses its core for a scheduler time slice
while the others spin at the barrier, burning the very CPU it needs: decoding drops from ~56 to ~0.5 tokens/s on
a 2-core machine with one busy process. On an idle machine, though, every physical core decodes faster (1.3x on
2 cores: docs/speed.md). So threads follow the load (:func:`threads_for_load`): every physical core while the
other programs leave them free, fewer while they do not. The embedded engine decides it again between steps
(``engine.batch_threads``, ``llama_set_n_threads``); llama-server, whose threads are fixed while it runs, starts
with the count the load measured while the machine was probed (``Cpu.others_busy_cores``) and is started again
between requests when the load changes for long enough (``llamacpp.load_follow``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

SLACK_CORES = 0.25
"""Other programs may use this much of a core and still leave the threads their cores (a shell, a terminal
redrawing)."""


@dataclass(frozen=True)
class ThreadPlan:
    threads: int
    """Generation (decode) threads: llama.cpp ``-t`` / ``n_threads``; the most the embedded engine uses."""
    threads_batch: int
    """Prompt-processing threads: ``-tb`` / ``n_threads_batch``; the most the embedded engine uses."""
    reason: str
    core_cpus: tuple[int, ...] = ()
    """llama-server's cores (one CPU each, ``--cpu-mask``): its threads are bound one to a core while they take
    every one of them (:func:`bound`); empty for the embedded engine, or where the topology is not known."""


def bound(threads: int, core_cpus: tuple[int, ...]) -> bool:
    """Whether llama-server's threads are bound one to a core (``--cpu-strict 1``): when they take every core
    (``core_cpus``). Unbound, two threads beside one busy program can both land where it runs, and llama.cpp's
    threads wait for each other at every step: measured on 2 cores with the full-size Clover-shaped model,
    decode fell to 0.2 tokens/s (or none in 150 s) unbound, 2.9-3.4 bound. With fewer threads than cores (the
    load follower gave some up) they stay free to move to the cores other programs leave."""
    return bool(core_cpus) and threads == len(core_cpus)


def cpu_mask(core_cpus: tuple[int, ...]) -> str:
    """llama.cpp's ``--cpu-mask`` (hex, CPU 0 the lowest bit: ``common.cpp``, ``parse_cpu_mask``)."""
    return f"{sum(1 << c for c in core_cpus):x}"


def binding_flags(threads: int, core_cpus: tuple[int, ...]) -> list[str]:
    """llama-server's flags that keep its threads on ``core_cpus``, decode and batches alike: the mask whenever
    the cores are known, strict placement (thread i on the i-th core) only while the threads take them all
    (:func:`bound`). The one place these flags are written: the plan's argv and a relaunch's
    (``llamacpp.server_args.with_threads``)."""
    if not core_cpus:
        return []
    mask = cpu_mask(core_cpus)
    strict = "1" if bound(threads, core_cpus) else "0"
    return ["-C", mask, "--cpu-strict", strict, "-Cb", mask, "--cpu-strict-batch", strict]


def cores_in_mask(mask: str) -> tuple[int, ...]:
    """The CPUs of a ``--cpu-mask`` value (:func:`cpu_mask` read back); empty for one that is not hex."""
    try:
        bits = int(mask.removeprefix("0x"), 16)
    except ValueError:
        return ()
    return tuple(i for i in range(bits.bit_length()) if bits >> i & 1)


BOUND_WORDS = (
    "; bound one to a core (--cpu-mask, --cpu-strict 1), so a program that gets busy during a reply shares one "
    "core with one thread instead of stalling both (measured: 3 tokens/s against 0.2 unbound)"
)


def threads_for_load(threads: int, threads_batch: int, n_cpus: int, others: float) -> tuple[int, int]:
    """(decode, batch) threads while other programs use ``others`` cores of ``n_cpus`` logical CPUs: as many as
    their cores leave free, at most the planned ``threads`` / ``threads_batch``, at least one; batches never get
    fewer than decoding. The one decision behind every thread count (both engines, every step)."""
    free = math.floor(n_cpus - others + SLACK_CORES)
    decode = max(1, min(threads, free))
    return decode, max(decode, min(threads_batch, free))


AMX_REASON = (
    "Weight repacking off (llama.cpp's extra CPU buffer types, --no-repack): this CPU advertises AMX, and the "
    "pinned llama.cpp's AMX matrix kernels crashed in llama_decode where it was measured (Intel Xeon with AMX "
    "in a virtual machine, every quantized model, both engines); the plain AVX-512 kernels run instead."
)


def cpu_repack(features: Sequence[str]) -> tuple[bool, str | None]:
    """Whether llama.cpp may repack weights into its extra CPU buffer types (AMX, AVX-512 repacks), and why not:
    the one rule for a plan (``Plan.repack``) and for settings given without one (``engine.native``)."""
    if "amx_int8" in features:
        return False, AMX_REASON
    return True, None


def plan_threads(
    physical_cores: int,
    logical_cores: int,
    wanted: int | None = None,
    *,
    engine: str = "embedded",
    others_busy: float | None = None,
    core_cpus: tuple[int, ...] = (),
) -> ThreadPlan:
    """Threads for a machine with these cores. The embedded engine gets every physical core (``wanted``,
    ``--threads``, is the most instead) for decoding and batches, and gives cores back between steps while
    other programs use them. llama-server, whose threads are fixed while it runs, starts with what
    :func:`threads_for_load` leaves for the other programs' load measured while the machine was probed
    (``others_busy``; idle when not measured), decoding and batching alike, and is started again with other
    threads as the load changes (``llamacpp.load_follow``); ``--threads`` as asked stays fixed."""
    physical = max(1, physical_cores)
    logical = max(physical, logical_cores)
    most = wanted if wanted and wanted > 0 else physical
    count = f"{most} thread{'' if most == 1 else 's'}"
    asked = f"{count} (as asked)" if wanted and wanted > 0 else f"{count} (every physical core)"
    if engine == "llama-server":
        if wanted and wanted > 0:
            words = BOUND_WORDS if bound(most, core_cpus) else ""
            return ThreadPlan(
                most,
                most,
                f"llama-server: {asked} for generation and batches, fixed at launch{words}.",
                core_cpus,
            )
        threads, _ = threads_for_load(most, most, logical, others_busy or 0.0)
        measured = (
            "the load was not measured"
            if others_busy is None
            else f"other programs used {others_busy:.1f} cores while the machine was probed"
        )
        return ThreadPlan(
            threads,
            threads,
            f"llama-server: {threads} of {physical} threads for generation and batches ({measured}; each thread "
            "needs a core of its own, since llama.cpp's threads spin-wait for each other and one that shares a "
            f"core stalls them all){BOUND_WORDS if bound(threads, core_cpus) else ''}. Its threads are fixed "
            "while it runs, so when other programs get busy or quiet again for long enough, clover-local starts "
            "it again between requests with the threads the load allows, keeping each conversation's state "
            "(where the next replies gain more than the restart costs).",
            core_cpus,
        )
    batch = max(most, physical)
    batch_part = "" if batch == most else f", {batch} for batches (prompt processing, verifying drafts)"
    return ThreadPlan(
        most,
        batch,
        f"{asked} for generation{batch_part} while the machine is otherwise idle; between steps the embedded "
        "engine gives cores back while other programs use them, down to one thread (llama.cpp's threads "
        "spin-wait for each other, so one thread sharing a core with another busy program stalls them all). "
        "The text is the same on any thread count.",
    )
