"""What speculative decoding promises on every CPU, and the tools that check it.

llama.cpp's batched kernels are not bit-identical to one-token evaluation on every CPU, so a verification batch
can see logits that differ in the last digits from those plain decoding sees, and a near-tie can flip: greedy
text with speculation may then differ from plain greedy text (llama.cpp's own speculative decoding behaves the
same way). What holds everywhere, and what these helpers assert instead:

- every token the engine emits is the argmax (greedy) of the logits row that verified it, plain step or
  verification-batch row, and the cache holds exactly the picked tokens, in order (nothing rejected is left);
- replayed with plain one-token decoding, every emitted token is the best there or within a near-tie of it,
  a near-tie being measured on the machine running the test (:func:`kernel_noise`);
- the same request gives the same text every time on one machine (and a seed the same samples).

:func:`recording_picks` wraps the ``TokenPicker`` the embedded engine makes for each request (the engine's own
behaviour is unchanged); :func:`assert_plain_up_to_near_ties` replays a reply with plain decoding.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clover_local.engine import embedded
from clover_local.engine.embedded import EmbeddedEngine
from clover_local.engine.sampling import LogitsView, TokenPicker
from clover_local.engine.types import GenerationRequest, GenerationStats

NEAR_TIE_FLOOR = 0.05
"""The smallest difference in logits that counts as a near-tie. Above it the limit is measured on the machine
running the test (:func:`kernel_noise`): how far batched logits stray from one-token logits differs between
CPUs and models (here: up to 0.01 on the tiny llama, 0.02 on the hybrid qwen35moe, 0.9 on Gemma 3 270M)."""
NOISE_MARGIN = 3.0
"""A near-tie is within this many times the measured noise (two logits, each off by up to the noise, plus room
for batch shapes the measurement did not try)."""
NOISE_BATCHES = (2, 4, 8, 17)
"""Batch sizes the noise is measured with: verification batches are 2 to ``n_max + 1`` (17) tokens long."""


@dataclass(frozen=True)
class Pick:
    token: int
    rank: int
    """How many tokens of its row had a higher logit (0: the argmax)."""
    n_rows: int
    """Rows of the decode it was picked from: 1 for a plain step, more for a verification batch."""


@dataclass
class PickLog:
    """Every pick of every request made while recording, one list per request."""

    requests: list[list[Pick]] = field(default_factory=list)

    @property
    def last(self) -> list[Pick]:
        return self.requests[-1]


@contextmanager
def recording_picks() -> Iterator[PickLog]:
    """Record, for every token the embedded engine picks, its rank in the logits row it was picked from."""
    log = PickLog()
    original = embedded.TokenPicker

    class RecordingPicker(TokenPicker):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            assert not self.backend, "the picks are read from the host's logits"
            self.picks: list[Pick] = []
            log.requests.append(self.picks)

        def pick(self, row: int, n_rows: int) -> int:
            token = super().pick(row, n_rows)
            logits = self._view.rows(n_rows)[row]
            self.picks.append(Pick(token, int((logits > logits[token]).sum()), n_rows))
            return token

    embedded.TokenPicker = RecordingPicker  # type: ignore[misc]
    try:
        yield log
    finally:
        embedded.TokenPicker = original  # type: ignore[misc]


def emitted(picks: list[Pick], stats: GenerationStats) -> list[int]:
    """The reply's tokens: the first ``completion_tokens`` picks (a last pick may be end-of-text, not counted)."""
    assert len(picks) >= stats.completion_tokens
    return [p.token for p in picks[: stats.completion_tokens]]


def assert_greedy_picks(engine: EmbeddedEngine, picks: list[Pick], stats: GenerationStats) -> None:
    """Every pick was its row's argmax, and the cache holds the reply's picked tokens, in order."""
    not_best = [(i, p) for i, p in enumerate(picks) if p.rank != 0]
    assert not not_best, f"tokens that were not the argmax of the row that verified them: {not_best[:5]}"
    reply_in_cache = engine.slots_state[0].kv[stats.prompt_tokens :]
    assert reply_in_cache == [p.token for p in picks[: len(reply_in_cache)]], "the cache holds other tokens"
    assert len(reply_in_cache) >= stats.completion_tokens - 1


@dataclass(frozen=True)
class _Row:
    """A logits row, summed up: its best logit, its five best tokens and their logits, and the logit of the token
    that came next in the sequence."""

    best: float
    top_ids: np.ndarray
    top: np.ndarray
    next_logit: float


