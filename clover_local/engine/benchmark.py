"""Side-by-side engine benchmark: the same greedy prompts through (a) plain llama-cpp-python
``Llama.create_completion``, (b) the embedded engine without speculation, (c) with self-speculative decoding,
(d) llama-cpp-python's ``LlamaPromptLookupDecoding``. Runs are interleaved (a, b, c, d, a, b, ...) so a busy
machine slows every engine alike; the report gives medians and ratios to (a), and whether the greedy outputs of
(b) and (c) are identical.

Completion-style prompts suit the Gemma 3 270M base model the numbers in docs/measurements.md come from.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

ENGINES = {
    "a": "llama-cpp-python create_completion",
    "b": "engine, no speculation",
    "c": "engine, self-speculative",
    "d": "llama-cpp-python LlamaPromptLookupDecoding",
}

# Gemma 3 270M copies a file faithfully when it starts with code (a leading import block sends it into a loop).
_CODE = '''@dataclass
class Inventory:
    """Items in a store, by name, with their counts and prices."""

    counts: dict[str, int] = field(default_factory=dict)
    prices: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, count: int, price: float) -> None:
        """Add count items of name at price (the latest price wins)."""
        self.counts[name] = self.counts.get(name, 0) + count
        self.prices[name] = price

    def remove(self, name: str, count: int) -> None:
        """Take count items of name out; never below zero."""
        left = self.counts.get(name, 0) - count
        if left < 0:
            raise ValueError(f"only {self.counts.get(name, 0)} of {name} in stock")
        self.counts[name] = left

    def value(self) -> float:
        """What everything in stock is worth."""
        return sum(self.counts[name] * self.prices[name] for name in self.counts)

    def save(self, path: Path) -> None:
        """Write the inventory as JSON."""
        path.write_text(json.dumps({"counts": self.counts, "prices": self.prices}, indent=2))

    @classmethod
    def load(cls, path: Path) -> "Inventory":
        """Read an inventory written by save."""
        data = json.loads(path.read_text())
        return cls(counts=data["counts"], prices=data["prices"])

    def low_stock(self, threshold: int = 5) -> list[str]:
        """Names of the items with fewer than threshold left, fewest first."""
        low = [name for name, count in self.counts.items() if count < threshold]
        return sorted(low, key=lambda name: self.counts[name])

    def cheapest(self) -> str | None:
        """The name of the cheapest item in stock, or None when the store is empty."""
        in_stock = [name for name, count in self.counts.items() if count > 0]
        if not in_stock:
            return None
        return min(in_stock, key=lambda name: self.prices[name])

    def report(self) -> str:
        """One line per item: name, count and value, then the total."""
        lines = [f"{name}: {count} x {self.prices[name]:.2f}" for name, count in sorted(self.counts.items())]
        lines.append(f"total: {self.value():.2f}")
        return "\n".join(lines)
'''

_ARTICLE = """The city council voted on Tuesday to extend the riverside bike path by four kilometres, linking the \
old harbour district with the new university campus. Construction will start in the spring and is expected to \
take eighteen months. The project costs 12 million euros, of which the regional government pays half. Cyclists' \
groups welcomed the decision, saying the current route forces riders onto a busy road with no bike lane. Some \
shop owners in the harbour district worried that parking spaces would be lost, but the council said only twelve \
spaces would be removed and that a new car park near the station would open before the work begins. The mayor \
said the path would make it easier for students to live in the harbour district, where rents are lower, and \
cycle to the campus in about fifteen minutes."""

WORKLOADS: dict[str, str] = {
    "code_rewrite": (
        f"Original file:\n```python\n{_CODE}```\n\n"
        "The same file after renaming Inventory to Stock:\n```python\n"
    ),
    "summary": (
        f"Article:\n{_ARTICLE}\n\nThe article again, followed by a one-paragraph summary that quotes its key "
        f"facts.\n\nArticle:\n"
    ),
    "free_chat": (
        "The following is an essay about the history of the bicycle, from the first designs to modern racing "
        "bikes.\n\n"
    ),
}


@dataclass(frozen=True)
class Sample:
    engine: str
    workload: str
    completion_tokens: int
    decode_tokens_per_s: float
    ttft_s: float
    text: str
    draft_acceptance: float | None = None
    error: str | None = None
    round: int = 0


