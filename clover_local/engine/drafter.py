"""Self-speculative drafting without a draft model: n-gram lookup in the prompt and the generated text.

The idea is llama.cpp's ``ngram-mod`` / prompt lookup: when the last few tokens appeared before, guess that
what followed them then follows them now (code rewrites, summaries that quote, repeated structure). Longer
matches are tried first because they guess better; :class:`DraftController` decides how much of a draft is
verified. Pure Python, no llama_cpp.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from clover_local.plan.types import SpeculativePlan
from clover_local.plan.verify_cost import cost_of


class NgramDrafter:
    """Index of every n-gram (for a few sizes) -> the position right after its latest occurrence."""

    def __init__(self, match_sizes: Sequence[int] = (12, 6, 3, 2)) -> None:
        sizes = sorted({int(k) for k in match_sizes if int(k) > 0}, reverse=True)
        if not sizes:
            raise ValueError("match_sizes needs at least one positive size")
        self.match_sizes = tuple(sizes)
        self.last_match = 0
        """Size of the n-gram the last draft came from (0: none)."""
        self.reset()

    def reset(self, tokens: Iterable[int] = ()) -> None:
        self.tokens: list[int] = []
        self._maps: list[dict[tuple[int, ...], int]] = [{} for _ in self.match_sizes]
        self.extend(tokens)

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
                self.last_match = k
                return _copy_forward(toks, pos, max_tokens)
        self.last_match = 0
        return []


def _copy_forward(toks: Sequence[int], pos: int, count: int) -> list[int]:
    """``count`` tokens of the sequence from ``pos`` on, as if the sequence went on the way it did after
    ``pos``: where the copy reaches the end (the match was the recent past, as in a repeated line), it goes on
    copying what it has just guessed, an overlapping copy. That is what chaining n-gram lookups over the guess
    gives (llama.cpp's ``ngram-mod`` drafts token by token from the last n tokens, guess included), so a
    pattern of period ``len(toks) - pos`` is drafted ``count`` long instead of stopping at the end."""
    out = list(toks[pos : pos + count])
    period = len(toks) - pos
    while len(out) < count:
        out.append(out[len(out) - period])
    return out


class DraftController:
    """Decides how many drafted tokens to verify, from token statistics and a fixed cost model, never from
    timings: the same request then drafts the same way whatever the machine's load, so it gives the same text
    (llama.cpp's batched evaluation is not bit-identical to one-token evaluation, so *how* tokens were verified
    can change a near-tie).

    It keeps, per n-gram match size, a decaying estimate ``p`` of how often a drafted token is right. A draft
    of ``k`` tokens yields ``(1 - p**(k+1)) / (1 - p)`` tokens on average and costs ``costs[k]`` (a batch of
    ``k + 1`` tokens relative to a one-token step, :mod:`clover_local.plan.verify_cost`), so it picks the ``k``
    that maximises tokens per unit of cost and drafts nothing where no ``k`` beats plain decoding. While it is
    not drafting it still probes now and then (less often each time a probe fails), so a copy that starts later
    in the reply is picked up.

    Speculation never costs more than :data:`LOSS_BUDGET` of the reply's steps, by the same cost model: it keeps
    the steps drafting has saved so far (each verification yields ``accepted + 1`` tokens for ``costs[k]``) and
    verifies a draft only as long as it is short enough that, were every drafted token wrong, the loss would stay
    within :data:`START_BUDGET` plus :data:`LOSS_BUDGET` of the steps so far. A reply with nothing to copy then
    drafts little and short; a copy earns its own longer drafts after the first one or two.
    """

    MARGIN = 1.1
    """Expected speed-up a draft must promise: the cost model is an estimate, a wrong guess only wastes time."""
    DECAY = 0.9
    LOSS_BUDGET = 0.03
    """The most of a reply's steps drafting may lose, at worst, by the cost model (issue 28: at least 0.97x)."""
    START_BUDGET = 1.5
    """Steps drafting may lose before any draft has paid back: a first two-token draft on a CPU, where verifying
    it costs 2.4 steps (``plan.verify_cost``)."""
    PROBE_EVERY = 16
    """Plain steps before the first probe where drafting does not pay; each failed probe waits 4x longer (up to
    256), so a reply with nothing to copy (counting, free chat) pays at most a step or two for probing."""

    def __init__(self, n_min: int = 2, n_max: int = 16, costs: Sequence[float] = ()) -> None:
        self.n_min = max(1, n_min)
        self.n_max = max(self.n_min, n_max)
        self.costs = tuple(costs)
        self._hits: dict[int, float] = {}
        self._trials: dict[int, float] = {}
        self._since_probe = 0
        self._probe_every = self.PROBE_EVERY
        self.drafted = 0
        self.accepted = 0
        self.seen = 0
        """Generation steps the controller was asked about (drafted or not)."""
        self.saved = 0.0
        """Steps drafting saved so far by the cost model (negative: lost)."""

    def p(self, match_size: int) -> float:
        """Estimated chance that a drafted token from a match of this size is right; before any evidence,
        :meth:`prior` (worth two trials)."""
        prior = self.prior(match_size)
        return (self._hits.get(match_size, 0.0) + 2.0 * prior) / (self._trials.get(match_size, 0.0) + 2.0)

    @staticmethod
    def prior(match_size: int) -> float:
        """A longer n-gram match guesses better: 0.58 for 2 tokens, 0.74 for 6, 0.9 from 10 on (llama.cpp's
        ``ngram-mod`` drafts on every 24-token match). On a CPU, where any batch costs a step more than one
        token, only the long matches are worth a first draft; short ones wait for a probe to show they pay."""
        return min(0.9, 0.5 + 0.04 * max(0, match_size))

    def choose(self, available: int, match_size: int) -> int:
        """How many of ``available`` drafted tokens to verify now (0: decode one token plainly)."""
        self.seen += 1
        limit = min(available, self.n_max, self._affordable())
        if limit < self.n_min:
            return 0
        p = self.p(match_size)
        best_k, best_gain = 0, self.MARGIN
        for k in range(self.n_min, limit + 1):
            expected = (1 - p ** (k + 1)) / (1 - p) if p < 1 else k + 1.0
            gain = expected / cost_of(self.costs, k + 1)
            if gain > best_gain:
                best_k, best_gain = k, gain
        if best_k:
            return best_k
        self._since_probe += 1
        if self._since_probe >= self._probe_every:
            self._since_probe = 0
            self._probe_every = min(self._probe_every * 4, 256)
            return min(limit, self.n_min)  # the shortest draft: a wrong probe wastes the least
        return 0

    def _affordable(self) -> int:
        """The longest draft whose total failure keeps the loss within the budget."""
        allowance = self.saved + self.START_BUDGET + self.LOSS_BUDGET * self.seen
        k = 0
        while k < self.n_max and cost_of(self.costs, k + 2) - 1 <= allowance:
            k += 1
        return k

    def record(self, drafted: int, accepted: int, match_size: int = 0) -> None:
        """A verification step drafted ``drafted`` tokens of which the first ``accepted`` were right."""
        self.saved += accepted + 1 - cost_of(self.costs, drafted + 1)
        self.drafted += drafted
        self.accepted += accepted
        trials = accepted + (1 if accepted < drafted else 0)
        self._hits[match_size] = self._hits.get(match_size, 0.0) * self.DECAY + accepted
        self._trials[match_size] = self._trials.get(match_size, 0.0) * self.DECAY + trials
        if accepted * 2 >= drafted:
            self._probe_every, self._since_probe = self.PROBE_EVERY, 0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class Drafter(Protocol):
    """What the generation loop needs from a drafter: the history so far, and guesses at what follows."""

    def reset(self, tokens: Iterable[int] = ()) -> None: ...

    def extend(self, tokens: Iterable[int]) -> None: ...

    def draft(self, max_tokens: int) -> list[int]: ...

    @property
    def last_match(self) -> int:
        """A label for how the last draft was found (n-gram size); acceptance is tracked per label."""
        ...


def default_drafter(plan: SpeculativePlan) -> Drafter:
    """The n-gram drafter (llama.cpp's ngram-mod idea), longest match first: the plan's ``n_match`` caps it."""
    return NgramDrafter([k for k in (min(plan.n_match, 12), 6, 3, 2) if 0 < k <= plan.n_match] or [1])
