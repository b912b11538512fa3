"""Self-speculative drafting without a draft model: n-gram lookup in the prompt and the generated text.

The idea is llama.cpp's ``ngram-mod`` / prompt lookup: when the last few tokens appeared before, guess that
what followed them then follows them now (code rewrites, summaries that quote, repeated structure). Longer
matches are tried first because they guess better. A :class:`DraftController` adapts the draft length to the
acceptance rate and pauses drafting where guesses keep failing, probing again later, so free chat does not pay
for speculation it cannot use. Pure Python, no llama_cpp.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from clover_local.plan.types import SpeculativePlan


class NgramDrafter:
    """Index of every n-gram (for a few sizes) -> the position right after its latest occurrence."""

    def __init__(self, match_sizes: Sequence[int] = (12, 6, 3, 2)) -> None:
        sizes = sorted({int(k) for k in match_sizes if int(k) > 0}, reverse=True)
        if not sizes:
            raise ValueError("match_sizes needs at least one positive size")
        self.match_sizes = tuple(sizes)
        self.tokens: list[int] = []
        self._maps: list[dict[tuple[int, ...], int]] = [{} for _ in sizes]

    def reset(self, tokens: Iterable[int] = ()) -> None:
        self.tokens = []
        self._maps = [{} for _ in self.match_sizes]
        self.extend(tokens)

    def truncate(self, n: int) -> None:
        """Forget tokens after the first ``n`` (their n-grams stay indexed: harmless, they are only guesses)."""
        del self.tokens[n:]

    def extend(self, tokens: Iterable[int]) -> None:
        toks = self.tokens
        for t in tokens:
            j = len(toks)
            # Register the n-grams that end just before position j: they are followed by token j.
            for k, table in zip(self.match_sizes, self._maps, strict=True):
                if j >= k:
                    table[tuple(toks[j - k : j])] = j
            toks.append(t)

    def draft(self, max_tokens: int) -> list[int]:
        """Up to ``max_tokens`` tokens guessed to follow the current end; empty when no n-gram matches."""
        if max_tokens <= 0:
            return []
        toks = self.tokens
        n = len(toks)
        for k, table in zip(self.match_sizes, self._maps, strict=True):
            if n < k:
                continue
            pos = table.get(tuple(toks[n - k :]))
            if pos is not None and pos < n:
                return toks[pos : min(pos + max_tokens, n)]
        return []


class DraftController:
    """Draft length from recent acceptance; pauses (with growing back-off) when drafts keep missing."""

    def __init__(self, n_min: int = 2, n_max: int = 16, *, start: int = 8) -> None:
        self.n_min = max(1, n_min)
        self.n_max = max(self.n_min, n_max)
        self.cap = min(max(start, self.n_min), self.n_max)
        self._pause_left = 0
        self._backoff = 8
        self._misses = 0
        self.drafted = 0
        self.accepted = 0
        self.steps = 0

    def budget(self) -> int:
        """How many tokens to draft now (0: do not draft)."""
        return 0 if self._pause_left > 0 else self.cap

    def advance(self, n_tokens: int) -> None:
        """Tokens were produced (by any kind of step): count down a pause."""
        if self._pause_left > 0:
            self._pause_left = max(0, self._pause_left - n_tokens)

    def record(self, drafted: int, accepted: int) -> None:
        """A verification step drafted ``drafted`` tokens of which the first ``accepted`` were right."""
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        if accepted >= drafted:
            self.cap = min(self.n_max, self.cap * 2)
        else:
            self.cap = max(self.n_min, min(self.cap, accepted + 2))
        if accepted * 2 < drafted:
            self._misses += 1
            if self._misses >= 3:
                self._pause_left = self._backoff
                self._backoff = min(self._backoff * 2, 256)
                self._misses = 0
        else:
            self._misses = 0
            self._backoff = 8

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class Drafter(Protocol):
    """What the generation loop needs from a drafter: the history so far, and guesses at what follows."""

    def reset(self, tokens: Iterable[int] = ()) -> None: ...

    def extend(self, tokens: Iterable[int]) -> None: ...

    def draft(self, max_tokens: int) -> list[int]: ...


def default_drafter(plan: SpeculativePlan) -> Drafter:
    """The n-gram drafter (llama.cpp's ngram-mod idea), longest match first."""
    return NgramDrafter(_match_sizes(plan.n_match))


def _match_sizes(n_match: int) -> tuple[int, ...]:
    """N-gram sizes tried longest first: the plan's ``n_match`` caps the longest."""
    return tuple(sorted({k for k in (min(n_match, 12), 6, 3, 2) if 0 < k <= n_match}, reverse=True)) or (1,)