@dataclass
class BenchReport:
    model: str
    settings: dict[str, Any]
    rounds: int
    max_tokens: int
    samples: list[Sample] = field(default_factory=list)

    def _ran(self, workload: str, *engines: str) -> list[Sample]:
        """The samples of ``engines`` on ``workload`` that did not fail, in order."""
        return [s for s in self.samples if s.workload == workload and s.engine in engines and not s.error]

    def median(self, engine: str, workload: str) -> float | None:
        values = [s.decode_tokens_per_s for s in self._ran(workload, engine)]
        return statistics.median(values) if values else None

    def error(self, engine: str, workload: str) -> str | None:
        return next(
            (s.error for s in self.samples if s.engine == engine and s.workload == workload and s.error), None
        )

    def outputs_match(self, workload: str, first: str = "b", second: str = "c") -> bool | None:
        """Whether every greedy run of ``first`` and ``second`` produced the same text."""
        ran = self._ran(workload, first, second)
        return len({s.text for s in ran}) == 1 if {first, second} <= {s.engine for s in ran} else None

    def same_prefix(self, workload: str) -> float | None:
        """Shortest share of (b)'s text that (c) reproduced exactly before the first difference, over rounds."""
        from clover_local.engine.sequence import common_prefix

        b, c = ([s.text for s in self._ran(workload, e)] for e in ("b", "c"))
        shares = [
            common_prefix(tb, tc) / max(len(tb), 1) if tb != tc else 1.0 for tb, tc in zip(b, c, strict=False)
        ]
        return min(shares) if shares else None

    def paired_ratio(self, num: str, den: str, workload: str) -> float | None:
        """Median over rounds of ``num``/``den`` measured in the same round (back to back): steadier than a ratio
        of medians when other programs load the machine in bursts."""
        by_round: dict[int, dict[str, float]] = {}
        for s in self._ran(workload, *ENGINES):
            if s.decode_tokens_per_s > 0:
                by_round.setdefault(s.round, {})[s.engine] = s.decode_tokens_per_s
        ratios = [r[num] / r[den] for r in by_round.values() if num in r and den in r]
        return statistics.median(ratios) if ratios else None

    def table(self) -> list[dict[str, Any]]:
        rows = []
        for workload in dict.fromkeys(s.workload for s in self.samples):
            base = self.median("a", workload)
            row: dict[str, Any] = {"workload": workload}
            for engine in ENGINES:
                value = self.median(engine, workload)
                row[engine] = value
                row[f"{engine}/a"] = value / base if value is not None and base else None
                row[f"{engine}_error"] = self.error(engine, workload)
            for num, den in (("b", "a"), ("c", "a"), ("d", "a"), ("c", "b")):
                row[f"{num}/{den} paired"] = self.paired_ratio(num, den, workload)
            row["c/b"] = row["c"] / row["b"] if row["b"] and row["c"] else None
            accs = [s.draft_acceptance for s in self.samples if s.engine == "c" and s.workload == workload]
            row["c_acceptance"] = statistics.median([a for a in accs if a is not None] or [0.0])
            row["b==c"] = self.outputs_match(workload)
            row["b_c_same_prefix"] = self.same_prefix(workload)
            row["a==b"] = self.outputs_match(workload, "a", "b")
            rows.append(row)
        return rows

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "settings": self.settings,
            "rounds": self.rounds,
            "max_tokens": self.max_tokens,
            "engines": ENGINES,
            "table": self.table(),
            "samples": [asdict(s) for s in self.samples],
        }


def _run_llama(llm: Any, name: str, workload: str, prompt: str, max_tokens: int) -> Sample:
    t0, t_first, parts = time.perf_counter(), None, []
    try:
        for chunk in llm.create_completion(prompt, max_tokens=max_tokens, temperature=0.0, stream=True):
            t_first = t_first or time.perf_counter()
            parts.append(chunk["choices"][0]["text"])
    except Exception as exc:  # a benchmark reports an engine's crash instead of stopping
        return Sample(name, workload, 0, 0.0, 0.0, "", error=f"{type(exc).__name__}: {exc}")
    t_end = time.perf_counter()
    t_first, text = t_first or t_end, "".join(parts)
    n = len(llm.tokenize(text.encode("utf-8"), add_bos=False, special=True))
    rate = (n - 1) / (t_end - t_first) if n > 1 and t_end > t_first else 0.0
    return Sample(name, workload, n, rate, t_first - t0, text)


def _run_engine(
    engine: Any, speculative: bool, name: str, workload: str, prompt: str, max_tokens: int
) -> Sample:
    from clover_local.engine.types import Finished, GenerationRequest, TextDelta

    req = GenerationRequest(prompt=prompt, max_tokens=max_tokens, temperature=0.0, speculative=speculative)
    parts = []
    stats = None
    for event in engine.generate(req):
        if isinstance(event, TextDelta):
            parts.append(event.text)
        elif isinstance(event, Finished):
            stats = event.stats
    assert stats is not None
    return Sample(
        name,
        workload,
        stats.completion_tokens,
        stats.decode_tokens_per_s,
        stats.ttft_s,
        "".join(parts),
        draft_acceptance=stats.draft_acceptance,
    )


