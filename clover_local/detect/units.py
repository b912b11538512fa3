"""Byte sizes for people: parse ``32G`` / ``1.5T`` / ``1024`` and print ``12.0 GiB``. Units are binary (GiB)."""

from __future__ import annotations

import re

GIB = 1024**3
_UNITS = {"": 1, "B": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:I?B)?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int | None:
    """``32G``, ``32GiB``, ``32GB``, ``1.5T``, ``512M``, ``4096K`` or plain bytes -> bytes; None if not a size.

    Every unit is binary (``G`` = 2**30 bytes), as memory is sold and reported by drivers.
    """
    m = _SIZE_RE.match(text)
    if not m:
        return None
    number, unit = m.groups()
    if unit == "" and "." in number:
        return None  # fractional bytes make no sense
    return int(float(number) * _UNITS[unit.upper()])


def gigabytes(n: int) -> str:
    """Binary gigabytes whatever the size (``0.3 GiB``), as the planner's reasons and ``--simulate`` sizes use them."""
    return f"{n / (1 << 30):.1f} GiB"


_BANDWIDTH_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([GT])B/s\s*$", re.IGNORECASE)


def parse_bandwidth(text: str) -> float | None:
    """``936GB/s`` or ``4.8TB/s`` -> bytes per second (decimal units, as bandwidth is quoted); None otherwise."""
    m = _BANDWIDTH_RE.match(text)
    if not m:
        return None
    value = float(m.group(1)) * (1e12 if m.group(2).upper() == "T" else 1e9)
    return value if value > 0 else None


def format_bytes(n: int | float) -> str:
    """``12.0 GiB``, ``512.0 MiB``: one decimal, binary units."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.0f} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
