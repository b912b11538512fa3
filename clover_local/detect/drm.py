"""Linux DRM devices from sysfs (``/sys/class/drm/cardN/device/``), shared by the AMD and Intel probes.

The root is injectable: tests write a sysfs-shaped tree into a temporary folder.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

SYSFS_ROOT = Path("/sys")
_CARD_RE = re.compile(r"^card(\d+)$")


@dataclass(frozen=True)
class DrmCard:
    """One ``cardN`` and the sysfs folder of its PCI device."""

    name: str
    device: Path
    vendor_id: str
    """``0x1002`` (AMD), ``0x8086`` (Intel), ``0x10de`` (NVIDIA)..."""
    device_id: str

    def read(self, relative: str) -> str | None:
        """A sysfs attribute of the device, stripped; None when absent or unreadable."""
        try:
            return (self.device / relative).read_text(errors="replace").strip()
        except OSError:
            return None

    def read_int(self, relative: str) -> int | None:
        text = self.read(relative)
        return int(text) if text and text.isdigit() else None

    @property
    def pci_id(self) -> str:
        return f"{self.vendor_id.removeprefix('0x')}:{self.device_id.removeprefix('0x')}"


def drm_cards(sysfs_root: Path, vendor_id: str) -> list[DrmCard]:
    """Cards of one PCI vendor, in card-number order (connectors like ``card0-DP-1`` are skipped)."""
    drm = sysfs_root / "class" / "drm"
    if not drm.is_dir():
        return []
    found: list[tuple[int, DrmCard]] = []
    for entry in drm.iterdir():
        match = _CARD_RE.match(entry.name)
        device = entry / "device"
        if not match or not (device / "vendor").is_file():
            continue
        vendor = (device / "vendor").read_text().strip().lower()
        if vendor != vendor_id:
            continue
        device_file = device / "device"
        device_id = device_file.read_text().strip().lower() if device_file.is_file() else "0x0000"
        found.append((int(match.group(1)), DrmCard(entry.name, device, vendor, device_id)))
    return [card for _, card in sorted(found, key=lambda item: item[0])]
