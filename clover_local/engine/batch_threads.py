"""How many threads llama.cpp uses for the next step (one token, or a batch: the prompt, a draft to verify):
every core the plan gives while the rest of the machine leaves them free, fewer while other programs keep the
CPU busy.

llama.cpp's threads wait for each other at every operation by spinning (``ggml_barrier``), so a step whose
threads fill every core stalls as soon as another program wants one: one thread loses its core for a scheduler
slice at each of a few hundred operations, and a batch that takes 20 ms idle takes a second. So before each step
the engine looks (at most every :data:`CHECK_EVERY_S`) at how much CPU time the *other* programs used since it
last looked (``detect.cpu_load``) and sets the threads ``plan.threads.threads_for_load`` leaves them
(``llama_set_n_threads``).

This never changes the text: llama.cpp's CPU kernels compute every output element in one thread, whatever the
thread count (``tests/test_batch_threads.py`` checks that greedy replies are the same on one and on two threads,
and when the threads change between steps). Only speed depends on the machine's load; what the drafter decides
still never does.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psutil

from clover_local.detect.cpu_load import CpuSample, others_busy_cores, sample_cpu
from clover_local.plan.threads import threads_for_load

CHECK_EVERY_S = 0.25
"""Look at the other programs' CPU use at most this often (``/proc/stat`` counts in 10 ms ticks)."""
STALE_AFTER_S = 1.0
"""A look longer ago than this began while the engine was idle (between requests): what other programs did then
(the client writing its request, a process exiting) says little about the next steps, so the guard keeps its
threads and decides on a fresh window (seen in the speculation benchmark: every request, after a llama-server had
run in between, dropped to one thread for its first quarter second and back, about 20 of a 128-token reply's
tokens at two thirds of the speed, some 6% of its time on 2 cores)."""


class LoadThreads:
    """Sets llama.cpp's decode and batch threads before each step (``llama_set_n_threads``), from the other
    programs' recent CPU use: the planned ``threads`` / ``threads_batch`` are the most."""

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
        self.n_cpus = n_cpus or psutil.cpu_count(logical=True) or 1
        self._pinned = False
        self._last = sample()
        self.current = (threads, threads_batch)
        """(decode, batch) threads set in llama.cpp now."""
        self.switches = 0
        """How often the threads changed (for tests and benchmarks)."""

    def before_step(self) -> tuple[int, int]:
        """The (decode, batch) threads for the next step (set in llama.cpp when they change)."""
        if self._pinned or self._clock() - self._last.at < CHECK_EVERY_S:
            return self.current
        now = self._sample()
        if now.at - self._last.at > STALE_AFTER_S:
            self._last = now  # decide on what the other programs do from now on
            return self.current
        wanted = threads_for_load(
            self.threads, self.threads_batch, self.n_cpus, others_busy_cores(self._last, now)
        )
        self._last = now
        self._set(wanted)
        return self.current

    @contextmanager
    def pinned(self, threads: int, threads_batch: int | None = None) -> Iterator[None]:
        """Exactly these threads inside the block (``threads_batch``: as many as ``threads`` unless given),
        whatever the load (measuring costs, tests)."""
        self._set((threads, threads if threads_batch is None else threads_batch))
        self._pinned = True
        try:
            yield
        finally:
            self._pinned = False
            self._last = self._sample()

    def _set(self, wanted: tuple[int, int]) -> None:
        if wanted != self.current:
            self._apply(*wanted)
            self.current = wanted
            self.switches += 1
