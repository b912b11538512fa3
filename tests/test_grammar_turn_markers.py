"""A forced call or a JSON schema ends where its grammar ends, never at a turn marker inside a string.

The soak's one embedded miss (docs/reliability.md): a ``tool_choice: required`` reply ended inside the call's
string, ``{"city": "New York, NY}}``. SmolLM2's ``<|im_start|>`` is one token the vocabulary does not mark as an
end, so llama.cpp's grammar reads it as its text, which a JSON string admits; the engine ends a reply at every
turn marker. The grammar gate now allows such a token only where the grammar allows the end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest


@pytest.fixture(scope="module")
def vocab(smollm2_path: Path):  # type: ignore[no-untyped-def]
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(smollm2_path), vocab_only=True, verbose=False)
    yield llm
    llm.close()


def _token(llm, text: str) -> int:  # type: ignore[no-untyped-def]
    (tok,) = llm.tokenize(text.encode(), add_bos=False, special=True)
    return int(tok)


def test_a_turn_marker_inside_a_string_is_refused_until_the_grammar_may_end(vocab) -> None:  # type: ignore[no-untyped-def]
    from llama_cpp import llama_cpp as C

    from clover_local.engine.sampling import GrammarGate

    v = C.llama_model_get_vocab(vocab.model)
    start, quote = _token(vocab, "<|im_start|>"), _token(vocab, '"')
    assert not C.llama_vocab_is_eog(v, start)  # the vocabulary does not say it ends anything
    gbnf = 'root ::= "\\"" [^"]* "\\""'

    plain = GrammarGate(v, vocab.n_vocab(), gbnf)
    plain.accept(quote)
    assert plain.allows(start), "llama.cpp's grammar alone reads the marker as text inside a string"
    plain.close()

    gate = GrammarGate(v, vocab.n_vocab(), gbnf, ends=(start,))
    gate.accept(quote)
    assert not gate.allows(start)
    logits = np.zeros(vocab.n_vocab(), dtype=np.float32)
    logits[start] = 100.0  # the model's favourite
    gate.masked(logits)
    assert gate.best_allowed(logits) != start
    gate.accept(quote)  # the string closes: the grammar may end, and so may the marker
    assert gate.allows(start)
    gate.accept(start)  # read as the end it stands for, not as text past the end
    gate.close()


@pytest.mark.slow
def test_the_engine_hands_its_own_end_markers_to_the_grammar(smollm2_path: Path) -> None:
    """The embedded engine's one-token turn markers that the vocabulary does not mark as ends are the gate's
    ``ends``, and a request under a grammar has no turn-marker stop strings (the grammar ends it)."""
    from clover_local.engine.embedded import EmbeddedEngine
    from clover_local.engine.loader import load_engine
    from clover_local.engine.types import ChatMessage, GenerationRequest, ToolCallMade, ToolSpec
    from clover_local.testing.settings import engine_settings

    engine = load_engine(smollm2_path, engine_settings(smollm2_path, ctx=1024)).engine
    assert isinstance(engine, EmbeddedEngine)
    try:
        start = engine.tokenize("<|im_start|>", add_special=False, parse_special=True)
        assert engine._marker_ends == tuple(start)
        tool = ToolSpec(
            "get_weather",
            "The weather.",
            {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        )
        request = GenerationRequest(
            messages=(ChatMessage("user", "Weather in Paris?"),),
            tools=(tool,),
            tool_choice="required",
            max_tokens=64,
        )
        events = list(engine.generate(request))
        calls = [e for e in events if isinstance(e, ToolCallMade)]
        assert len(calls) == 1 and calls[0].call.name == "get_weather"
    finally:
        engine.close()
