"""Recorded probe outputs for the detection tests: an NVML stand-in, sysfs trees, macOS sysctl values."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from clover_local.detect import ProbeInputs

DATA = Path(__file__).parent / "data" / "detect"


def recorded(name: str) -> Any:
    return json.loads((DATA / name).read_text())


class RecordedNvml:
    """Answers NVML calls from recorded per-device values; unsupported queries raise the real NVMLError."""

    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM

    def __init__(self, devices: list[dict[str, Any]], init_error: int | None = None) -> None:
        self.devices = devices
        self.init_error = init_error
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self.devices[handle]["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> SimpleNamespace:
        d = self.devices[handle]
        return SimpleNamespace(total=d["total"], free=d["free"], used=d["used"])

    def nvmlDeviceGetMemoryBusWidth(self, handle: int) -> int:
        return self._supported(handle, "bus_width")

    def nvmlDeviceGetMaxClockInfo(self, handle: int, clock_type: int) -> int:
        assert clock_type == pynvml.NVML_CLOCK_MEM
        return self._supported(handle, "max_mem_clock_mhz")

    def _supported(self, handle: int, key: str) -> int:
        if key not in self.devices[handle]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.devices[handle][key]


def write_sysfs(root: Path, tree_name: str) -> Path:
    """Write one recorded sysfs tree (``sysfs_trees.json``) under ``root``; returns ``root``."""
    for relative, content in recorded("sysfs_trees.json")[tree_name].items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    return root


def no_gpu_inputs(tmp_path: Path) -> ProbeInputs:
    """A Linux machine with an empty sysfs, no NVML and no amdsmi; the real CPU/RAM/llama_cpp probes."""
    empty = tmp_path / "empty-sys"
    empty.mkdir(exist_ok=True)
    return ProbeInputs(
        system="linux",
        arch="x86_64",
        sysfs_root=empty,
        load_nvml=lambda: None,
        load_amdsmi=lambda: None,
    )


def mac_inputs(tmp_path: Path, machine_name: str) -> ProbeInputs:
    """An Apple Silicon Mac answering sysctl from ``sysctl_macos.json``."""
    values: dict[str, str] = recorded("sysctl_macos.json")[machine_name]
    return replace(no_gpu_inputs(tmp_path), system="darwin", arch="arm64", run_sysctl=values.get)
