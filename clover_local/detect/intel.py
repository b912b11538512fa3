"""Intel discrete GPUs (Arc, Data Center GPU) from sysfs; integrated Intel graphics is not VRAM.

Discrete cards expose their local memory: ``mem_info_vram_total`` / ``mem_info_vram_used`` where the driver
provides them, or the xe driver's ``tileN/physical_vram_size_bytes`` (total only: free is then reported equal to
total, and said so in the probe detail). An Intel GPU with neither is integrated graphics that shares system RAM.
"""

from __future__ import annotations

from pathlib import Path

from clover_local.detect.drm import DrmCard, drm_cards
from clover_local.detect.machine import Gpu, ProbeResult
from clover_local.detect.units import format_bytes

INTEL_VENDOR_ID = "0x8086"


def probe_intel_sysfs(sysfs_root: Path) -> tuple[list[Gpu], ProbeResult]:
    """Intel GPUs with local memory under ``sysfs_root``; integrated ones are listed in the detail only."""
    cards = drm_cards(sysfs_root, INTEL_VENDOR_ID)
    if not cards:
        return [], ProbeResult("intel", False, f"no Intel GPU under {sysfs_root / 'class/drm'}")
    gpus: list[Gpu] = []
    notes: list[str] = []
    for card in cards:
        name = card.read("product_name") or f"Intel GPU (PCI {card.pci_id})"
        total, used, how = _local_memory(card)
        if not total:
            notes.append(f"{card.name} {name}: integrated GPU sharing system RAM; not counted as VRAM")
            continue
        free = total - min(used or 0, total)
        gpus.append(Gpu(len(gpus), "intel", name, total, free, source="sysfs", note=how))
        notes.append(f"{card.name} {name}: {format_bytes(free)} free / {format_bytes(total)} ({how})")
    return gpus, ProbeResult("intel", bool(gpus), "; ".join(notes))


def _local_memory(card: DrmCard) -> tuple[int | None, int | None, str]:
    """(total, used, where from) of a discrete card's own memory; total None for integrated graphics."""
    total = card.read_int("mem_info_vram_total")
    if total:
        return total, card.read_int("mem_info_vram_used"), "mem_info_vram_total/used"
    tiles = sorted(card.device.glob("tile*/physical_vram_size_bytes"))
    sizes = [int(t.read_text().strip()) for t in tiles if t.read_text().strip().isdigit()]
    if sum(sizes) > 0:
        return (
            sum(sizes),
            None,
            "xe tile physical_vram_size_bytes; used memory not exposed, free assumed = total",
        )
    return None, None, ""
