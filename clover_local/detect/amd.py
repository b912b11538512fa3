"""AMD GPUs: the amdgpu driver's sysfs files (``mem_info_vram_total`` / ``mem_info_vram_used``), and the
``amdsmi`` Python package when it is importable and sysfs gave nothing (containers without /sys/class/drm).

An APU (Ryzen with Radeon graphics) has only a small VRAM carve-out and uses system RAM for the rest; a carve-out
under :data:`MIN_DEDICATED_VRAM_BYTES` is not counted as VRAM. Large carve-outs (e.g. Strix Halo set to 96 GB in
the firmware) are real dedicated memory for llama.cpp and are counted.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

from clover_local.detect.drm import DrmCard, drm_cards
from clover_local.detect.machine import Gpu, ProbeResult
from clover_local.detect.units import GIB, format_bytes

AMD_VENDOR_ID = "0x1002"
MIN_DEDICATED_VRAM_BYTES = 2 * GIB
"""Below this, VRAM is an integrated GPU's carve-out from system RAM, not memory to plan layers into."""


def probe_amd_sysfs(sysfs_root: Path) -> tuple[list[Gpu], ProbeResult]:
    """AMD GPUs with dedicated VRAM under ``sysfs_root`` (normally ``/sys``), each with total and free."""
    cards = drm_cards(sysfs_root, AMD_VENDOR_ID)
    if not cards:
        return [], ProbeResult("amd", False, f"no AMD GPU under {sysfs_root / 'class/drm'}")
    gpus: list[Gpu] = []
    notes: list[str] = []
    for card in cards:
        total = card.read_int("mem_info_vram_total")
        used = card.read_int("mem_info_vram_used")
        name = _name(card)
        if total is None:
            notes.append(f"{card.name} {name}: no mem_info_vram_total (amdgpu driver not bound?)")
        elif total < MIN_DEDICATED_VRAM_BYTES:
            notes.append(
                f"{card.name} {name}: integrated GPU with a {format_bytes(total)} carve-out that shares "
                "system RAM; not counted as VRAM"
            )
        else:
            free = total - min(used or 0, total)
            gpus.append(Gpu(len(gpus), "amd", name, total, free, source="sysfs"))
            notes.append(f"{card.name} {name}: {format_bytes(free)} free / {format_bytes(total)}")
    return gpus, ProbeResult("amd", bool(gpus), "; ".join(notes))


def load_amdsmi() -> ModuleType | None:
    """The ``amdsmi`` module (ROCm), or None when it is not installed."""
    try:
        import amdsmi
    except Exception:  # ImportError, or the package present without its native library
        return None
    module: ModuleType = amdsmi
    return module


def probe_amdsmi(amdsmi: ModuleType | Any | None) -> tuple[list[Gpu], ProbeResult]:
    """AMD GPUs through amdsmi: ``amdsmi_get_gpu_vram_usage`` reports MB totals and use per GPU."""
    if amdsmi is None:
        return [], ProbeResult("amdsmi", False, "amdsmi is not installed (optional; sysfs is used instead)")
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:
        return [], ProbeResult("amdsmi", False, f"amdsmi could not start (no amdgpu driver?): {exc}")
    gpus: list[Gpu] = []
    try:
        for handle in amdsmi.amdsmi_get_processor_handles():
            usage = amdsmi.amdsmi_get_gpu_vram_usage(handle)
            total = int(usage["vram_total"]) * 1024**2
            used = int(usage["vram_used"]) * 1024**2
            if total < MIN_DEDICATED_VRAM_BYTES:
                continue
            name = str(amdsmi.amdsmi_get_gpu_asic_info(handle).get("market_name") or "AMD GPU")
            gpus.append(Gpu(len(gpus), "amd", name, total, total - min(used, total), source="amdsmi"))
    finally:
        amdsmi.amdsmi_shut_down()
    found = "; ".join(
        f"{g.name} {format_bytes(g.free_bytes)} free / {format_bytes(g.total_bytes)}" for g in gpus
    )
    return gpus, ProbeResult("amdsmi", bool(gpus), found or "amdsmi reports no GPU with dedicated VRAM")


def _name(card: DrmCard) -> str:
    return card.read("product_name") or f"AMD Radeon GPU (PCI {card.pci_id})"
