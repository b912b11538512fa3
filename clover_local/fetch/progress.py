"""Progress of a download as plain values, for the CLI's status line and the TUI's progress bar.

:class:`ProgressTracker` turns byte counts into :class:`DownloadProgress` snapshots with a smoothed
speed and an ETA, and rate-limits how often the callback runs (a 38 GB download writes thousands of
chunks; the UI needs a few updates a second).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

Phase = Literal["waiting", "checking", "downloading", "verifying", "done"]
"""``waiting``: another process (clover-local or ``hf``) is downloading the same file and holds its lock;
``checking``: reading what is already on disk (resumed partials); ``downloading``: bytes arriving;
``verifying``: hashing against the Hub's sha256; ``done``: all files in place."""

SPEED_WINDOW_S = 5.0
"""Speed is measured over this many recent seconds: steady, yet quick to follow a changing link."""


@dataclass(frozen=True)
class DownloadProgress:
    """One snapshot of a download. Byte counts of the current phase: fetched bytes while
    ``downloading``, hashed bytes while ``checking`` or ``verifying``."""

    phase: Phase
    file: str
    """Path in the repo of the file being worked on."""
    file_index: int
    """0-based index of that file among ``file_count`` (shards of a split GGUF)."""
    file_count: int
    file_done: int
    file_total: int
    done: int
    """All files together; includes bytes already on disk from an earlier, interrupted run."""
    total: int
    speed_bps: float
    """Smoothed bytes per second over the last few seconds; 0.0 until measurable."""
    eta_s: float | None
    """Seconds left at the current speed; None when unknown."""

    @property
    def fraction(self) -> float:
        return self.done / self.total if self.total else 1.0


ProgressCallback = Callable[[DownloadProgress], None]


class ProgressTracker:
    """Accumulates byte counts for one phase and reports snapshots to a callback, at most every
    ``min_interval_s`` (phase changes and the end of a file are always reported)."""

    def __init__(
        self,
        callback: ProgressCallback | None,
        sizes: list[tuple[str, int]],
        *,
        min_interval_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._callback = callback
        self._sizes = sizes
        self._total = sum(size for _, size in sizes)
        self._min_interval = min_interval_s
        self._clock = clock
        self._phase: Phase = "checking"
        self._index = 0
        self._file_done = 0
        self._done_before = 0
        self._samples: deque[tuple[float, int]] = deque()
        self._last_emit = float("-inf")

    def start(self, phase: Phase, index: int, already: int = 0) -> None:
        """Begin ``phase`` on file ``index``, with ``already`` bytes of that file counted as done."""
        if phase != self._phase:
            self._samples.clear()
        self._phase = phase
        self._index = index
        self._done_before = sum(size for _, size in self._sizes[:index])
        self._file_done = already
        self._emit(force=True)

    def advance(self, n_bytes: int) -> None:
        self._file_done += n_bytes
        self._emit(force=False)

    def rewind(self, file_done: int) -> None:
        """The server ignored a resume request and the file starts again from ``file_done``."""
        self._file_done = file_done
        self._samples.clear()
        self._emit(force=True)

    def finish(self) -> None:
        self._phase = "done"
        self._index = max(len(self._sizes) - 1, 0)
        self._done_before = self._total - (self._sizes[-1][1] if self._sizes else 0)
        self._file_done = self._sizes[-1][1] if self._sizes else 0
        self._emit(force=True)

    def snapshot(self) -> DownloadProgress:
        name, size = self._sizes[self._index] if self._sizes else ("", 0)
        done = self._done_before + self._file_done
        speed = self._speed(done)
        left = self._total - done
        eta = left / speed if speed > 0 else (0.0 if left <= 0 else None)
        return DownloadProgress(
            phase=self._phase,
            file=name,
            file_index=self._index,
            file_count=len(self._sizes),
            file_done=self._file_done,
            file_total=size,
            done=done,
            total=self._total,
            speed_bps=speed,
            eta_s=eta,
        )

    def _speed(self, done: int) -> float:
        now = self._clock()
        self._samples.append((now, done))
        while len(self._samples) > 2 and now - self._samples[1][0] >= SPEED_WINDOW_S:
            self._samples.popleft()
        t0, d0 = self._samples[0]
        return (done - d0) / (now - t0) if now - t0 > 0.2 else 0.0

    def _emit(self, *, force: bool) -> None:
        now = self._clock()
        at_file_end = self._file_done >= (self._sizes[self._index][1] if self._sizes else 0)
        if self._callback is None or not (
            force or at_file_end or now - self._last_emit >= self._min_interval
        ):
            self._speed(self._done_before + self._file_done)
            return
        self._last_emit = now
        self._callback(self.snapshot())


def format_bytes(n: float) -> str:
    """``23.4 GB``-style sizes (decimal units, as the Hub and disk tools show them)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "--:--"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


def status_line(p: DownloadProgress) -> str:
    """One line for a terminal: phase, file, bytes, percent, speed, ETA."""
    shard = f" [{p.file_index + 1}/{p.file_count}]" if p.file_count > 1 else ""
    name = p.file.rsplit("/", 1)[-1]
    if p.phase == "waiting":
        return f"waiting     {name}{shard}: another download of this file is running; continuing when it ends"
    pct = 100.0 * p.fraction
    line = f"{p.phase:<11} {name}{shard}  {format_bytes(p.done)} / {format_bytes(p.total)} ({pct:4.1f}%)"
    if p.phase in ("downloading", "verifying", "checking") and p.speed_bps > 0:
        line += f"  {format_bytes(p.speed_bps)}/s  ETA {format_duration(p.eta_s)}"
    return line
