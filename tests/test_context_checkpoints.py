"""Context checkpoints on a hybrid (Gated DeltaNet + attention) model: a growing conversation re-evaluates only
its new tokens, a history that ends its last turn differently resumes a few tokens before, the count is
bounded, each slot keeps its own, and the plan holds their memory for both engines."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

import pytest
from helpers_engine import generate_text

from clover_local.detect import parse_simulate
from clover_local.engine.checkpoints import TAIL_TOKENS
from clover_local.engine.embedded import EmbeddedEngine
from clover_local.engine.loader import load_engine
from clover_local.engine.types import ChatMessage, GenerationRequest, GenerationStats
from clover_local.gguf.model import describe_from_preset
from clover_local.plan import memory
from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
from clover_local.plan.planner import make_plan
from clover_local.plan.types import SpeculativePlan, Wishes
from clover_local.presets import load_preset
from clover_local.testing.models import tiny_model
from clover_local.testing.settings import engine_settings

SYSTEM = "You are a coding agent. Tools: read_file(path), write_file(path, text), run(command)."

OFF = SpeculativePlan(enabled=False)


def _engine(checkpoints: int) -> EmbeddedEngine:
    engine = load_engine(
        tiny_model("qwen35moe"),
        engine_settings(tiny_model("qwen35moe"), ctx=2048, speculative=OFF, ctx_checkpoints=checkpoints),
        chat_template="gguf",
        speculative=OFF,  # no rollback snapshots: only checkpoints can resume
    ).engine
    assert isinstance(engine, EmbeddedEngine) and engine.recurrent
    return engine


@pytest.fixture
def hybrid() -> Iterator[EmbeddedEngine]:
    engine = _engine(memory.CTX_CHECKPOINTS)
    yield engine
    engine.close()


def _messages_of_turn(n: int) -> tuple[ChatMessage, ...]:
    """An agent session's request on turn ``n``: the whole history again, with the assistant turns as the client
    kept them (not the engine's own replies), and a new tool result last."""
    messages = [ChatMessage("system", SYSTEM)]
    for turn in range(n):
        if turn:
            messages.append(ChatMessage("assistant", f"I will call read_file on file_{turn}.py next."))
        messages.append(
            ChatMessage("user", f"Tool result {turn}: file_{turn}.py holds def f{turn}(): return {turn}")
        )
    return tuple(messages)


def _agent_turns(engine: EmbeddedEngine, turns: int) -> list[tuple[str, GenerationStats]]:
    return [
        generate_text(
            engine, GenerationRequest(messages=_messages_of_turn(n), max_tokens=16, temperature=0.0)
        )
        for n in range(1, turns + 1)
    ]


def test_a_growing_conversation_evaluates_only_its_new_tokens(hybrid: EmbeddedEngine) -> None:
    turns = _agent_turns(hybrid, 4)
    for (_, before), (_, after) in pairwise(turns):
        assert after.cached_tokens == before.prompt_tokens  # every token of the previous prompt is reused
    assert hybrid.checkpoints[0].restored == 3
    text4, stats4 = turns[3]
    hybrid.reset_cache()
    request = GenerationRequest(messages=_messages_of_turn(4), max_tokens=16, temperature=0.0)
    fresh, fresh_stats = generate_text(hybrid, request)
    assert fresh_stats.cached_tokens == 0 and fresh_stats.prompt_tokens == stats4.prompt_tokens
    assert fresh == text4  # resuming from a checkpoint gives the reply a fresh evaluation gives


def test_without_checkpoints_the_whole_prompt_is_evaluated_again() -> None:
    engine = _engine(0)
    try:
        turns = _agent_turns(engine, 2)
    finally:
        engine.close()
    assert turns[1][1].cached_tokens == 0  # what issue 28 measured: the recurrent state cannot be cut back


def test_a_history_that_ends_differently_resumes_a_few_tokens_before_its_end(hybrid: EmbeddedEngine) -> None:
    first = "The agent read the file and found the letter q"
    second = "The agent read the file and found the letter r, then wrote a test for it"
    t1, t2 = hybrid.tokenize(first), hybrid.tokenize(second)
    common = next(i for i, (a, b) in enumerate(zip(t1, t2, strict=False)) if a != b)
    assert len(t1) - TAIL_TOKENS <= common < len(t1)  # the prompts part within the last few tokens
    generate_text(hybrid, GenerationRequest(prompt=first, max_tokens=4, temperature=0.0))
    _, stats = generate_text(hybrid, GenerationRequest(prompt=second, max_tokens=4, temperature=0.0))
    assert stats.cached_tokens == len(t1) - TAIL_TOKENS


def test_checkpoints_are_bounded_in_count_and_memory() -> None:
    from llama_cpp import llama_cpp as C

    engine = _engine(3)
    try:
        _agent_turns(engine, 5)
        held, positions = engine.checkpoints[0].held_bytes, engine.checkpoints[0].positions
        state = int(C.llama_state_seq_get_size_ext(engine._ctx, 0, C.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY))
    finally:
        engine.close()
    assert len(positions) == 3 and held == 3 * state  # each one recurrent state, never the attention cache
    assert positions == tuple(sorted(positions))  # the oldest went first


def test_the_plan_holds_the_checkpoints_memory_for_both_engines() -> None:
    preset = load_preset("clover-35b-a3b")
    machine = parse_simulate("ram=64G,cpu=8")
    n = memory.CTX_CHECKPOINTS
    for engine in ("embedded", "llama-server"):
        plan = make_plan(machine, preset, None, Wishes(engine=engine))
        assert plan.ctx_checkpoints == n and llama_cpp_kwargs(plan)["ctx_checkpoints"] == n
        argv = llama_server_args(plan)
        assert argv[argv.index("--ctx-checkpoints") + 1] == str(n)
        state = describe_from_preset(preset, plan.quant).architecture.recurrent_state_bytes
        # per slot: each slot's recurrent state n times (llama-server's would hold sliding-window cells too)
        assert plan.memory.ram.checkpoint_bytes >= n * plan.parallel * state > 0
        if engine == "embedded":
            assert plan.memory.ram.checkpoint_bytes == n * plan.parallel * state
        assert any("context checkpoints" in r.text.lower() for r in plan.reasons)
    attention = make_plan(machine, load_preset("gemma3-270m"), None, Wishes())
    assert attention.ctx_checkpoints == 0 and attention.memory.ram.checkpoint_bytes == 0
    assert "--ctx-checkpoints" not in llama_server_args(attention)


def _agent_messages(agent: str, n: int) -> tuple[ChatMessage, ...]:
    """Agent ``agent``'s request on turn ``n``: its system prompt differs from the first word, so no other agent's
    slot holds a tenth of it (``engine.sequence.SIMILARITY``) and each turn goes back to the agent's own slot."""
    system = ChatMessage("system", f"{agent.title()} reviews the {agent} module. {SYSTEM}")
    return (system, *_messages_of_turn(n)[1:])


def test_each_slot_keeps_its_own_checkpoints() -> None:
    engine = load_engine(
        tiny_model("qwen35moe"),
        engine_settings(tiny_model("qwen35moe"), ctx=2048, parallel=2, speculative=OFF, ctx_checkpoints=8),
        chat_template="gguf",
        speculative=OFF,
    ).engine
    assert isinstance(engine, EmbeddedEngine) and engine.slots == 2
    try:
        previous: dict[str, int] = {}
        for n in range(1, 4):
            for agent in ("alpha", "omega"):  # two agent sessions, turns interleaved over the two slots
                request = GenerationRequest(messages=_agent_messages(agent, n), max_tokens=8, temperature=0.0)
                _, stats = generate_text(engine, request)
                if agent in previous:
                    assert stats.cached_tokens == previous[agent]  # resumed from its own slot's checkpoint
                previous[agent] = stats.prompt_tokens
        restored = [c.restored for c in engine.checkpoints]
        held = [len(c.positions) for c in engine.checkpoints]
    finally:
        engine.close()
    assert restored == [2, 2] and all(0 < h <= 8 for h in held)
