"""Each speculation mode side by side: decode tokens/s, draft acceptance, ratio to plain.

One engine per mode (a llama-server, or the embedded engine for the modes it runs), on the same plan but for
``--spec`` (``off`` is plain decoding), the same greedy prompts (``engine.benchmark.WORKLOADS``), modes in turn
within each round, so a machine that slows down mid-run slows every mode alike. The medians'
ratios to plain are what ``--spec auto`` reads later (``measure.records.save_spec_ratios``).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from clover_local.launch import Launch

PLAIN = "off"


@dataclass(frozen=True)
class ModeSample:
    mode: str
    workload: str
    round: int
    completion_tokens: int
    decode_tokens_per_s: float
    drafted_tokens: int
    accepted_tokens: int


@dataclass
class SpecBenchReport:
    model: str
    max_tokens: int
    rounds: int
    modes: list[str]
    workloads: list[str]
    samples: list[ModeSample] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    """Mode -> why it could not run (no head in the files, llama-server refused...)."""
    engine: str = "llama-server"

    def median(self, mode: str, workload: str) -> float | None:
        values = [s.decode_tokens_per_s for s in self.samples if s.mode == mode and s.workload == workload]
        return statistics.median(values) if values else None

    def acceptance(self, mode: str) -> float | None:
        drafted = sum(s.drafted_tokens for s in self.samples if s.mode == mode)
        accepted = sum(s.accepted_tokens for s in self.samples if s.mode == mode)
        return accepted / drafted if drafted else None

    def ratio(self, mode: str) -> float | None:
        """Geometric mean over workloads of (mode's median / plain's median)."""
        pairs = [(self.median(mode, w), self.median(PLAIN, w)) for w in self.workloads]
        parts = [m / p for m, p in pairs if m and p]
        return statistics.geometric_mean(parts) if parts else None

    def ratios(self) -> dict[str, float]:
        """Mode -> ratio to plain, for every mode measured (plain itself excluded)."""
        return {m: round(r, 3) for m in self.modes if m != PLAIN and (r := self.ratio(m)) is not None}

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["ratios"] = self.ratios()
        return data


def run_spec_bench(
    launch_for: Callable[[str], Launch],
    modes: Sequence[str],
    workloads: dict[str, str],
    *,
    engine_name: str,
    rounds: int,
    max_tokens: int,
    progress: Callable[[str], None],
) -> SpecBenchReport:
    """Measure ``modes`` (``off`` first: the baseline) with one engine each, greedy; ``launch_for(mode)`` gives the
    launch for a mode, decided for it (raising :class:`~clover_local.errors.CloverError` when the files lack its
    head). Each engine is opened as decided, through :func:`clover_local.launch.open_launch` (the one way launches
    are loaded): the launches ask for no chat template (the workloads are plain prompts), and each request for
    greedy sampling."""
    from clover_local.engine.types import Finished, GenerationRequest
    from clover_local.errors import CloverError
    from clover_local.launch import open_launch

    ordered = [PLAIN, *[m for m in modes if m != PLAIN]]
    report = SpecBenchReport("", max_tokens, rounds, ordered, list(workloads), engine=engine_name)
    plans: dict[str, Launch] = {}
    for mode in ordered:
        try:
            plans[mode] = launch_for(mode)
        except CloverError as exc:
            report.errors[mode] = exc.what
            progress(f"{mode}: skipped ({exc.what})")
    report.model = next((p.plan.model_path or p.plan.preset for p in plans.values()), "")
    # Round by round, every mode in turn (one engine loaded at a time: a real model may fill the machine).
    for r in range(rounds):
        for mode, plan in plans.items():
            if mode in report.errors:
                continue
            try:
                engine = open_launch(plan, measure_costs=False).engine
            except CloverError as exc:
                report.errors[mode] = exc.what
                progress(f"{mode}: could not start ({exc.what})")
                continue
            try:
                for name, prompt in workloads.items():
                    request = GenerationRequest(
                        prompt=prompt, max_tokens=max_tokens, temperature=0.0, top_p=1.0, top_k=1, seed=1
                    )
                    stats = next(e.stats for e in engine.generate(request) if isinstance(e, Finished))
                    sample = ModeSample(
                        mode,
                        name,
                        r,
                        stats.completion_tokens,
                        stats.decode_tokens_per_s,
                        stats.drafted_tokens,
                        stats.accepted_tokens,
                    )
                    report.samples.append(sample)
                    progress(f"{mode:7} {name:13} round {r + 1}: {stats.decode_tokens_per_s:7.1f} tok/s")
            finally:
                engine.close()
    return report


def format_spec_table(report: SpecBenchReport) -> str:
    """Rows per mode: tokens/s per workload (median), acceptance, ratio to plain."""
    head = (
        f"{'mode':8}" + "".join(f"{w:>14}" for w in report.workloads) + f"{'acceptance':>12}{'vs plain':>10}"
    )
    lines = [head]
    for mode in report.modes:
        if mode in report.errors:
            lines.append(f"{mode:8}  not run: {report.errors[mode]}")
            continue
        cells = "".join(
            f"{m:14.1f}" if (m := report.median(mode, w)) is not None else f"{'-':>14}"
            for w in report.workloads
        )
        acc = report.acceptance(mode)
        ratio = report.ratio(mode)
        lines.append(
            f"{mode:8}{cells}{(f'{acc:.0%}' if acc is not None else '-'):>12}"
            f"{(f'{ratio:.2f}x' if ratio is not None else '-'):>10}"
        )
    return "\n".join(lines)
