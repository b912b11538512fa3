"""The embedded engine with several slots (``engine.scheduler``): requests generate at once in one batch, each
reply holding only its own tokens; a short request that arrives while a long one runs joins the batch and ends
first; a cancelled one frees its slot for the next and leaves the others intact; an agent's next turn goes back
to the slot holding its prefix; a request past its slots is refused (the scheduler keeps no queue: ``serve``'s
queue owns waiting).

Batched evaluation is not bit-identical to one-token evaluation (more so on AVX-512), so nothing here compares a
batched reply with a lone one: isolation is each reply continuing its own prompt (the real Gemma 3 270M repeats
a word it was given: ``zebra zebra ...``) and never another's. Ordering is proved by events (the long reply is
still cancellable, so still generating, once the short one has ended), never by time.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers_engine import generate_text

from clover_local.engine.embedded import EmbeddedEngine
from clover_local.engine.scheduler import Job, SlotScheduler
from clover_local.engine.sequence import Slot
from clover_local.engine.types import (
    END,
    ChatMessage,
    Finished,
    GenerationEvent,
    GenerationRequest,
    GenerationStats,
    TextDelta,
    ToolCallMade,
    ToolSpec,
)
from clover_local.errors import EngineError
from clover_local.launch import LaunchRequest, decide_launch, open_launch

WORDS = ("zebra", "apple", "cobalt", "orange")
"""Words Gemma 3 270M goes on repeating when a prompt repeats them (greedy)."""
SLOTS = 3
CTX = 1024


@pytest.fixture(scope="module")
def engine(gemma_path: Path) -> Iterator[EmbeddedEngine]:
    request = LaunchRequest(
        preset="gemma3-270m",
        model=str(gemma_path),
        ctx=CTX,
        parallel=SLOTS,
        engine="embedded",
        describe=False,
    )
    launch = decide_launch(request)
    assert launch.plan.parallel == SLOTS and f"-np {SLOTS}" in launch.command
    opened = open_launch(launch)
    assert isinstance(opened.engine, EmbeddedEngine)
    yield opened.engine
    opened.engine.close()


def repeat(word: str, max_tokens: int = 24) -> GenerationRequest:
    return GenerationRequest(
        prompt=(word + " ") * 16, max_tokens=max_tokens, temperature=0.0, speculative=False
    )


def only_its_own_word(text: str, word: str) -> bool:
    lowered = text.lower()
    return word in lowered and not any(other in lowered for other in WORDS if other != word)


class Reader:
    """A generation read on its own thread: its text so far, its stats once finished, its cancel."""

    def __init__(self, engine: EmbeddedEngine, request: GenerationRequest) -> None:
        self.cancel = threading.Event()
        self.first = threading.Event()
        self.parts: list[str] = []
        self.stats: GenerationStats | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._read, args=(engine, request), daemon=True)
        self._thread.start()

    def _read(self, engine: EmbeddedEngine, request: GenerationRequest) -> None:
        try:
            for event in engine.generate(request, self.cancel):
                if isinstance(event, TextDelta):
                    self.parts.append(event.text)
                    self.first.set()
                elif isinstance(event, Finished):
                    self.stats = event.stats
        except BaseException as exc:  # handed to the test
            self.error = exc
        finally:
            self.first.set()

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def join(self) -> GenerationStats:
        self._thread.join(timeout=240)
        assert self.error is None, self.error
        assert self.stats is not None, "the generation ended without a result"
        return self.stats


def test_the_engine_has_its_slots_each_with_its_context(engine: EmbeddedEngine) -> None:
    assert engine.slots == SLOTS
    assert engine.n_ctx == CTX  # each slot's own share of -c


def test_requests_at_once_all_complete_each_with_only_its_own_tokens(engine: EmbeddedEngine) -> None:
    readers = [Reader(engine, repeat(word)) for word in WORDS[:SLOTS]]
    for reader, word in zip(readers, WORDS, strict=False):
        stats = reader.join()
        assert stats.finish_reason == "length" and stats.completion_tokens == 24
        assert only_its_own_word(reader.text, word), (word, reader.text)


class _HeldStart:
    """An engine with one slot (what the scheduler uses of ``EmbeddedEngine``) whose sequences start only once
    the test lets them; each then ends at once."""

    n_ctx = 64

    def __init__(self) -> None:
        self.slots_state = [Slot(0)]
        self.go = threading.Event()

    def open_sequence(self, request: GenerationRequest, cancel: Any, t0: float) -> Any:
        return _Seq()

    def start_sequence(self, seq: Any) -> bool:
        return self.go.wait(120)

    def step_alone(self, seq: Any) -> None:
        seq.stop("stop")

    def step_batch(self, seqs: Any) -> None:
        raise AssertionError("one slot never batches")

    def finished(self, seq: Any) -> Finished:
        return Finished(GenerationStats(1, 0, 0, 0.0, 0.0, 0.0, None))


class _Seq:
    """The parts of an ``ActiveSequence`` the scheduler touches."""

    def __init__(self) -> None:
        self.prompt = [1, 2]
        self.slot: Slot | None = None
        self.abort = threading.Event()
        self.cancelled = False
        self.done = False
        self.new: list[int] = []
        self.picker = self

    def stop(self, finish: str) -> None:
        self.done = True

    def emit(self, tokens: list[int]) -> Iterator[GenerationEvent]:
        return iter(())

    def tail(self) -> Iterator[GenerationEvent]:
        return iter(())

    def close(self) -> None:
        """The picker's."""


