"""A forced call or a JSON schema ends where its grammar ends, never at a turn marker inside a string.

The soak's one embedded miss (docs/reliability.md): a ``tool_choice: required`` reply ended inside the call's
string, ``{"city": "New York, NY}}``. SmolLM2's ``<|im_start|>`` is one token the vocabulary does not mark as an
end, so llama.cpp's grammar reads it as its text, which a JSON string admits; the engine ends a reply at every
turn marker. The grammar gate now allows such a token only where the grammar allows the end."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers_runner import launch_request, open_supervised  # at import: before the user folders move


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


# -- the llama-server route: the same fault, the same answer ---------------------------------------------------


def test_the_completion_route_keeps_opening_markers_out_of_a_grammars_stops() -> None:
    """Under a grammar, a marker that opens a turn is no stop string and its token is barred, and the call's end
    is no stop string either (the soak's ``"Paris, France}}`` was cut at ``</tool_call>`` written inside the
    string); a marker that closes a turn stays one (llama-server writes it as text after the JSON:
    ``}<|im_end|>``). Without a grammar, every marker and the call's end stop the reply as before."""
    from clover_local.engine.toolcalls import CALL_END
    from clover_local.engine.types import ChatMessage, GenerationRequest, ToolSpec
    from clover_local.llamacpp.server_tools import completion_payload

    markers = ("<|im_start|>", "<|im_end|>")
    tool = ToolSpec("f", "", {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]})
    forced = GenerationRequest(messages=(ChatMessage("user", "x"),), tools=(tool,), tool_choice="required")
    under = completion_payload(forced, "p", 'root ::= "x"', markers, (1,))
    assert "<|im_start|>" not in under["stop"] and "<|im_end|>" in under["stop"]
    assert CALL_END not in under["stop"]  # a string may hold it; the grammar ends after the call
    assert under["logit_bias"] == [[1, False]]
    schema = completion_payload(
        GenerationRequest(prompt="p", json_schema={"type": "string"}), "p", None, markers, (1,)
    )
    assert "<|im_start|>" not in schema["stop"] and schema["logit_bias"] == [[1, False]]
    free = GenerationRequest(messages=(ChatMessage("user", "x"),), tools=(tool,))  # tool_choice auto
    plain = completion_payload(free, "p", None, markers, (1,))
    assert set(markers) <= set(plain["stop"]) and CALL_END in plain["stop"] and "logit_bias" not in plain


@pytest.mark.slow
def test_llama_server_finishes_a_forced_call_the_model_would_cut_with_an_opening_marker(
    monkeypatch: pytest.MonkeyPatch, smollm2_path: Path, tmp_path: Path
) -> None:
    """The soak's miss on the llama-server route, made certain: the model is pushed toward ``<|im_start|>``
    (logit bias +30) while it writes a forced call. Barred, the call is finished and valid; as a stop string it
    cut the call inside its string."""
    import json

    from clover_local.engine.types import ChatMessage, GenerationRequest, ToolCallMade, ToolSpec
    from clover_local.llamacpp import server_engine

    engine = open_supervised(launch_request("pinned", monkeypatch, smollm2_path, tmp_path))
    try:
        (start,) = engine._opening_tokens()  # SmolLM2's ChatML: <|im_start|> is one token
        real = server_engine.completion_payload

        def pushed(*args: object, **kwargs: object) -> dict[str, object]:
            out = real(*args, **kwargs)  # type: ignore[arg-type]
            out["logit_bias"] = [*out.get("logit_bias", []), [start, 30.0]]  # type: ignore[list-item]
            return out

        monkeypatch.setattr(server_engine, "completion_payload", pushed)
        city = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
        request = GenerationRequest(
            messages=(ChatMessage("user", "What is the weather in London?"),),
            tools=(ToolSpec("get_weather", "Weather in a city", city),),
            tool_choice="required",
            max_tokens=64,
            temperature=0.0,
        )
        calls = [e.call for e in engine.generate(request) if isinstance(e, ToolCallMade)]
        assert calls, "the forced call was cut before it was made"
        arguments = json.loads(calls[0].arguments)
        assert isinstance(arguments["city"], str) and "<|im_start|>" not in arguments["city"]
    finally:
        engine.close()
