"""Self-speculative decoding keeps to the model: at temperature 0 every emitted token is the argmax of the logits
that verified it, and the same request gives the same text every time; with a seed, the same samples every
time. Rejected drafts are rolled back, also in the recurrent (Gated DeltaNet) state of the hybrid ``qwen35moe``
model; llama.cpp is asked for logits only at the verified positions.

Speculative text is *not* asserted to equal plain decoding's: llama.cpp's batched kernels are not bit-identical
to one-token evaluation on every CPU, so a near-tie can flip (``tests/helpers_picks.py``). Replayed with plain
decoding, every emitted token must be the best or within a near-tie of it.

Random tiny models rarely repeat themselves, so most tests use an *oracle* drafter that guesses the known
plain-decoding continuation with a deliberate mistake in every draft: every step then accepts a part of its
draft and rolls the rest back, the hardest case for the cache.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from clover_local.engine.embedded import EmbeddedEngine
from clover_local.engine.loader import load_engine
from clover_local.engine.types import GenerationRequest, TextDelta
from clover_local.plan.types import SpeculativePlan
from clover_local.testing.models import TINY_KINDS, gemma_path, tiny_model
from clover_local.testing.settings import engine_settings
from tests.helpers_engine import generate_text
from tests.helpers_picks import (
    assert_greedy_picks,
    assert_plain_up_to_near_ties,
    emitted,
    prompt_of,
    recording_picks,
)

pytestmark = pytest.mark.slow

SPEC = SpeculativePlan(enabled=True, n_min=1, n_max=8)
NO_SPEC_8 = SpeculativePlan(enabled=False, n_min=1, n_max=8)


class OracleDrafter:
    """Drafts the reference continuation, with the token at ``wrong_at`` of each draft replaced."""

    def __init__(self, reference: list[int], wrong_at: int = 3) -> None:
        self.reference = reference
        self.wrong_at = wrong_at
        self.tokens: list[int] = []
        self.last_match = 12  # a long match: the controller trusts it enough to draft from the first step

    def reset(self, tokens: Iterable[int] = ()) -> None:
        self.tokens = list(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        self.tokens.extend(tokens)

    def draft(self, max_tokens: int) -> list[int]:
        n = len(self.tokens)
        guess = self.reference[n : n + max_tokens]
        if len(guess) > self.wrong_at:
            guess[self.wrong_at] = (guess[self.wrong_at] + 1) % 250 + 3
        return guess


def _plain_reference(engine: EmbeddedEngine, request: GenerationRequest) -> tuple[str, list[int]]:
    """Plain decoding's text and exact tokens (prompt and reply, as left in the cache)."""
    text, stats = generate_text(engine, replace(request, speculative=False))
    assert stats.draft_acceptance is None
    return text, list(engine.slots_state[0].kv)


@pytest.fixture(scope="module", params=TINY_KINDS)
def tiny_engine(request: pytest.FixtureRequest) -> Iterator[EmbeddedEngine]:
    result = load_engine(
        tiny_model(request.param),
        engine_settings(tiny_model(request.param), ctx=512, speculative=SPEC),
        chat_template="completion",
        speculative=SPEC,
    )
    yield result.engine
    result.engine.close()


PROMPT = "the cat sat on the mat and then the dog"


def test_greedy_speculation_keeps_to_the_argmax_through_partial_rollbacks(
    tiny_engine: EmbeddedEngine,
) -> None:
    request = GenerationRequest(prompt=PROMPT, max_tokens=64, temperature=0)
    _, reference = _plain_reference(tiny_engine, request)
    tiny_engine.drafter_factory = lambda plan: OracleDrafter(reference)
    runs = []
    try:
        with recording_picks() as picks:
            for _ in range(2):
                tiny_engine.reset_cache()
                text, stats = generate_text(tiny_engine, replace(request, speculative=True))
                assert_greedy_picks(tiny_engine, picks.last, stats)
                runs.append((text, stats, emitted(picks.last, stats)))
    finally:
        tiny_engine.drafter_factory = _default_factory()
    (spec, stats, tokens), (again, _, _) = runs
    assert spec == again, "the same request, the same text"
    assert any(p.n_rows > 1 for p in picks.last), "tokens were verified in batches"
    assert stats.accepted_tokens > 0
    assert stats.accepted_tokens < stats.drafted_tokens  # some drafts were rolled back
    assert stats.completion_tokens == 64
    prompt = prompt_of(tiny_engine, request)
    assert_plain_up_to_near_ties(tiny_engine, prompt, tokens)
    # On the hybrid model the rejected tails were rolled back from a copy of the recurrent state.
    assert (tiny_engine.drafts_rolled_back > 0) is tiny_engine.recurrent
    assert not any("switched off" in n.text for n in tiny_engine.notices)


