"""The statistics a comparison reports: accuracy with a 95% Wilson interval, the spread of times, and an exact
McNemar test between two models on the same tasks (only the tasks one passed and the other failed count)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

Z95 = 1.959963984540054
ALPHA = 0.05


def wilson(passed: int, total: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for ``passed`` of ``total`` (0..1 each side; (0, 1) with no tasks)."""
    if total <= 0:
        return 0.0, 1.0
    p = passed / total
    denominator = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denominator
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denominator
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    """The 25th percentile."""
    high: float
    """The 75th percentile."""
    n: int


def spread(values: Sequence[float]) -> Spread | None:
    """Median and interquartile range of ``values`` (None when there are none)."""
    xs = sorted(values)
    if not xs:
        return None
    if len(xs) == 1:
        return Spread(xs[0], xs[0], xs[0], 1)
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return Spread(statistics.median(xs), q[0], q[2], len(xs))


@dataclass(frozen=True)
class Paired:
    """Two contenders on the tasks both ran."""

    a: str
    b: str
    only_a: int
    """Tasks ``a`` passed and ``b`` failed."""
    only_b: int
    both: int
    neither: int
    p_value: float

    @property
    def shown(self) -> bool:
        return self.p_value < ALPHA

    @property
    def verdict(self) -> str:
        if not self.shown:
            return "no difference shown"
        better = self.a if self.only_a > self.only_b else self.b
        return f"{better} is right more often"


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """The two-sided exact McNemar p-value: the discordant pairs as a fair coin's ``only_a + only_b`` tosses."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = float(Fraction(sum(math.comb(n, i) for i in range(k + 1)), 2**n))
    return min(1.0, 2 * tail)


def paired(a: str, b: str, a_passed: dict[str, bool], b_passed: dict[str, bool]) -> Paired:
    """``a`` against ``b`` on the keys (task and repeat) both have a result for."""
    keys = sorted(set(a_passed) & set(b_passed))
    only_a = sum(1 for k in keys if a_passed[k] and not b_passed[k])
    only_b = sum(1 for k in keys if b_passed[k] and not a_passed[k])
    both = sum(1 for k in keys if a_passed[k] and b_passed[k])
    neither = len(keys) - only_a - only_b - both
    return Paired(a, b, only_a, only_b, both, neither, mcnemar_exact(only_a, only_b))