def _items(sink: queue.SimpleQueue[object]) -> list[object]:
    items = [sink.get(timeout=120)]
    while items[-1] is not END:
        items.append(sink.get(timeout=120))
    return items


def test_the_scheduler_runs_what_it_is_handed_and_keeps_no_queue() -> None:
    """A request handed over while every slot is taken is refused (``serve``'s queue owns waiting); once the
    slot is given back, the next one takes it."""
    engine = _HeldStart()
    scheduler = SlotScheduler(engine)  # type: ignore[arg-type]
    first: queue.SimpleQueue[object] = queue.SimpleQueue()
    scheduler.submit(Job(GenerationRequest(prompt="a"), None, first.put))  # takes the slot; its start is held
    with pytest.raises(EngineError, match="All 1 slots"):
        scheduler.submit(Job(GenerationRequest(prompt="b"), None, queue.SimpleQueue().put))
    engine.go.set()
    assert isinstance(_items(first)[-2], Finished)
    then: queue.SimpleQueue[object] = queue.SimpleQueue()
    scheduler.submit(Job(GenerationRequest(prompt="c"), None, then.put))
    assert isinstance(_items(then)[-2], Finished)
    scheduler.close()


def test_a_short_request_joins_the_batch_and_ends_while_a_long_one_runs(engine: EmbeddedEngine) -> None:
    long = Reader(engine, repeat("zebra", CTX - 100))
    assert long.first.wait(240) and long.error is None
    text, short = generate_text(engine, repeat("cobalt", 6))
    assert short.finish_reason == "length" and only_its_own_word(text, "cobalt")
    assert long.stats is None  # the long reply has not ended ...
    long.cancel.set()
    stats = long.join()
    assert stats.finish_reason == "cancelled"  # ... it was still generating, and stopped only now
    assert stats.completion_tokens < CTX - 100
    assert only_its_own_word(long.text, "zebra")


def test_a_cancelled_request_frees_its_slot_and_leaves_the_others_intact(engine: EmbeddedEngine) -> None:
    readers = [Reader(engine, repeat(word, CTX - 100)) for word in WORDS[:SLOTS]]
    for reader in readers:
        assert reader.first.wait(240) and reader.error is None
    gone = readers[-1]
    gone.cancel.set()
    assert gone.join().finish_reason == "cancelled"
    # Every slot was taken; the fourth request runs only because the cancelled one gave its slot back.
    text, stats = generate_text(engine, repeat("orange", 6))
    assert stats.finish_reason == "length" and only_its_own_word(text, "orange")
    for reader, word in zip(readers[:-1], WORDS, strict=False):
        assert reader.stats is None  # still generating beside it
        reader.cancel.set()
        assert reader.join().finish_reason == "cancelled"
        assert only_its_own_word(reader.text, word), (word, reader.text)


