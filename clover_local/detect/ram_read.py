"""How fast this machine's CPU reads RAM: measured once (a fraction of a second), kept per machine, and measured
again when the machine changes. The planner predicts CPU decoding from it (``plan.speed``): generating a token
reads every active weight once, so a machine that reads RAM twice as fast decodes about twice as fast. Before
this, the read rate was a constant (7 GB/s a thread), and the prediction was 0.6x of what this project's VM
measured (issue 48).

The probe streams through a buffer far larger than any CPU cache (:data:`BUFFER_BYTES`) with numpy's SIMD
``max``, once on one thread and once on every physical core at the same time (numpy lets go of the GIL inside
the reduction), the best of :data:`PASSES` passes each (another VM on the same host takes some of the memory's bandwidth now
and then). A figure measured while other programs kept the CPU busy says
little of the machine: it is used for that plan, said to be so, and not kept (measured again next time)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from clover_local.user_files import write_atomically

BUFFER_BYTES = 192 * 1024 * 1024
"""Larger than the last-level cache one core sees on desktop and server CPUs (up to 96 MiB a CCD)."""
PASSES = 5
QUIET_CORES = 0.25
"""Other programs may use this much CPU while the probe runs and the figure is still kept."""
KEEP_FILE = "ram-read.json"

Reader = Callable[[Any], object]


@dataclass(frozen=True)
class RamRead:
    """Bytes per second the CPU reads from RAM, as measured on this machine."""

    one_thread: float
    all_threads: float
    threads: int
    """How many threads read at once for :attr:`all_threads` (every physical core)."""
    machine: str
    """What it was measured on (:func:`machine_key`): another machine measures again."""
    date: str
    others_busy: float = 0.0
    """Cores other programs used while it was measured."""

    @property
    def quiet(self) -> bool:
        return self.others_busy <= QUIET_CORES

    def rate(self, threads: int) -> float:
        """Bytes per second ``threads`` decode threads read: each as fast as one alone, together at most what
        every core read at once (the memory's own limit)."""
        return min(max(1, threads) * self.one_thread, self.all_threads)


def machine_key(cpu_model: str, logical_cores: int, total_bytes: int) -> str:
    """What a measurement belongs to: the CPU, its cores and the RAM (a new DIMM or another VM size changes it)."""
    return f"{cpu_model} | {logical_cores} cores | {round(total_bytes / 2**30)} GiB"


def _numpy_buffer() -> Any:
    import numpy as np

    return np.ones(BUFFER_BYTES // 4, dtype=np.float32)


def _numpy_max(view: Any) -> object:
    return view.max()


def measure_ram_read(
    threads: int,
    machine: str,
    *,
    clock: Callable[[], float] = time.perf_counter,
    make_buffer: Callable[[], Any] = _numpy_buffer,
    read: Reader = _numpy_max,
    others_busy: Callable[[], float] | None = None,
) -> RamRead:
    """Read a large buffer on one thread, then on ``threads`` threads at once; bytes per second of each (the
    best of :data:`PASSES`). ``others_busy`` says, after the reads, how many cores other programs used meanwhile
    (``detect.cpu_load``)."""
    threads = max(1, threads)
    buffer = make_buffer()
    size = int(buffer.nbytes)
    one = _best_rate(lambda: read(buffer), size, clock)
    parts = [buffer[i * len(buffer) // threads : (i + 1) * len(buffer) // threads] for i in range(threads)]
    with ThreadPoolExecutor(threads) as pool:
        every = _best_rate(lambda: list(pool.map(read, parts)), size, clock)
    busy = others_busy() if others_busy is not None else 0.0
    return RamRead(one, max(every, one), threads, machine, time.strftime("%Y-%m-%d"), round(busy, 2))


def _best_rate(run: Callable[[], object], size: int, clock: Callable[[], float]) -> float:
    best = float("inf")
    for _ in range(PASSES):
        start = clock()
        run()
        best = min(best, clock() - start)
    return size / best if best > 0 else 0.0


def kept_ram_read(folder: Path, machine: str) -> RamRead | None:
    """The measurement kept for this machine, if any (a damaged file, or another machine's, gives none)."""
    try:
        raw = json.loads((folder / KEEP_FILE).read_text(encoding="utf-8"))
        kept = RamRead(**raw)
    except (OSError, ValueError, TypeError):
        return None
    return kept if kept.machine == machine and kept.one_thread > 0 and kept.all_threads > 0 else None


def keep_ram_read(folder: Path, measured: RamRead) -> None:
    """Keep a quiet measurement for the next plans on this machine (written atomically)."""
    write_atomically(folder / KEEP_FILE, (json.dumps(asdict(measured)) + "\n").encode())


def ram_read_here(
    folder: Path, machine: str, threads: int, *, measure: Callable[[int, str], RamRead] | None = None
) -> RamRead:
    """This machine's read rate: the one kept today, else measured now. A quiet measurement is kept when it is
    the best yet for this machine: another program's memory traffic (a VM beside this one on the host, a process
    unmapping a large model) can only lower a read rate, so one low reading never stays as the machine's figure
    beyond the day it was taken."""
    kept = kept_ram_read(folder, machine)
    if kept is not None and kept.date == time.strftime("%Y-%m-%d"):
        return kept
    measured = (measure or _measure_here)(threads, machine)
    if not measured.quiet:
        return kept if kept is not None else measured
    best = kept if kept is not None and kept.all_threads > measured.all_threads else measured
    best = replace(best, date=measured.date)
    with contextlib.suppress(OSError):  # a read-only data folder: measured again next time
        keep_ram_read(folder, best)
    return best


def _measure_here(threads: int, machine: str) -> RamRead:
    from clover_local.detect.cpu_load import others_busy_cores, sample_cpu

    before = sample_cpu()
    return measure_ram_read(threads, machine, others_busy=lambda: others_busy_cores(before, sample_cpu()))
