"""How many threads llama.cpp uses for a batch right now: every core the plan gives batches while the rest of
the machine leaves them free, the decode threads while other programs keep the CPU busy.

A batch (prompt processing, verifying a draft) is compute-bound, so it runs faster on every core: on a 2-core
machine a verification batch on two threads costs about 0.75 of what it costs on one. But llama.cpp's threads
wait for each other at every operation by spinning (``ggml_barrier``), so a batch whose threads fill every core
stalls as soon as another program wants one: one thread loses its core for a scheduler slice at each of a few
hundred operations, and a batch that takes 20 ms idle takes a second. So before each batch the engine looks at
how much CPU time the *other* programs used since it last looked (system-wide busy time less this process's
own, from psutil) and gives the batch all its threads only when that leaves them free.

This never changes the text: llama.cpp's CPU kernels compute every output element in one thread, whatever the
thread count (``tests/test_batch_threads.py`` checks that greedy replies are the same on one and on two batch
threads). Only speed depends on the machine's load; what the drafter decides still never does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

CHECK_EVERY_S = 0.25
"""Look at the other programs' CPU use at most this often (``/proc/stat`` counts in 10 ms ticks)."""
SLACK_CORES = 0.25
"""Other programs may use this much of a core and still leave the batch threads their cores (a shell, a
terminal redrawing)."""


@dataclass(frozen=True)
class CpuSample:
    at: float
    """Monotonic seconds."""
    busy_s: float
    """CPU seconds every program used, on all cores."""
    mine_s: float
    """CPU seconds this process used (all its threads)."""


def sample_cpu() -> CpuSample:
    total = psutil.cpu_times()
    busy = sum(total) - total.idle - getattr(total, "iowait", 0.0) - getattr(total, "steal", 0.0)
    mine = psutil.Process().cpu_times()
    return CpuSample(time.monotonic(), busy, mine.user + mine.system)


def others_busy_cores(before: CpuSample, after: CpuSample) -> float:
    """How many cores' worth of CPU other programs used between two samples."""
    wall = after.at - before.at
    if wall <= 0:
        return 0.0
    others = (after.busy_s - before.busy_s) - (after.mine_s - before.mine_s)
    return max(0.0, others / wall)


def batch_threads_for(threads: int, threads_batch: int, n_cpus: int, others: float) -> int:
    """All ``threads_batch`` when the other programs leave that many cores free, else the decode ``threads``."""
    if threads_batch <= threads:
        return threads_batch
    return threads_batch if n_cpus - others >= threads_batch - SLACK_CORES else threads


class BatchThreads:
    """Sets llama.cpp's batch threads before each batch (``llama_set_n_threads``), from the other programs'
    recent CPU use; a no-op when the plan gives batches no more threads than decoding."""

    def __init__(
        self,
        apply: Callable[[int, int], None],
        threads: int,
        threads_batch: int,
        *,
        sample: Callable[[], CpuSample] = sample_cpu,
        clock: Callable[[], float] = time.monotonic,
        n_cpus: int | None = None,
    ) -> None:
        self._apply = apply
        self.threads = threads
        self.threads_batch = threads_batch
        self._sample = sample
        self._clock = clock
        self._n_cpus = n_cpus or psutil.cpu_count(logical=True) or 1
        self._pinned = False
        self._last = sample() if threads_batch > threads else None
        self.current = threads_batch
        self.switches = 0
        """How often the batch threads changed (for tests and benchmarks)."""

    def before_batch(self) -> int:
        """The batch threads for the next batch (set in llama.cpp when they change)."""
        if self._last is None or self._pinned or self._clock() - self._last.at < CHECK_EVERY_S:
            return self.current
        now = self._sample()
        wanted = batch_threads_for(
            self.threads, self.threads_batch, self._n_cpus, others_busy_cores(self._last, now)
        )
        self._last = now
        self._set(wanted)
        return self.current

    @contextmanager
    def pinned(self, threads_batch: int) -> Iterator[None]:
        """Exactly ``threads_batch`` batch threads inside the block, whatever the load (measuring costs)."""
        self._set(threads_batch)
        self._pinned = True
        try:
            yield
        finally:
            self._pinned = False
            if self._last is not None:
                self._last = self._sample()

    def _set(self, wanted: int) -> None:
        if wanted != self.current:
            self._apply(self.threads, wanted)
            self.current = wanted
            self.switches += 1
