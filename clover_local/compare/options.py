"""The values a comparison run passes around: the options every contender gets alike, progress for a bar, and a
contender ready to answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from clover_local.compare.contenders import Contender
from clover_local.engine.types import ChatEngine
from clover_local.plan.reasons import Notice

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine


@dataclass(frozen=True)
class CompareOptions:
    """What every contender gets alike (saved in the report: a resumed run must use the same)."""

    max_tokens: int = 256
    temperature: float = 0.0
    """0: greedy."""
    repeat: int = 1
    """Runs of each task (sampled runs: ``--repeat K --temperature T``)."""
    seed: int = 1
    """The seed of repeat ``r`` is ``seed + r``."""
    system: str | None = None
    """A system prompt put before every task that has none of its own."""
    ctx: int | None = None
    """Context of every local contender (None: each plan's own)."""
    key_env: str | None = None
    """The environment variable holding the endpoints' key (its name only; the key is never saved)."""
    engine: str | None = None
    """The engine wished for every local contender (``auto``, ``embedded``, ``llama-server``); None: each
    launch's default (``launch.choose_runner``: llama-server where only it runs the model)."""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


ProgressKind = Literal["loading", "loaded", "task", "unloaded", "failed", "downloading"]


@dataclass(frozen=True)
class Progress:
    """What the run is doing, for a progress bar (the CLI's, the app's)."""

    kind: ProgressKind
    contender: str
    task: str = ""
    done: int = 0
    total: int = 0
    eta_s: float | None = None
    """Seconds left, from the time the tasks run so far took (None until one has finished)."""
    message: str = ""


@dataclass
class OpenedContender:
    """A contender ready to answer: its engine, how to let it go, and whose memory to watch."""

    engine: ChatEngine
    close: Callable[[], None]
    holder_pid: int | None = None
    """The process holding the model (this one for the embedded engine, llama-server's); None: an endpoint."""
    in_process: bool = False
    description: str = ""
    notices: tuple[Notice, ...] = ()


Opener = Callable[[Contender, CompareOptions, "Machine | None", Callable[[Progress], None]], OpenedContender]