def run_benchmark(
    model_path: Path,
    settings: dict[str, Any],
    *,
    rounds: int = 3,
    max_tokens: int = 256,
    workloads: tuple[str, ...] = tuple(WORKLOADS),
    engines: tuple[str, ...] = tuple(ENGINES),
    progress: Callable[[str], None] | None = None,
) -> BenchReport:
    """Load each engine once, then run every (round, workload, engine) interleaved; greedy, same settings."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    from clover_local.engine.loader import load_engine
    from clover_local.engine.native import load_llama
    from clover_local.plan.types import SpeculativePlan

    # The path is given apart; the template is the engines' own (completion); overrides go through ctypes.
    dropped = ("model_path", "chat_format", "tensor_buft_overrides")
    llama_kwargs = {k: v for k, v in settings.items() if k not in dropped}
    runners: dict[str, Callable[[str, str, int], Sample]] = {}
    closers: list[Callable[[], None]] = []
    if "a" in engines:
        llm_a = load_llama(model_path, verbose=False, **llama_kwargs)
        runners["a"] = partial(_run_llama, llm_a, "a")
        closers.append(llm_a.close)
    if "b" in engines or "c" in engines:
        result = load_engine(
            model_path, settings, chat_template="completion", speculative=SpeculativePlan(enabled=True)
        )
        runners["b"] = partial(_run_engine, result.engine, False, "b")
        runners["c"] = partial(_run_engine, result.engine, True, "c")
        closers.append(result.engine.close)
        model_name = result.engine.model_name
    else:
        model_name = model_path.stem
    if "d" in engines:
        llm_d = load_llama(
            model_path,
            verbose=False,
            draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10),
            **llama_kwargs,
        )
        runners["d"] = partial(_run_llama, llm_d, "d")
        closers.append(llm_d.close)
    report = BenchReport(model=model_name, settings=dict(settings), rounds=rounds, max_tokens=max_tokens)
    try:
        for engine in engines:  # untimed warm-up: first-decode allocations, page faults of the weights
            runners[engine]("warm-up", "Once upon a time", 4)
        for r in range(rounds):
            for workload in workloads:
                for engine in engines:
                    sample = replace(runners[engine](workload, WORKLOADS[workload], max_tokens), round=r)
                    report.samples.append(sample)
                    if progress:
                        state = sample.error or f"{sample.decode_tokens_per_s:.1f} tok/s"
                        progress(f"round {r + 1}/{rounds} {workload} ({engine}) {state}")
    finally:
        for close in closers:
            close()
    return report


def format_table(report: BenchReport) -> str:
    """A Markdown table: median decode tokens/s per engine, and ratios measured back to back in each round
    (median over rounds)."""
    head = (
        "| workload | (a) llama-cpp-python | (b) engine | (c) engine + spec | (d) prompt lookup "
        "| b/a | c/b | c/a | d/a | draft acceptance | greedy b == c |"
    )
    lines = [head, "|" + " --- |" * 11]

    def num(v: float | None, fmt: str = "{:.1f}") -> str:
        return fmt.format(v) if v is not None else "-"

    rows = report.table()
    for row in rows:
        d = "crashed" if row["d_error"] else num(row["d"])
        lines.append(
            f"| {row['workload']} | {num(row['a'])} | {num(row['b'])} | {num(row['c'])} | {d} | "
            f"{num(row['b/a paired'], '{:.2f}')} | {num(row['c/b paired'], '{:.2f}')} | "
            f"{num(row['c/a paired'], '{:.2f}')} | "
            f"{'-' if row['d_error'] else num(row['d/a paired'], '{:.2f}')} | {row['c_acceptance']:.0%} | "
            f"{_match_text(row)} |"
        )
    lines += [f"\n(d) on {row['workload']}: {row['d_error']}" for row in rows if row["d_error"]]
    return "\n".join(lines)


def _match_text(row: dict[str, Any]) -> str:
    if row["b==c"] is None:
        return "-"
    if row["b==c"]:
        return "yes"
    return f"no (same first {row['b_c_same_prefix']:.0%})"


def load_report(path: Path) -> BenchReport:
    """A report back from its JSON file (to print its table again)."""
    import json

    data = json.loads(path.read_text(encoding="utf-8"))
    report = BenchReport(data["model"], data["settings"], data["rounds"], data["max_tokens"])
    per_round = len(data["samples"]) // max(data["rounds"], 1)
    for i, raw in enumerate(data["samples"]):
        raw.setdefault("round", i // max(per_round, 1))
        report.samples.append(Sample(**raw))
    return report
