"""The embedded engine's MTP drafting (``engine.mtp``, llama.cpp's draft-mtp mirrored over ctypes) against
llama-server's ``--spec-type draft-mtp`` on the tiny qwen35moe with an MTP head: at temperature 0, the same
prompt and the same plan, both write the same text and draft and accept the same number of tokens per reply.

The llama-server half is skipped without a built binary (CI builds one first)."""

from __future__ import annotations

from pathlib import Path

import pytest

from clover_local.engine.loader import load_engine
from clover_local.engine.types import GenerationRequest, GenerationStats
from clover_local.gguf.header import read_local_header
from clover_local.llamacpp.binary import ServerBinary
from clover_local.llamacpp.server import plan_server_argv, start_llama_server
from clover_local.llamacpp.server_engine import LlamaServerEngine
from clover_local.plan.llama_args import llama_cpp_kwargs
from clover_local.plan.types import Plan
from clover_local.presets import SamplingDefaults
from clover_local.testing.models import tiny_mtp_model
from tests.helpers_engine import generate_text
from tests.helpers_picks import (
    assert_greedy_picks,
    assert_plain_up_to_near_ties,
    emitted,
    prompt_of,
    recording_picks,
)
from tests.helpers_serve import llama_server_path
from tests.test_speculation_server import mtp_plan

GREEDY = SamplingDefaults(temperature=0.0, top_p=1.0, top_k=0, min_p=0.0, repeat_penalty=1.0)
PROMPTS = (
    "The history of the bicycle begins",
    "def area(width, height):\n    return width * height\n\ndef area(width, height):\n",
)
MAX_TOKENS = 40


def embedded_replies(plan: Plan, *, check_picks: bool = False) -> list[tuple[str, GenerationStats]]:
    """Each prompt's greedy reply from an empty cache. ``check_picks``: every emitted token was the argmax of the
    row that verified it, and plain decoding agrees up to near-ties (``tests/helpers_picks.py``)."""
    assert plan.model_path
    result = load_engine(
        plan.model_path,
        llama_cpp_kwargs(plan),
        chat_template="completion",
        sampling=GREEDY,
        speculative=plan.speculative,
    )
    engine = result.engine
    out = []
    try:
        for prompt in PROMPTS:
            engine.reset_cache()
            request = GenerationRequest(prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0)
            with recording_picks() as picks:
                out.append(generate_text(engine, request))
            if check_picks:
                stats = out[-1][1]
                assert_greedy_picks(engine, picks.last, stats)
                reply = emitted(picks.last, stats)
                assert_plain_up_to_near_ties(engine, prompt_of(engine, request), reply)
    finally:
        engine.close()
    return out


@pytest.mark.parametrize("where", ["embedded", "sidecar"])
def test_embedded_engine_drafts_with_the_mtp_head(where: str) -> None:
    model, _ = tiny_mtp_model(where)  # type: ignore[arg-type]
    plan = mtp_plan(model)
    assert plan.speculative.mode == "mtp"
    replies = embedded_replies(plan, check_picks=True)
    for _, stats in replies:
        assert stats.completion_tokens == MAX_TOKENS
        assert stats.drafted_tokens > 0 and 0 <= stats.accepted_tokens <= stats.drafted_tokens
    # Every token was the argmax of the row that verified it (checked above), and the same requests give the
    # same text again. Not asserted: equality with plain decoding, which a near-tie can break on some CPUs.
    assert [t for t, _ in embedded_replies(plan)] == [t for t, _ in replies]


@pytest.mark.slow
@pytest.mark.parametrize("where", ["embedded", "sidecar"])
def test_embedded_mtp_matches_llama_server_draft_mtp(where: str) -> None:
    binary = ServerBinary(llama_server_path(), "test")
    model, _ = tiny_mtp_model(where)  # type: ignore[arg-type]
    plan = mtp_plan(model)
    ours = embedded_replies(plan)
    theirs = []
    for prompt in PROMPTS:  # a fresh server per reply: nothing carried over from the previous one
        process = start_llama_server(plan_server_argv(plan), binary=binary)
        try:
            engine = LlamaServerEngine(process, model_name="tiny", sampling=GREEDY)
            theirs.append(
                generate_text(
                    engine, GenerationRequest(prompt=prompt, max_tokens=MAX_TOKENS, temperature=0.0)
                )
            )
        finally:
            process.stop()
    table = [
        (o[1].drafted_tokens, o[1].accepted_tokens, t[1].drafted_tokens, t[1].accepted_tokens)
        for o, t in zip(ours, theirs, strict=True)
    ]
    print("\nembedded drafted/accepted vs llama-server drafted/accepted per reply:", table)
    for (text_o, stats_o), (text_t, stats_t) in zip(ours, theirs, strict=True):
        assert text_o == text_t
        assert (stats_o.drafted_tokens, stats_o.accepted_tokens) == (
            stats_t.drafted_tokens,
            stats_t.accepted_tokens,
        )
    assert sum(s.drafted_tokens for _, s in ours) > 0


def test_mtp_head_is_refused_on_a_model_without_one(tmp_path: Path) -> None:
    from dataclasses import replace

    from clover_local.errors import EngineError
    from clover_local.testing.models import tiny_model

    model, _ = tiny_mtp_model("embedded")
    plan = mtp_plan(model)
    plain_model = tiny_model("qwen35moe")
    forced = replace(plan, model_path=str(plain_model))
    with pytest.raises(EngineError) as err:
        load_engine(
            str(plain_model),
            llama_cpp_kwargs(forced),
            chat_template="completion",
            sampling=GREEDY,
            speculative=forced.speculative,
        )
    assert "no MTP head" in err.value.what


@pytest.mark.parametrize("where", ["embedded", "sidecar"])
def test_draft_memory_matches_llama_cpp_load_log(where: str) -> None:
    """What the plan puts aside for the draft is what llama.cpp allocates: the head's weights, its one-layer KV
    cache (exact) and the draft context's compute buffer (within 2%), read from the load log."""
    import re

    from clover_local.plan import memory

    model, _ = tiny_mtp_model(where)  # type: ignore[arg-type]
    plan = mtp_plan(model, ctx=4096)
    (draft,) = plan.speculative.draft_memory  # CPU plan: everything in RAM
    result = load_engine(
        str(model),
        llama_cpp_kwargs(plan),
        chat_template="completion",
        sampling=GREEDY,
        speculative=plan.speculative,
    )
    result.engine.close()
    log = "\n".join(result.load_log)
    weights = [float(m) * memory.MIB for m in re.findall(r"model buffer size =\s+([\d.]+) MiB", log)]
    kv = [float(m) * memory.MIB for m in re.findall(r"llama_kv_cache: size =\s+([\d.]+) MiB", log)]
    compute = [float(m) * memory.MIB for m in re.findall(r"compute buffer size =\s+([\d.]+) MiB", log)]
    assert kv[-1] == draft.kv_cache_bytes  # the draft context is created last
    out = memory.output_buffer_bytes(read_local_header(model).architecture, 1)
    planned_compute = draft.compute_bytes - out - read_local_header(model).architecture.n_embd * 4
    assert abs(compute[-1] - planned_compute) <= 0.02 * planned_compute
    trunk = plan.memory.ram.weights_bytes - draft.weights_bytes
    if where == "sidecar":  # a second model: its own buffer
        assert abs(weights[-1] - draft.weights_bytes) <= 0.01 * memory.MIB
    else:  # the head is loaded with the trunk (load_mtp)
        assert abs(weights[0] - (trunk + draft.weights_bytes)) <= 0.01 * memory.MIB
