"""Real GPU memory, as NVML sees it per process, and a way to make a big card look like a small one.

``PeakSampler`` polls NVML for the memory a process holds on each GPU (what ``nvidia-smi`` lists per process,
CUDA context included) and keeps the peak. ``hold_gpu_memory`` starts a helper process that allocates memory
until only the wanted amount is free, so a plan for "a 12 GiB card" can be loaded on an 80 GiB one.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

from clover_local.errors import UsageError


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        raise UsageError("nvidia-ml-py (pynvml) is not installed: GPU memory cannot be read.") from None
    pynvml.nvmlInit()
    return pynvml


def nvml_or_none() -> Any | None:
    """NVML, initialised, or None where there is no NVIDIA driver (or no nvidia-ml-py)."""
    try:
        return _nvml()
    except Exception:  # UsageError without pynvml, NVMLError without a driver
        return None


def process_gpu_bytes_by_device(nvml: Any, pid: int) -> dict[int, int]:
    """Bytes ``pid`` holds on each GPU right now (GPU index -> bytes; GPUs it holds nothing on left out)."""
    out: dict[int, int] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == pid and proc.usedGpuMemory:
                out[i] = out.get(i, 0) + int(proc.usedGpuMemory)
    return out


def process_gpu_bytes(nvml: Any, pid: int) -> int:
    """Bytes ``pid`` holds on all GPUs right now (0 when NVML does not list it)."""
    return sum(process_gpu_bytes_by_device(nvml, pid).values())


class PeakSampler:
    """Polls one process's GPU memory every ``interval_s`` until stopped; ``peak`` is the largest seen."""

    def __init__(self, pid: int, interval_s: float = 0.05) -> None:
        self.pid = pid
        self.peak = 0
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        nvml = _nvml()
        try:
            while not self._stop.is_set():
                self.peak = max(self.peak, process_gpu_bytes(nvml, self.pid))
                self._stop.wait(self._interval)
        finally:
            nvml.nvmlShutdown()

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


_HOLDER = r"""
import sys
import torch
want_free = int(sys.argv[1])
free, _ = torch.cuda.mem_get_info(0)
held = []
while free > want_free + (1 << 20):
    step = min(free - want_free, 1 << 30)
    held.append(torch.empty(step, dtype=torch.uint8, device="cuda:0"))
    free, _ = torch.cuda.mem_get_info(0)
print(f"held {sum(t.numel() for t in held)} free {free}", flush=True)
sys.stdin.read()
"""


class GpuMemoryHold:
    """A helper process holding GPU 0's memory so that only ``free_bytes`` stay free (needs PyTorch with CUDA,
    as on most GPU machines). Released when the context exits."""

    def __init__(self, free_bytes: int) -> None:
        self.free_bytes = free_bytes
        self._proc: subprocess.Popen[str] | None = None
        self.report = ""

    def __enter__(self) -> GpuMemoryHold:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(self.free_bytes)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._proc.stdout is not None
        self.report = self._proc.stdout.readline().strip()
        if not self.report.startswith("held"):
            self.__exit__()
            raise UsageError(
                "Could not hold GPU memory to emulate a smaller card (needs PyTorch with CUDA).",
                "Run without --free, or install torch.",
            )
        time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            if self._proc.stdin:
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
            self._proc = None
