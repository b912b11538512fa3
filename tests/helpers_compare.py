"""Shared pieces of the compare tests: a small tasks file the real SmolLM2 passes and fails, and an opener that
records, from the engines themselves, when each contender opened, answered and closed."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from helpers_engine import EngineWrapper

from clover_local.compare.contenders import Contender
from clover_local.compare.openers import open_contender
from clover_local.compare.options import CompareOptions, OpenedContender, Opener, Progress
from clover_local.engine.types import ChatEngine, GenerationEvent, GenerationRequest

TASKS: list[dict[str, Any]] = [
    # SmolLM2 135M answers these (greedy, checked on x86 and ARM builds alike: the answers are not near-ties).
    {"id": "capital", "prompt": "What is the capital of France? Answer with the city name only.",
     "assert": [{"type": "icontains", "value": "paris"}]},
    {"id": "water", "prompt": "What is the chemical formula of water? Answer with the formula only.",
     "assert": [{"type": "contains", "value": "H2O"}]},
    # ... and no model can pass this one: the code is in no prompt.
    {"id": "secret", "prompt": "What is my secret code? Reply with the code only.",
     "assert": [{"type": "equals", "value": "ZQX-7781-PLOVER"}]},
    {"id": "json", "prompt": "Reply with only a JSON object with one key \"ok\" set to true.",
     "assert": [{"type": "is-json", "value": {"type": "object", "required": ["ok"]}}]},
]  # fmt: skip


def write_tasks(folder: Path, tasks: list[dict[str, Any]] | None = None) -> Path:
    path = folder / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks or TASKS), encoding="utf-8")
    return path


class Recorder:
    """Wraps the real opener: ``events`` lists ``("open", name)``, ``("ask", name, task prompt)`` and
    ``("close", name)`` as the engines saw them; ``most_open`` is the most contenders open at one time."""

    def __init__(self, inner: Opener = open_contender) -> None:
        self.inner = inner
        self.events: list[tuple[str, ...]] = []
        self.open = 0
        self.most_open = 0
        self._lock = threading.Lock()

    def __call__(
        self,
        contender: Contender,
        options: CompareOptions,
        machine: Any,
        progress: Callable[[Progress], None],
    ) -> OpenedContender:
        with self._lock:
            self.events.append(("opening", contender.name))
            self.open += 1
            self.most_open = max(self.most_open, self.open)
        try:
            opened = self.inner(contender, options, machine, progress)
        except BaseException:
            with self._lock:
                self.open -= 1
                self.events.append(("failed", contender.name))
            raise
        engine = _Asking(opened.engine, contender.name, self.events)
        inner_close = opened.close

        def close() -> None:
            inner_close()
            with self._lock:
                self.open -= 1
                self.events.append(("close", contender.name))

        opened.engine, opened.close = engine, close
        return opened

    def asked(self, name: str) -> list[str]:
        return [e[2] for e in self.events if e[0] == "ask" and e[1] == name]

    def seeds(self, name: str) -> list[str]:
        return [e[3] for e in self.events if e[0] == "ask" and e[1] == name]


class _Asking(EngineWrapper):
    def __init__(self, inner: ChatEngine, name: str, events: list[tuple[str, ...]]) -> None:
        super().__init__(inner)
        self.name = name
        self.events = events

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        prompt = (request.messages or ())[-1].content
        self.events.append(("ask", self.name, prompt, str(request.seed)))
        return self.inner.generate(request, cancel)


def prompt_of(task_id: str) -> str:
    return next(t["prompt"] for t in TASKS if t["id"] == task_id)
