"""What a comparison found, as values: a result per contender and task, the totals, the pairs, the JSON report
(``--json FILE``, read back by ``--show`` and ``--resume``) and the terminal table."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from clover_local.compare.checks import CheckResult
from clover_local.compare.stats import Paired, Spread, paired, spread, wilson
from clover_local.errors import UsageError
from clover_local.user_files import write_atomically

REPORT_KIND = "clover-local compare"
REPORT_VERSION = 1
MAX_REPORT_BYTES = 64 * 1024 * 1024
"""A saved report read back (``--show``, ``--resume``) may be at most this big."""


@dataclass(frozen=True)
class TaskResult:
    id: str
    repeat: int
    reply: str
    tool_calls: tuple[dict[str, Any], ...]
    """``{name, arguments}``, the arguments parsed where they are JSON (else the text as written)."""
    passed: bool
    asserts: tuple[CheckResult, ...]
    ttft_s: float | None = None
    latency_s: float | None = None
    decode_tok_s: float | None = None
    tokens_in: int = 0
    tokens_out: int = 0
    finish: str = ""
    error: str | None = None
    """Why there is no reply (it then fails)."""

    @property
    def key(self) -> str:
        return f"{self.id}#{self.repeat}"


@dataclass
class ContenderResult:
    name: str
    """As given on the command line (a preset, a file, ``hf:...``, ``URL#MODEL``)."""
    kind: str
    """``preset``, ``gguf``, ``hf`` or ``endpoint``."""
    tasks: list[TaskResult] = field(default_factory=list)
    error: str | None = None
    """Why the contender could not run (at all, or any further)."""
    notices: list[str] = field(default_factory=list)
    engine: str = ""
    """What ran it: the runner and model file, or the endpoint's model."""
    peak_ram_bytes: int | None = None
    peak_vram_bytes: dict[str, int] = field(default_factory=dict)
    """GPU index -> peak bytes the model's process held there."""

    @property
    def passed(self) -> int:
        return sum(1 for t in self.tasks if t.passed)

    @property
    def total(self) -> int:
        return len(self.tasks)

    @property
    def accuracy(self) -> float | None:
        return self.passed / self.total if self.total else None

    def times(self, what: str) -> Spread | None:
        values = [getattr(t, what) for t in self.tasks if t.error is None and getattr(t, what) is not None]
        return spread([float(v) for v in values])

    def passes(self) -> dict[str, bool]:
        return {t.key: t.passed for t in self.tasks}


@dataclass
class CompareReport:
    contenders: list[ContenderResult]
    tasks_source: str
    tasks_digest: str
    task_ids: list[str]
    options: dict[str, Any]
    machine: str = ""
    started: str = ""
    complete: bool = False

    def contender(self, name: str) -> ContenderResult | None:
        return next((c for c in self.contenders if c.name == name), None)

    def pairs(self) -> list[Paired]:
        ran = [c for c in self.contenders if c.tasks]
        return [
            paired(a.name, b.name, a.passes(), b.passes()) for i, a in enumerate(ran) for b in ran[i + 1 :]
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": REPORT_KIND,
            "version": REPORT_VERSION,
            "complete": self.complete,
            "started": self.started,
            "machine": self.machine,
            "tasks_source": self.tasks_source,
            "tasks_digest": self.tasks_digest,
            "task_ids": self.task_ids,
            "options": self.options,
            "contenders": [_contender_json(c) for c in self.contenders],
            "pairs": [
                {**asdict(p), "p_value": round(p.p_value, 6), "shown": p.shown, "verdict": p.verdict}
                for p in self.pairs()
            ],
        }


def _spread_json(s: Spread | None) -> dict[str, float] | None:
    return None if s is None else {"median": s.median, "p25": s.low, "p75": s.high, "n": s.n}


def _contender_json(c: ContenderResult) -> dict[str, Any]:
    lo, hi = wilson(c.passed, c.total)
    spreads = {what: c.times(what) for what in ("ttft_s", "decode_tok_s", "latency_s")}
    return {
        "name": c.name,
        "kind": c.kind,
        "engine": c.engine,
        "error": c.error,
        "accuracy": c.accuracy,
        "accuracy_95": [lo, hi] if c.total else None,
        "passed": c.passed,
        "total": c.total,
        **{what: s.median if s else None for what, s in spreads.items()},
        "spread": {what: _spread_json(s) for what, s in spreads.items()},
        "peak_ram_bytes": c.peak_ram_bytes,
        "peak_vram_bytes": c.peak_vram_bytes,
        "notices": c.notices,
        "tasks": [_task_json(t) for t in c.tasks],
    }


def _task_json(t: TaskResult) -> dict[str, Any]:
    data = asdict(t)
    data["tool_calls"] = list(t.tool_calls)
    data["asserts"] = [asdict(a) for a in t.asserts]
    return data


def report_from_json(data: Any) -> CompareReport:
    """A report as :meth:`CompareReport.to_json` wrote it; ``ValueError`` when it is not one."""
    if not isinstance(data, dict) or data.get("kind") != REPORT_KIND:
        raise ValueError("not a clover-local compare report")
    try:
        contenders = [
            ContenderResult(
                name=str(c["name"]),
                kind=str(c["kind"]),
                tasks=[_task_from(t) for t in c["tasks"]],
                error=c.get("error"),
                notices=[str(n) for n in c.get("notices", [])],
                engine=str(c.get("engine", "")),
                peak_ram_bytes=c.get("peak_ram_bytes"),
                peak_vram_bytes={str(k): int(v) for k, v in (c.get("peak_vram_bytes") or {}).items()},
            )
            for c in data["contenders"]
        ]
        return CompareReport(
            contenders,
            str(data["tasks_source"]),
            str(data["tasks_digest"]),
            [str(i) for i in data["task_ids"]],
            dict(data["options"]),
            str(data.get("machine", "")),
            str(data.get("started", "")),
            bool(data.get("complete")),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"a field is missing or of the wrong kind ({exc})") from None


def _task_from(t: dict[str, Any]) -> TaskResult:
    asserts = tuple(
        CheckResult(str(a["type"]), bool(a["passed"]), str(a.get("why", ""))) for a in t["asserts"]
    )
    return TaskResult(
        id=str(t["id"]),
        repeat=int(t.get("repeat", 0)),
        reply=str(t["reply"]),
        tool_calls=tuple(dict(c) for c in t.get("tool_calls", [])),
        passed=bool(t["passed"]),
        asserts=asserts,
        ttft_s=t.get("ttft_s"),
        latency_s=t.get("latency_s"),
        decode_tok_s=t.get("decode_tok_s"),
        tokens_in=int(t.get("tokens_in", 0)),
        tokens_out=int(t.get("tokens_out", 0)),
        finish=str(t.get("finish", "")),
        error=t.get("error"),
    )


def load_report(path: str | Path) -> CompareReport:
    """A saved report, or a :class:`UsageError` saying why the file is not one."""
    p = Path(path).expanduser()
    try:
        if p.stat().st_size > MAX_REPORT_BYTES:
            raise UsageError(f"{path}: larger than a compare report may be ({MAX_REPORT_BYTES} bytes).")
        return report_from_json(json.loads(p.read_text(encoding="utf-8")))
    except OSError as exc:
        raise UsageError(f"Cannot read {path}: {exc.strerror or exc}.") from None
    except (ValueError, RecursionError) as exc:
        raise UsageError(
            f"{path} is not a saved compare report ({exc}).", "Give a file written by compare --json."
        ) from None


def default_report_path() -> Path:
    """Where a run is saved when no ``--json FILE`` is given (so Ctrl-C can be resumed): a new file in
    clover-local's data folder."""
    import time

    from clover_local.settings import data_dir

    folder = data_dir() / "compare"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"compare-{time.strftime('%Y%m%d-%H%M%S')}.json"


def save_report(report: CompareReport, path: str | Path) -> None:
    """Write the report atomically (a half-written file would lose a resumable run), through a temporary
    name of its own (a second run saving beside it, or a planted ``<name>.tmp`` link, cannot tear it)."""
    text = json.dumps(report.to_json(), indent=1, ensure_ascii=False)
    write_atomically(Path(path).expanduser(), text.encode("utf-8"))


# -- the table ----------------------------------------------------------------------------------------------


def _seconds(s: Spread | None) -> str:
    if s is None:
        return "-"
    return f"{s.median:.2f} ({s.low:.2f}-{s.high:.2f})"


def _ratio(value: Spread | None, base: Spread | None) -> str:
    return f" {value.median / base.median:.2f}x" if value and base and base.median else ""


def _bytes(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def format_table(report: CompareReport) -> str:
    """The terminal table: per contender accuracy (95% interval), median times with their interquartile range,
    speed as ratios to the first contender that ran, peak memory; then each pair's paired test."""
    rows = [
        ("contender", "passed", "accuracy (95%)", "TTFT s", "decode tok/s", "latency s", "peak RAM / VRAM")
    ]
    base = next((c for c in report.contenders if c.tasks and c.error is None), None)
    base_decode = base.times("decode_tok_s") if base else None
    base_latency = base.times("latency_s") if base else None
    notes: list[str] = []
    for c in report.contenders:
        if not c.tasks:
            rows.append((c.name, "-", "not run", "", "", "", ""))
            notes.append(f"{c.name}: {c.error or 'not run yet'}")
            continue
        lo, hi = wilson(c.passed, c.total)
        decode, latency = c.times("decode_tok_s"), c.times("latency_s")
        vram = " + ".join(_bytes(v) for v in c.peak_vram_bytes.values())
        rows.append(
            (
                c.name,
                f"{c.passed}/{c.total}",
                f"{c.passed / c.total:.0%} ({lo:.0%}-{hi:.0%})",
                _seconds(c.times("ttft_s")),
                (f"{decode.median:.1f}" if decode else "-") + _ratio(decode, base_decode),
                _seconds(latency) + _ratio(latency, base_latency),
                _bytes(c.peak_ram_bytes) + (f" / {vram}" if vram else ""),
            )
        )
        if c.error:
            notes.append(f"{c.name}: stopped early: {c.error}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if base is not None and len([c for c in report.contenders if c.tasks]) > 1:
        lines.append(
            f"(speed ratios are to {base.name}; times are medians, 25th-75th percentile in brackets)"
        )
    for p in report.pairs():
        lines.append(
            f"{p.a} vs {p.b}: {p.only_a} tasks only {p.a} passed, {p.only_b} only {p.b} "
            f"(exact McNemar p={p.p_value:.3f}): {p.verdict}"
        )
    lines += notes
    if not report.complete:
        lines.append("(not finished: --resume FILE goes on from here)")
    return "\n".join(lines)
