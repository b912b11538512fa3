"""What verifying a draft costs on this machine, for this model: measured once on the loaded engine.

The drafter sizes drafts from a cost table (``costs[m - 1]``: a batch of ``m`` tokens with logits on every row,
relative to one plain decoding step; :class:`clover_local.engine.drafter.DraftController`). A model of that table
(:mod:`clover_local.plan.verify_cost`) is only a guess: on one CPU a 17-token batch costs 5 steps, on another 8,
and a GPU hardly notices it. So the engine times a plain step and batches of 2 to ``n_max + 1`` tokens after the
same context, once at its first load, interleaved over a few rounds, on the decode threads it gets whenever other
programs are busy (``engine.batch_threads``): an idle machine gives more cores, so the table is a bound that holds
under load.

A table is kept only when the machine was quiet: when the other programs' CPU use (``detect.cpu_load``) during the
probe would have taken a thread away (``plan.threads.threads_for_load``), the probe's threads spun against them and
every ratio says nothing about this machine (beside other work on a 2-core VM: a plain step of 418 ms where 10 ms
is the machine's, a 2-token batch at 1.07 steps where it costs 1.75, so every short draft looked free and
speculation cost 15%). Such a measurement is taken again at a later load; a kept one is stored with the machine's
speed records (``measure.records``) and used as a fixed number: drafting never reads a clock while it generates,
so the same request gives the same text whatever the load, and another machine gets its own costs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from clover_local.detect.cpu_load import others_busy_cores, sample_cpu
from clover_local.engine.batch_threads import LoadThreads
from clover_local.engine.types import MeasuredCosts
from clover_local.plan.threads import threads_for_load


class TimesBatches(Protocol):
    """What the probe times on: the embedded engine (``EmbeddedEngine.time_batches``; it imports this module)."""

    threads: LoadThreads

    @property
    def n_ctx(self) -> int: ...

    def tokenize(self, text: str, *, add_special: bool = True) -> list[int]: ...

    def time_batches(
        self, context: Sequence[int], sizes: Sequence[int], rounds: int, budget_s: float
    ) -> dict[int, list[float]]: ...


CONTEXT_TEXT = (
    "def total(order):\n    return sum(line.price * line.qty for line in order.lines)\n\n"
    "The quick brown fox jumps over the lazy dog. "
) * 8
"""What the batches follow: ordinary text and code (the cost hardly depends on which tokens)."""
CONTEXT_TOKENS = 128
ROUNDS = 5
BUDGET_S = 6.0
"""Rounds stop once this much time is spent (at least two rounds run): a large model on a CPU measures less
precisely rather than keeping its first load waiting."""


def probe_sizes(n_max_batch: int) -> tuple[int, ...]:
    """Batch sizes to time: 1 to 3 (whether short drafts pay at all), then doubling, and the largest; the rest are
    interpolated (past a few tokens a batch's cost grows about linearly)."""
    top = max(2, n_max_batch)
    sizes = {1, 2, 3, top}
    m = 5
    while m < top:
        sizes.add(m)
        m = 2 * m - 1
    return tuple(sorted(s for s in sizes if s <= top))


def costs_from_times(times: Mapping[int, Sequence[float]], n_max_batch: int) -> tuple[float, ...]:
    """The cost table from timings per batch size, relative to size 1, interpolated linearly between the sizes
    timed and never decreasing with size (a longer batch never costs less: a dip is noise). Each size counts
    its fastest round: other programs only ever add time, so the minimum is the machine's own cost."""
    best = {m: min(ts) for m, ts in times.items() if ts}
    if best.get(1, 0.0) <= 0:
        raise ValueError("no plain step was timed")
    step = best[1]
    known = sorted(best)
    out: list[float] = []
    for m in range(1, max(1, n_max_batch) + 1):
        lo = max(k for k in known if k <= m) if m >= known[0] else known[0]
        hi = min((k for k in known if k >= m), default=known[-1])
        value = best[lo] if hi == lo else best[lo] + (best[hi] - best[lo]) * (m - lo) / (hi - lo)
        out.append(round(max(value / step, out[-1] if out else 1.0), 4))
    out[0] = 1.0
    return tuple(out)


def measured_quietly(others_busy: float, threads: int, n_cpus: int) -> bool:
    """Whether ``threads`` pinned threads had their cores while the other programs used ``others_busy`` cores of
    ``n_cpus``: the load would have left them every one (the engine's own rule, ``threads_for_load``)."""
    return threads_for_load(threads, threads, n_cpus, others_busy) == (threads, threads)


def measure_batch_costs(engine: TimesBatches, n_max_batch: int) -> MeasuredCosts:
    """Time a plain step and verification batches of up to ``n_max_batch`` tokens on ``engine`` (its cache is
    empty afterwards), and return the cost table with how busy the other programs kept the CPU meanwhile (the
    CPU's counters read before and after)."""
    tokens = engine.tokenize(CONTEXT_TEXT, add_special=True)
    context = tokens[: min(CONTEXT_TOKENS, max(1, engine.n_ctx - n_max_batch - 2))]
    before = sample_cpu()
    times = engine.time_batches(context, probe_sizes(n_max_batch), ROUNDS, BUDGET_S)
    others = others_busy_cores(before, sample_cpu())
    done = min(len(ts) for ts in times.values())
    threads = engine.threads
    return MeasuredCosts(
        costs=costs_from_times(times, n_max_batch),
        step_ms=round(min(times[1]) * 1000, 3),
        rounds=done,
        others_busy=round(others, 2),
        quiet=measured_quietly(others, threads.threads, threads.n_cpus),
    )
