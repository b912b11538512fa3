"""The memory picture: one bar per GPU and one for RAM, split into weights, KV cache, state, prompt cache,
buffers, margin and free (the same figures and verdict words as ``plan``'s memory table)."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.widget import Widget

from clover_local.detect.units import gigabytes
from clover_local.plan.render import device_verdict
from clover_local.plan.types import DeviceMemory

SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("weights", "█", "weights"),
    ("kv", "▓", "KV cache"),
    ("state", "▒", "state"),
    ("cache", "▞", "prompt cache"),
    ("buffers", "▚", "buffers, runtime"),
    ("margin", "╳", "margin"),
    ("free", "░", "free"),
)
"""(kind, glyph, label): glyphs differ too, so the picture reads without colour."""


def memory_parts(device: DeviceMemory) -> dict[str, int]:
    """Bytes per kind of the bar (:data:`SEGMENTS`), ``free`` included: the figures of ``plan``'s memory table."""
    parts = {
        "weights": device.weights_bytes,
        "kv": device.kv_cache_bytes,
        # checkpoints are saved copies of the recurrent state (and sliding-window cells)
        "state": device.recurrent_state_bytes + device.checkpoint_bytes,
        "cache": device.prompt_cache_bytes,  # llama-server's --cache-ram: earlier prompts' states
        "buffers": device.compute_bytes + device.runtime_bytes,  # llama.cpp's and the GPU runtime's own
        "margin": device.margin_bytes,
    }
    parts["free"] = max(device.capacity_bytes - sum(parts.values()), 0)
    return parts


def memory_segments(device: DeviceMemory, width: int) -> list[tuple[str, int]]:
    """Cells per kind for a bar ``width`` cells wide. Over capacity, the bar scales to what is used."""
    parts = memory_parts(device)
    used = sum(n for kind, n in parts.items() if kind != "free")
    scale = max(device.capacity_bytes, used, 1)
    cells = [(kind, round(width * n / scale)) for kind, n in parts.items()]
    # Give rounding leftovers to (or take them from) the largest segment, so the bar is exactly `width`.
    diff = width - sum(c for _, c in cells)
    if diff and cells:
        i = max(range(len(cells)), key=lambda k: cells[k][1])
        cells[i] = (cells[i][0], max(cells[i][1] + diff, 0))
    return [(k, c) for k, c in cells if c > 0]


def memory_head(device: DeviceMemory, label: str) -> str:
    """The line above a bar: what is used of what is available, and the device's verdict as ``plan`` says it."""
    head = f"{label}: {gigabytes(device.used_bytes)} of {gigabytes(device.capacity_bytes)}"
    return head + ("" if device.fits else f"  {device_verdict(device)}")


class MemoryView(Widget):
    """One device's bar and its numbers. Colours come from the stylesheet (component classes)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"memory--{kind}" for kind, _, _ in SEGMENTS}

    DEFAULT_CSS = """
    MemoryView { height: 2; }
    MemoryView > .memory--weights { color: $primary; }
    MemoryView > .memory--kv { color: $secondary; }
    MemoryView > .memory--state { color: $accent; }
    MemoryView > .memory--cache { color: $success; }
    MemoryView > .memory--buffers { color: $warning; }
    MemoryView > .memory--margin { color: $text-muted; }
    MemoryView > .memory--free { color: $text-muted; }
    """

    def __init__(self, device: DeviceMemory, *, label: str = "") -> None:
        super().__init__()
        self.device = device
        self.label = label or device.name

    def render(self) -> Text:
        d = self.device
        head = memory_head(d, self.label)
        width = max(self.size.width - 2, 10)
        bar = Text()
        glyphs = {kind: glyph for kind, glyph, _ in SEGMENTS}
        for kind, cells in memory_segments(d, width):
            bar.append(glyphs[kind] * cells, style=self.get_component_rich_style(f"memory--{kind}"))
        return Text.assemble(head, "\n", bar)


def legend() -> str:
    return "  ".join(f"{glyph} {label}" for _, glyph, label in SEGMENTS)
