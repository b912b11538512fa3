"""System RAM (total and available, from psutil) and free disk where models are stored."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clover_local.detect.machine import Disk, Memory, ProbeResult
from clover_local.detect.units import format_bytes


def probe_memory(virtual_memory: Callable[[], Any]) -> tuple[Memory, ProbeResult]:
    """``virtual_memory`` is ``psutil.virtual_memory`` (anything with ``total`` and ``available``)."""
    vm = virtual_memory()
    memory = Memory(total_bytes=int(vm.total), available_bytes=int(vm.available))
    detail = f"{format_bytes(memory.total_bytes)} total, {format_bytes(memory.available_bytes)} available"
    return memory, ProbeResult("memory", True, detail)


def probe_disk(models_dir: Path) -> tuple[Disk, ProbeResult]:
    """Free space at ``models_dir``, or at its nearest existing parent when it does not exist yet."""
    where = nearest_existing(models_dir)
    usage = shutil.disk_usage(where)
    disk = Disk(path=str(where), total_bytes=usage.total, free_bytes=usage.free)
    note = "" if where == models_dir else f" (nearest existing parent of {models_dir})"
    detail = f"{format_bytes(usage.free)} free of {format_bytes(usage.total)} at {where}{note}"
    return disk, ProbeResult("disk", True, detail)


def nearest_existing(path: Path) -> Path:
    """``path`` itself when it exists, else its closest existing parent (the filesystem it will live on)."""
    path = path.expanduser().absolute()
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(path.anchor or "/")