def test_an_agents_next_turn_goes_back_to_the_slot_holding_its_prefix(engine: EmbeddedEngine) -> None:
    first_turn = repeat("apple", 8)
    text, _ = generate_text(engine, first_turn)
    for word in ("zebra", "cobalt"):  # other agents' requests in between, one at a time
        generate_text(engine, repeat(word, 8))
    assert first_turn.prompt is not None
    next_turn = GenerationRequest(prompt=first_turn.prompt + text + " apple", max_tokens=4, temperature=0.0)
    _, stats = generate_text(engine, next_turn)
    assert stats.cached_tokens >= 16  # the first turn's prompt at least came from its slot's cache


WEATHER = ToolSpec(
    "get_weather",
    "Forecast",
    {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    },
)
ITEM = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "ok": {"type": "boolean"}},
    "required": ["name", "ok"],
    "additionalProperties": False,
}


def test_grammars_tool_calls_and_stops_stay_with_their_own_request(engine: EmbeddedEngine) -> None:
    calls: list[ToolCallMade] = []
    texts: dict[str, str] = {}
    stats: dict[str, GenerationStats] = {}
    requests = {
        "tool": GenerationRequest(
            messages=(ChatMessage("user", "Weather in Oslo for 2 days?"),),
            tools=(WEATHER,),
            tool_choice="required",
            max_tokens=80,
            temperature=0.0,
        ),
        "json": GenerationRequest(
            prompt="Describe the item as JSON:", max_tokens=60, temperature=0, json_schema=ITEM
        ),
        "stop": GenerationRequest(prompt="orange " * 16, max_tokens=40, temperature=0.0, stop=("orange",)),
    }

    def run(name: str) -> None:
        parts: list[str] = []
        for event in engine.generate(requests[name]):
            if isinstance(event, TextDelta):
                parts.append(event.text)
            elif isinstance(event, ToolCallMade):
                calls.append(event)
            elif isinstance(event, Finished):
                stats[name] = event.stats
        texts[name] = "".join(parts)

    threads = [threading.Thread(target=run, args=(name,)) for name in requests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert sorted(stats) == sorted(requests)
    assert (
        len(calls) == 1 and calls[0].call.name == "get_weather"
    )  # the one call, from the request that forced it
    args = json.loads(calls[0].call.arguments)
    assert args["city"] in ("Paris", "Oslo") and isinstance(args["days"], int)
    item = json.loads(texts["json"])  # the grammar held its own request to the schema, and only that one
    assert set(item) == {"name", "ok"}
    assert stats["stop"].finish_reason == "stop" and "orange" not in texts["stop"]
    assert "{" not in texts["stop"]


def test_a_hybrid_model_batches_its_recurrent_state_per_slot(tiny_models: dict[str, Path]) -> None:
    """A recurrent-plus-attention model (tiny random Qwen3.5-MoE): each slot keeps its own recurrent state (and
    rollback snapshots, speculation on), several decode in one batch, and each then goes on alone."""
    request = LaunchRequest(
        model=str(tiny_models["qwen35moe"]), ctx=512, parallel=3, engine="embedded", describe=False
    )
    opened = open_launch(decide_launch(request))
    engine = opened.engine
    assert isinstance(engine, EmbeddedEngine) and engine.recurrent and engine.slots == 3
    try:
        prompts = ("a b c a b c a b c", "x y z x y z", "1 2 3 1 2 3", "q r s q r s")
        readers = [  # one a slot: the engine keeps no queue
            Reader(engine, GenerationRequest(prompt=p, max_tokens=40, temperature=0.0)) for p in prompts[:3]
        ]
        for reader in readers:
            stats = reader.join()
            assert stats.finish_reason in ("length", "stop") and stats.completion_tokens > 0
        for prompt in (prompts[3], prompts[0]):  # a slot given back is taken again
            _, stats = generate_text(engine, GenerationRequest(prompt=prompt, max_tokens=8, temperature=0.0))
            assert stats.completion_tokens > 0
    finally:
        engine.close()