def test_seeded_sampling_with_speculation_is_reproducible(tiny_engine: EmbeddedEngine) -> None:
    req = GenerationRequest(
        prompt=PROMPT, max_tokens=48, temperature=0.9, top_k=40, top_p=0.95, seed=1234, cache_prompt=False
    )  # each from scratch: the same computation every time
    plain, reference = _plain_reference(tiny_engine, req)
    again, _ = _plain_reference(tiny_engine, req)
    assert plain == again  # the seed makes sampling reproducible
    tiny_engine.drafter_factory = lambda plan: OracleDrafter(reference)
    try:
        with recording_picks() as picks:
            spec, stats = generate_text(tiny_engine, replace(req, speculative=True))
            spec_again, _ = generate_text(tiny_engine, replace(req, speculative=True))
    finally:
        tiny_engine.drafter_factory = _default_factory()
    assert 0 < stats.accepted_tokens < stats.drafted_tokens
    assert spec == spec_again  # deterministic with speculation too
    assert all(p.rank < 40 for run in picks.requests for p in run), "every sample is within top-k of its row"


def _default_factory() -> Any:
    from clover_local.engine.drafter import default_drafter

    return default_drafter


def test_ngram_drafts_from_a_repeated_prompt_are_accepted_and_keep_to_the_argmax() -> None:
    result = load_engine(
        tiny_model("llama"), engine_settings(tiny_model("llama"), ctx=1024), chat_template="completion"
    )
    engine = result.engine
    prompt = "the cat sat on the mat and the dog sat on the log " * 6
    request = GenerationRequest(prompt=prompt, max_tokens=60, temperature=0, speculative=True)
    try:
        with recording_picks() as picks:
            spec, stats = generate_text(engine, replace(request, cache_prompt=False))
            assert_greedy_picks(engine, picks.last, stats)
            again, _ = generate_text(engine, replace(request, cache_prompt=False))
        assert_plain_up_to_near_ties(engine, prompt_of(engine, request), emitted(picks.requests[0], stats))
    finally:
        engine.close()
    assert spec == again
    assert stats.accepted_tokens > 0


def test_verification_asks_llama_cpp_for_logits_only_at_drafted_positions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from llama_cpp import llama_cpp as C

    result = load_engine(
        tiny_model("llama"),
        engine_settings(tiny_model("llama"), ctx=1024, n_batch=64),
        chat_template="completion",
    )
    engine = result.engine
    calls: list[tuple[int, int]] = []
    real_decode = C.llama_decode

    def spy(ctx: Any, batch: Any) -> int:
        n = batch.n_tokens
        calls.append((n, sum(1 for i in range(n) if batch.logits[i])))
        return int(real_decode(ctx, batch))

    try:
        first, _ = generate_text(engine, GenerationRequest(prompt=PROMPT, max_tokens=60, temperature=0))
        prompt = (PROMPT + first + "\n") * 3 + PROMPT  # longer than n_batch: prefilled in chunks
        assert engine.count_tokens(prompt) > 64
        monkeypatch.setattr(C, "llama_decode", spy)
        _, stats = generate_text(
            engine, GenerationRequest(prompt=prompt, max_tokens=60, temperature=0, speculative=True)
        )
    finally:
        engine.close()
    prefill = [c for c in calls if c[0] == 64]
    assert prefill and all(outputs == 0 for _, outputs in prefill)  # full chunks: no logits at all
    assert max(outputs for _, outputs in calls) <= engine.speculative.n_max + 1
    assert sum(outputs for _, outputs in calls) <= stats.completion_tokens + stats.drafted_tokens + 1
    assert stats.drafted_tokens > 0


