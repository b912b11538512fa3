"""How busy the *other* programs keep the CPU: system-wide busy time less this process's own, between two samples
(psutil; ``/proc/stat`` counts in 10 ms ticks). The one measurement behind every thread count that follows the
load: the embedded engine's between steps (``engine.batch_threads``), and llama-server's at launch, taken while
the machine is probed (``detect.probe``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import psutil


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
