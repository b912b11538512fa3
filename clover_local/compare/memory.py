"""Peak memory of the process holding a contender's model while it answers: RAM (resident set) and, where NVML
sees NVIDIA GPUs, the memory it holds on each GPU. For the embedded engine that process is this one, so what
it held before the model loaded is taken off."""

from __future__ import annotations

import threading
from typing import Any

INTERVAL_S = 0.1


class MemorySampler:
    """Polls one process's memory every :data:`INTERVAL_S` until stopped, keeping the peaks."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._baseline = 0
        self._peak_rss = 0
        self.peak_vram_bytes: dict[int, int] = {}

    @property
    def peak_ram_bytes(self) -> int:
        return max(0, self._peak_rss - self._baseline)

    def baseline(self) -> None:
        """Take this process's resident memory now as what was held before the model loaded."""
        import os

        import psutil

        self._baseline = int(psutil.Process(os.getpid()).memory_info().rss)

    def start(self, pid: int, *, in_process: bool) -> None:
        if not in_process:
            self._baseline = 0
        self._thread = threading.Thread(target=self._run, args=(pid,), daemon=True, name="compare-memory")
        self._thread.start()

    def _run(self, pid: int) -> None:
        import psutil

        from clover_local.measure.gpu_memory import nvml_or_none, process_gpu_bytes_by_device

        nvml: Any = nvml_or_none()
        try:
            process = psutil.Process(pid)
            while True:
                self._sample(process, nvml, process_gpu_bytes_by_device)
                if self._stop.wait(self._interval):
                    break
        except psutil.Error:
            pass  # the process has gone: the peaks so far stand
        finally:
            if nvml is not None:
                nvml.nvmlShutdown()

    def _sample(self, process: Any, nvml: Any, by_device: Any) -> None:
        self._peak_rss = max(self._peak_rss, int(process.memory_info().rss))
        if nvml is None:
            return
        try:
            for index, used in by_device(nvml, process.pid).items():
                self.peak_vram_bytes[index] = max(self.peak_vram_bytes.get(index, 0), used)
        except Exception:  # NVML errors (a GPU lost mid-run): RAM is still measured
            return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
