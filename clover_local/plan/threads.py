"""How many CPU threads llama.cpp gets: the one place that decides it, for both engines.

llama.cpp's CPU threads meet at a barrier after every operation of the graph and wait there by spinning
(``ggml_barrier`` in ggml-cpu.c spins on an atomic; there is no sleeping wait). When the threads fill every
core and any other process wants one (a browser, a build, the chat UI itself), one thread loses its core for
a scheduler time slice while the others spin at the barrier, burning the very CPU it needs: decoding drops
from ~56 to ~0.5 tokens/s on a 2-core machine with one busy process. Leaving one core to the rest of the
machine keeps it usable: the cost when the machine is idle is one core's share of the work, small where
decoding is limited by memory bandwidth, and bounded on small machines (measured in docs/reliability-general.md,
``scripts/bench_contention.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ThreadPlan:
    threads: int
    """Generation (decode) threads: llama.cpp ``-t`` / ``n_threads``."""
    threads_batch: int
    """Prompt-processing threads: ``-tb`` / ``n_threads_batch``."""
    reason: str


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


def plan_threads(physical_cores: int, logical_cores: int, wanted: int | None = None) -> ThreadPlan:
    """Threads for a machine with these cores: generation leaves one core free for everything else (at least
    one thread; ``wanted``, ``--threads``, is honoured); batches get every physical core (llama.cpp's own
    default, ``cpu_get_num_math``) in the embedded engine, which drops them to the generation threads while
    other programs keep the CPU busy (``engine.batch_threads``); llama-server, which cannot, batches on the
    generation threads (``plan.llama_args``)."""
    physical = max(1, physical_cores)
    threads = wanted if wanted and wanted > 0 else max(1, physical - 1)
    batch = max(threads, physical)
    count = f"{threads} thread{'' if threads == 1 else 's'}"
    if wanted and wanted > 0:
        why = f"{count} for generation (as asked)"
    elif physical > 1:
        why = (
            f"{count} for generation (physical cores less one: llama.cpp's threads spin-wait for each "
            "other, so one thread sharing a core with another busy program stalls them all; a free core keeps "
            "decoding steady when something else runs)"
        )
    else:
        why = "1 thread for generation (one core)"
    if batch == threads:
        return ThreadPlan(
            threads, batch, f"{why}, and as many for batches (prompt processing, verifying drafts)."
        )
    return ThreadPlan(
        threads,
        batch,
        f"{why}; {batch} for batches in the embedded engine (prompt processing, verifying drafts: every "
        f"physical core, since a batch is compute-bound; {threads} while other programs keep the CPU busy), "
        f"and {threads} in llama-server, which cannot give them back (measured beside one busy program: a "
        "llama-server batching on every core kept 0.07 of its speed).",
    )
