"""``clover-local bench`` for diffusion models: block lengths and steps per block side by side.

Each configuration writes the same answer length for the same prompts with the same seed; what is reported
per configuration is the median answer tokens/s, the tokens unmasked per step, and how much of the output
changes against the most careful configuration (one token per step, the first listed block length): the
price of unmasking several tokens per step. Runs are interleaved, so a busy machine slows all alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from clover_local.engine.diffusion_schedule import parse_algorithm
from clover_local.engine.types import ChatMessage

PROMPTS: dict[str, str] = {
    "explain": "Explain in a few sentences why the sky is blue.",
    "code": "Write a Python function that returns the n-th Fibonacci number.",
}


@dataclass(frozen=True)
class Config:
    block_length: int
    """0: timestep schedule over the whole answer."""
    tokens_per_step: int

    @property
    def label(self) -> str:
        block = "timestep" if self.block_length == 0 else f"block {self.block_length}"
        return f"{block}, {self.tokens_per_step} tok/step"


@dataclass
class Row:
    config: Config
    steps: int = 0
    tokens_per_s: list[float] = field(default_factory=list)
    changed: list[float] = field(default_factory=list)
    """Share of answer positions that differ from the reference configuration's, per prompt."""

    def to_json(self) -> dict[str, Any]:
        return {
            **asdict(self.config),
            "label": self.config.label,
            "steps": self.steps,
            "tokens_per_s_median": round(statistics.median(self.tokens_per_s), 2)
            if self.tokens_per_s
            else None,
            "changed_vs_reference": round(statistics.mean(self.changed), 4) if self.changed else None,
        }


def grid(block_lengths: Sequence[int], tokens_per_step: Sequence[int]) -> list[Config]:
    """Every block length with every tokens-per-step; the first is the reference."""
    return [Config(b, t) for b in block_lengths for t in tokens_per_step]


def run_diffusion_bench(
    engine: Any,
    configs: Sequence[Config],
    *,
    answer: int,
    rounds: int,
    algorithm: str = "confidence",
    seed: int = 42,
    progress: Callable[[str], None] | None = None,
) -> list[Row]:
    """Time each configuration on each prompt ``rounds`` times (interleaved) with ``engine``'s runner."""
    runner = engine.runner
    rows = [Row(c) for c in configs]
    reference: dict[str, list[int]] = {}
    for r in range(rounds):
        for name, text in PROMPTS.items():
            prompt = engine.tokenize(
                engine.render_prompt((ChatMessage("user", text),)), add_special=True, parse_special=True
            )
            for row in rows:
                params = _params(runner, len(prompt), row.config, answer, algorithm, seed)
                result = runner.generate(prompt, params)
                row.steps = result.steps_run
                row.tokens_per_s.append(result.tokens_per_s)
                if r == 0:
                    tokens = result.tokens[:answer]
                    ref = reference.setdefault(name, tokens)
                    differ = sum(1 for a, b in zip(ref, tokens, strict=False) if a != b)
                    row.changed.append(differ / max(1, len(ref)))
                if progress:
                    progress(
                        f"round {r + 1}/{rounds} {name}: {row.config.label}: {result.tokens_per_s:.1f} tok/s"
                    )
    return rows


def _params(runner: Any, n_prompt: int, config: Config, answer: int, algorithm: str, seed: int) -> Any:
    canvas = n_prompt + answer
    if config.block_length:
        canvas = -(-canvas // config.block_length) * config.block_length
        n_blocks = canvas // config.block_length
        steps = max(1, config.block_length // config.tokens_per_step) * n_blocks
    else:
        steps = max(1, answer // config.tokens_per_step)
    return runner.params(
        max_length=canvas,
        steps=steps,
        algorithm=parse_algorithm(algorithm),
        eps=0.001 if not config.block_length else 0.0,
        block_length=config.block_length,
        temperature=0.0,
        seed=seed,
    )


def format_rows(rows: Sequence[Row]) -> str:
    head = f"{'configuration':<26} {'steps':>6} {'tok/s':>8} {'changed vs first':>17}"
    lines = [head, "-" * len(head)]
    for row in rows:
        j = row.to_json()
        tps = "-" if j["tokens_per_s_median"] is None else f"{j['tokens_per_s_median']:.1f}"
        changed = "-" if j["changed_vs_reference"] is None else f"{j['changed_vs_reference']:.0%}"
        lines.append(f"{row.config.label:<26} {row.steps:>6} {tps:>8} {changed:>17}")
    return "\n".join(lines)
