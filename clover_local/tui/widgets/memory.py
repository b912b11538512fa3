"""The memory picture: one bar per GPU and one for RAM, split into weights, KV cache, state, buffers, free."""

from __future__ import annotations

from typing import ClassVar

from rich.text import Text
from textual.widget import Widget

from clover_local.detect.units import gigabytes
from clover_local.plan.types import DeviceMemory

SEGMENTS: tuple[tuple[str, str, str], ...] = (
    ("weights", "█", "weights"),
    ("kv", "▓", "KV cache"),
    ("state", "▒", "state"),
    ("buffers", "▚", "buffers"),
    ("margin", "╳", "margin"),
    ("free", "░", "free"),
)
"""(kind, glyph, label): glyphs differ too, so the picture reads without colour."""


def memory_segments(device: DeviceMemory, width: int) -> list[tuple[str, int]]:
    """Cells per kind for a bar ``width`` cells wide. Over capacity, the bar scales to what is used."""
    parts = {
        "weights": device.weights_bytes,
        "kv": device.kv_cache_bytes,
        # checkpoints and the prompt cache are saved copies of states
        "state": device.recurrent_state_bytes + device.checkpoint_bytes + device.prompt_cache_bytes,
        "buffers": device.compute_bytes,
        "margin": device.margin_bytes,
    }
    used = sum(parts.values())
    parts["free"] = max(device.capacity_bytes - used, 0)
    scale = max(device.capacity_bytes, used, 1)
    cells = [(kind, round(width * n / scale)) for kind, n in parts.items()]
    # Give rounding leftovers to (or take them from) the largest segment, so the bar is exactly `width`.
    diff = width - sum(c for _, c in cells)
    if diff and cells:
        i = max(range(len(cells)), key=lambda k: cells[k][1])
        cells[i] = (cells[i][0], max(cells[i][1] + diff, 0))
    return [(k, c) for k, c in cells if c > 0]


class MemoryView(Widget):
    """One device's bar and its numbers. Colours come from the stylesheet (component classes)."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {f"memory--{kind}" for kind, _, _ in SEGMENTS}

    DEFAULT_CSS = """
    MemoryView { height: 2; }
    MemoryView > .memory--weights { color: $primary; }
    MemoryView > .memory--kv { color: $secondary; }
    MemoryView > .memory--state { color: $accent; }
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
        head = f"{self.label}: {gigabytes(d.used_bytes)} of {gigabytes(d.capacity_bytes)}"
        head += "" if d.fits else "  DOES NOT FIT"
        width = max(self.size.width - 2, 10)
        bar = Text()
        glyphs = {kind: glyph for kind, glyph, _ in SEGMENTS}
        for kind, cells in memory_segments(d, width):
            bar.append(glyphs[kind] * cells, style=self.get_component_rich_style(f"memory--{kind}"))
        return Text.assemble(head, "\n", bar)


def legend() -> str:
    return "  ".join(f"{glyph} {label}" for _, glyph, label in SEGMENTS)
