"""Accuracy against latency, one point per contender: up is right more often, left is faster. As text (the
terminal and the app's Compare screen) and as an SVG file beside the JSON report."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape
from pathlib import Path

from clover_local.compare.report import CompareReport
from clover_local.compare.stats import wilson

MARKS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@dataclass(frozen=True)
class Point:
    mark: str
    name: str
    latency_s: float
    accuracy: float
    low: float
    high: float


def points(report: CompareReport) -> list[Point]:
    """A point per contender with results: median latency, accuracy and its 95% interval."""
    out = []
    for index, c in enumerate(c for c in report.contenders if c.tasks):
        latency = c.times("latency_s")
        if latency is None or c.accuracy is None:
            continue
        lo, hi = wilson(c.passed, c.total)
        out.append(Point(MARKS[index % len(MARKS)], c.name, latency.median, c.accuracy, lo, hi))
    return out


def text_picture(report: CompareReport, width: int = 50, height: int = 11) -> str:
    """A text scatter plot: accuracy 0-100% up the side, median latency (seconds) along the bottom."""
    pts = points(report)
    if not pts:
        return "(no results to draw yet)"
    top = max(p.latency_s for p in pts) * 1.1 or 1.0
    grid = [[" "] * width for _ in range(height)]
    for p in pts:
        x = min(width - 1, round(p.latency_s / top * (width - 1)))
        y = height - 1 - min(height - 1, round(p.accuracy * (height - 1)))
        grid[y][x] = p.mark if grid[y][x] == " " else "*"
    lines = []
    for row, cells in enumerate(grid):
        label = f"{round(100 * (height - 1 - row) / (height - 1)):>3}% |" if row % 5 == 0 else "     |"
        lines.append(label + "".join(cells).rstrip())
    lines.append("     +" + "-" * width)
    lines.append(f"      0 s{'median latency per task':^{width - 14}}{top:.2f} s")
    lines.append("  accuracy")
    lines += [f"  {p.mark}  {p.name}: {p.accuracy:.0%}, {p.latency_s:.2f} s" for p in pts]
    return "\n".join(lines)


def svg_picture(report: CompareReport) -> str:
    """The same picture as an SVG document (a 95% interval bar through each point)."""
    pts = points(report)
    w, h, left, bottom, pad = 640, 400, 60, 50, 20
    plot_w, plot_h = w - left - pad, h - bottom - pad
    top = (max((p.latency_s for p in pts), default=1.0) * 1.1) or 1.0

    def x(v: float) -> float:
        return left + v / top * plot_w

    def y(v: float) -> float:
        return pad + (1 - v) * plot_h

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<line x1="{left}" y1="{y(0)}" x2="{left + plot_w}" y2="{y(0)}" stroke="black"/>',
        f'<line x1="{left}" y1="{y(0)}" x2="{left}" y2="{y(1)}" stroke="black"/>',
        f'<text x="{left + plot_w / 2}" y="{h - 12}" text-anchor="middle">median latency per task (s)</text>',
        f'<text x="14" y="{pad + plot_h / 2}" transform="rotate(-90 14 {pad + plot_h / 2})" '
        'text-anchor="middle">accuracy</text>',
    ]
    for tick in (0.0, 0.25, 0.5, 0.75, 1.0):
        parts.append(f'<text x="{left - 6}" y="{y(tick) + 4}" text-anchor="end">{tick:.0%}</text>')
        parts.append(
            f'<text x="{x(top * tick)}" y="{y(0) + 16}" text-anchor="middle">{top * tick:.2f}</text>'
        )
    for p in pts:
        cx, cy = x(p.latency_s), y(p.accuracy)
        parts.append(f'<line x1="{cx}" y1="{y(p.low)}" x2="{cx}" y2="{y(p.high)}" stroke="#888"/>')
        parts.append(f'<circle cx="{cx}" cy="{cy}" r="5" fill="#2a7"/>')
        parts.append(f'<text x="{cx + 8}" y="{cy - 6}">{escape(p.mark)} {escape(p.name)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def save_picture(report: CompareReport, report_path: Path) -> Path:
    """The SVG picture beside the JSON report (``report.json`` -> ``report.svg``); returns its path."""
    path = report_path.with_suffix(".svg")
    path.write_text(svg_picture(report), encoding="utf-8")
    return path