def test_cancel_stops_within_a_token_even_mid_verification(tiny_engine: EmbeddedEngine) -> None:
    _, reference = _plain_reference(
        tiny_engine, GenerationRequest(prompt=PROMPT, max_tokens=64, temperature=0)
    )
    tiny_engine.drafter_factory = lambda plan: OracleDrafter(reference, wrong_at=99)
    cancel = threading.Event()
    seen = 0
    stats = None
    try:
        for event in tiny_engine.generate(
            GenerationRequest(prompt=PROMPT, max_tokens=64, temperature=0, speculative=True), cancel
        ):
            if isinstance(event, TextDelta):
                seen += 1
                if seen == 5:
                    cancel.set()
            else:
                stats = event.stats
    finally:
        tiny_engine.drafter_factory = _default_factory()
    assert stats is not None and stats.finish_reason == "cancelled"
    assert stats.completion_tokens <= 6
    assert stats.accepted_tokens > 0


def test_hybrid_model_whose_state_cannot_be_copied_recovers_and_stops_speculating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without a copy of the recurrent state to roll back to (llama.cpp could not write one), the first rejected
    draft cannot be cut back: the engine evaluates the kept tokens again, turns drafting off and says so."""
    from clover_local.engine.checkpoints import DraftRollback

    monkeypatch.setattr(DraftRollback, "save", lambda self: False)
    result = load_engine(
        tiny_model("qwen35moe"),
        engine_settings(tiny_model("qwen35moe"), ctx=512, speculative=SPEC),
        chat_template="completion",
        speculative=SPEC,
    )
    engine = result.engine
    request = GenerationRequest(prompt=PROMPT, max_tokens=40, temperature=0)
    try:
        _, reference = _plain_reference(engine, request)
        engine.drafter_factory = lambda plan: OracleDrafter(reference)
        with recording_picks() as picks:
            _, stats = generate_text(engine, replace(request, speculative=True))
        assert_greedy_picks(engine, picks.last, stats)  # the rebuilt cache holds exactly the kept tokens
        assert_plain_up_to_near_ties(engine, prompt_of(engine, request), emitted(picks.last, stats))
    finally:
        engine.close()
    assert engine.drafts_rolled_back == 0
    assert any("switched off" in n.text and n.code == "speculation-off" for n in engine.notices)


@pytest.fixture(scope="module")
def gemma() -> Iterator[EmbeddedEngine]:
    result = load_engine(gemma_path(), engine_settings(gemma_path(), ctx=2048), chat_template="completion")
    yield result.engine
    result.engine.close()


CODE = '''def area(width, height):
    """Area of a rectangle."""
    return width * height


def perimeter(width, height):
    """Perimeter of a rectangle."""
    return 2 * (width + height)
'''


def test_gemma_greedy_speculation_copies_the_file_and_keeps_to_the_argmax(gemma: EmbeddedEngine) -> None:
    prompt = f"Original file:\n```python\n{CODE}```\n\nThe same file after renaming width to w:\n```python\n"
    request = GenerationRequest(
        prompt=prompt, max_tokens=48, temperature=0, speculative=True, cache_prompt=False
    )
    with recording_picks() as picks:
        spec, stats = generate_text(gemma, request)
        assert_greedy_picks(gemma, picks.last, stats)
        again, _ = generate_text(gemma, request)
    assert spec == again
    assert spec.startswith("def area(")  # it copies the file
    assert stats.draft_acceptance is not None and stats.draft_acceptance > 0.5
    assert any(p.n_rows > 1 for p in picks.requests[0])
    assert_plain_up_to_near_ties(gemma, prompt_of(gemma, request), emitted(picks.requests[0], stats))