def _summary(row: np.ndarray, next_token: int) -> _Row:
    top_ids = np.argpartition(row, -5)[-5:]
    return _Row(float(row.max()), top_ids, row[top_ids].copy(), float(row[next_token]))


def _one_token_rows(engine: EmbeddedEngine, seq: list[int], n_prompt: int) -> list[_Row]:
    """Plain decoding along ``seq`` from an empty cache (the prompt in one batch, then one token at a time, as a
    request without speculation runs); row ``i`` is the one that predicts ``seq[n_prompt + i]``."""
    view = LogitsView(engine._ctx, engine._n_vocab)
    engine.reset_cache()
    engine._decode(seq[:n_prompt], 0, all_logits=False)
    rows = []
    for i in range(n_prompt, len(seq)):
        rows.append(_summary(view.rows(1)[0], seq[i]))
        engine._decode([seq[i]], i, all_logits=False)
    return rows


def kernel_noise(engine: EmbeddedEngine, seq: list[int], n_prompt: int, rows: list[_Row]) -> float:
    """How far this machine's batched logits stray from its one-token logits (``rows``) along ``seq``: the largest
    difference among each row's five best tokens, evaluated in batches of each of :data:`NOISE_BATCHES`."""
    view = LogitsView(engine._ctx, engine._n_vocab)
    rest = seq[n_prompt - 1 : n_prompt - 1 + len(rows)]  # the tokens whose rows predict seq[n_prompt:]
    worst = 0.0
    for size in NOISE_BATCHES:
        engine.reset_cache()
        engine._decode(seq[: n_prompt - 1], 0, all_logits=False)
        for off in range(0, len(rest), size):
            chunk = rest[off : off + size]
            engine._decode(chunk, n_prompt - 1 + off, all_logits=True)
            batch = view.rows(len(chunk))
            for j, row in enumerate(rows[off : off + len(chunk)]):
                worst = max(worst, float(np.abs(batch[j][row.top_ids] - row.top).max()))
    return worst


def _near_tie(noise: float) -> float:
    return max(NEAR_TIE_FLOOR, NOISE_MARGIN * noise)


def assert_plain_up_to_near_ties(engine: EmbeddedEngine, prompt: list[int], reply: list[int]) -> int:
    """Replay ``reply`` after ``prompt`` with plain decoding: each token must be the best of its row or within a
    near-tie of it, the near-tie measured on this machine (:func:`kernel_noise`). A verification row taken from
    the wrong position, or a cache left holding a rejected draft, makes tokens that plain decoding puts whole
    units below its best. Returns how many were not the best (where the text may part from plain text)."""
    seq = [*prompt, *reply]
    try:
        rows = _one_token_rows(engine, seq, len(prompt))
        tol = _near_tie(kernel_noise(engine, seq, len(prompt), rows))
    finally:
        engine.reset_cache()  # the replay's cache is not the engine's record of it
    gaps = [row.best - row.next_logit for row in rows]
    worst = max(range(len(gaps)), key=gaps.__getitem__, default=None)
    assert worst is None or gaps[worst] <= tol, (
        f"token {worst} of the reply ({reply[worst]}) is {gaps[worst]:.3f} below plain decoding's best "
        f"(a near-tie on this machine is up to {tol:.3f})"
    )
    return sum(gap > 0 for gap in gaps)


def prompt_of(engine: EmbeddedEngine, request: GenerationRequest) -> list[int]:
    """The prompt's tokens, as the engine evaluates them for this request."""
    return engine._prompt_tokens(request)


def assert_same_up_to_a_near_tie(
    engine: EmbeddedEngine, prompt: list[int], a: list[Pick], b: list[Pick]
) -> None:
    """Two greedy replies to one prompt whose logits came from different batches (a cached prefix, verification
    batches): the same tokens, or parted where plain decoding sees the two tokens within a near-tie (measured on
    this machine, :func:`kernel_noise`)."""
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x.token != y.token), None)
    if first is None:
        return
    seq = [*prompt, *(p.token for p in a[: first + 1])]
    try:
        rows = _one_token_rows(engine, seq, len(prompt))
        tol = _near_tie(kernel_noise(engine, seq, len(prompt), rows))
        view = LogitsView(engine._ctx, engine._n_vocab)
        engine.reset_cache()
        engine._decode(seq[:-1], 0, all_logits=False)
        row = view.rows(1)[0]
        gap = abs(float(row[a[first].token] - row[b[first].token]))
    finally:
        engine.reset_cache()
    assert gap <= tol, (
        f"the replies part at token {first}, where plain decoding's logits differ by {gap:.3f} "
        f"(a near-tie on this machine is up to {tol:.3f})"
    )
