"""Prompts the llama-server benchmarks share: filler words that tokenize evenly, and a code snippet whose
repeats n-gram drafts can land on."""

from __future__ import annotations

CODE = '''def fold(values, step, start=0):
    """Sum every step-th value from start, the way the report wants it."""
    total = 0
    for index in range(start, len(values), step):
        total += values[index]
    return total

'''
VOCAB = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
    "pi",
    "rho",
    "sigma",
]


def words(n: int) -> str:
    """``n`` filler words (at least one), the same text every time."""
    return " ".join(VOCAB[(i * 7) % len(VOCAB)] for i in range(max(1, n)))
