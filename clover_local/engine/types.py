"""The contract between engines (embedded llama-cpp-python, upstream llama-server) and their users
(``run``, ``bench``, ``serve``, the TUI chat). Plain values; no llama_cpp import here."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Role = Literal["system", "user", "assistant", "tool"]
FinishReason = Literal["stop", "length", "cancelled", "tool_calls"]
ToolChoice = Literal["auto", "none", "required"] | str
"""``auto``, ``none``, ``required``, or the name of the one function the model must call."""
ToolFormat = Literal["hermes", "qwen3_coder"]
"""How a model writes tool calls (``engine.toolcalls``): Hermes / Qwen3 JSON, or Qwen3-Coder / Qwen3.5 XML."""

TEMPLATE_TOKENS_PER_MESSAGE = 8
"""The chat template's markers around one message (turn start and end, role, newlines), allowed for where a
prompt is counted message by message instead of rendered (:func:`prompt_tokens`, which ``serve`` and the chat
both ask). Erring large only refuses or trims a prompt a few tokens early; too small lets one through that does
not fit."""


@dataclass(frozen=True)
class ToolCall:
    """One function call the model made (or made earlier, in a message fed back)."""

    id: str
    name: str
    arguments: str
    """The arguments as a JSON object text, as OpenAI sends them."""


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: its name, description and JSON-schema parameters."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def as_openai(self) -> dict[str, Any]:
        function: dict[str, Any] = {"name": self.name, "parameters": self.parameters}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    """Calls an assistant message made (fed back to the model in the next turn)."""
    tool_call_id: str | None = None
    """For ``tool`` messages: which call this is the result of."""
    name: str | None = None
    """For ``tool`` messages: the function's name, when the client gives it."""


@dataclass(frozen=True)
class GenerationRequest:
    """One reply to generate. Exactly one of ``messages`` (chat) and ``prompt`` (plain completion)."""

    messages: tuple[ChatMessage, ...] | None = None
    prompt: str | None = None
    max_tokens: int = 1024
    temperature: float | None = None
    """None: the preset's default. 0: greedy."""
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    speculative: bool | None = None
    """None: as the plan says."""
    tools: tuple[ToolSpec, ...] = ()
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = False
    """Allow more than one call in one reply (a forced choice then constrains to one or more)."""
    json_schema: dict[str, Any] | None = None
    """The reply must be JSON matching this schema (``{}``: any JSON object); enforced with a grammar."""
    live: bool = True
    """Make :class:`Refining` events for a live view (engines that refine a reply in steps, the diffusion one;
    the others never make them)."""
    cache_prompt: bool = True
    """Reuse what the engine's cache holds of this prompt (llama-server's ``cache_prompt``). False evaluates the
    whole prompt again: then the reply does not depend on earlier requests (with a cached prefix, llama.cpp
    evaluates the rest of the prompt in other batches, and a near-tie in the logits can flip)."""


@dataclass(frozen=True)
class DiffusionStats:
    """How a diffusion reply was made: steps over the canvas instead of one token at a time."""

    steps: int
    """Denoising steps run (each decodes the whole canvas once)."""
    answer_tokens: int
    """Canvas positions after the prompt that were unmasked (the reply may end earlier, at end-of-text)."""
    tokens_per_step: float
    tokens_per_s: float
    """Answer positions unmasked per second of generation."""
    algorithm: str
    schedule: str
    block_length: int
    steps_per_block: int


@dataclass(frozen=True)
class GenerationStats:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    """Prompt tokens reused from the KV cache of the previous turn."""
    ttft_s: float
    prefill_tokens_per_s: float
    decode_tokens_per_s: float
    draft_acceptance: float | None
    """Accepted / drafted tokens; None when nothing was drafted."""
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    finish_reason: FinishReason = "stop"
    diffusion: DiffusionStats | None = None
    """Set for diffusion models."""


@dataclass(frozen=True)
class TextDelta:
    """New text, already detokenized and safe to show (never half a UTF-8 character or a partial stop string)."""

    text: str


@dataclass(frozen=True)
class Refining:
    """A diffusion step: the part of the reply still being refined (for live views; streams ignore it). The
    settled part before it has come as :class:`TextDelta`."""

    text: str
    """The unsettled rest of the answer, from its first mask on, each mask shown as :data:`MASK_GLYPH`."""
    step: int
    total_steps: int
    masked: int


MASK_GLYPH = "\u2591"
"""How a still-masked position looks in :class:`Refining` text (a light shade block)."""


@dataclass(frozen=True)
class ToolCallMade:
    """A complete tool call the model emitted (its text is not also sent as ``TextDelta``)."""

    index: int
    call: ToolCall


@dataclass(frozen=True)
class Finished:
    stats: GenerationStats


GenerationEvent = TextDelta | Refining | ToolCallMade | Finished

END = object()
"""What a :data:`Sink` is given last: the generation ended, failed, or was never started."""
Sink = Callable[[object], None]
"""Where an engine's own thread puts one generation's items: each event, an exception if it fails, then
:data:`END`. Called on the engine's thread, so it only hands the item on (``serve``'s ``Reply.post``)."""
Prepare = Callable[[GenerationRequest], GenerationRequest]
"""Run where a request is taken (the batch thread, a slot worker) just before it generates, returning the request
to generate: the chat's wait for its runner and fit to the context (``tui.reply_stream``), so that they cost the
request no thread of its own. What it raises ends the request as an error."""
Submit = Callable[[GenerationRequest, threading.Event, Sink, Prepare | None], None]


@dataclass(frozen=True)
class MeasuredCosts:
    """What verifying drafts costs on this machine, measured on the loaded engine (``engine.verify_probe``)."""

    costs: tuple[float, ...]
    """``costs[m - 1]``: a batch of ``m`` tokens relative to one step (``costs[0] == 1``)."""
    step_ms: float
    """One plain decoding step, milliseconds (median)."""
    rounds: int
    others_busy: float
    """Cores' worth of CPU the other programs used while it was measured (``detect.cpu_load``)."""
    quiet: bool
    """Whether they left the probe's threads their cores: only a quiet measurement is kept and used."""

    @property
    def ceiling(self) -> float:
        """The most speculation can gain here: the longest batch's tokens per unit of cost at 100% acceptance."""
        return len(self.costs) / self.costs[-1] if self.costs else 1.0


class ChatEngine(Protocol):
    """What the CLI, the server and the TUI need from an engine, and what it can do, said up front (as Ollama's
    ``LlamaServer`` interface and llm's ``Model`` do): users read these members, never probe for others."""

    @property
    def model_name(self) -> str: ...

    @property
    def n_ctx(self) -> int: ...

    @property
    def slots(self) -> int:
        """Generations this engine runs at once (``plan.parallel``: the embedded engine's batch, llama-server's
        ``-np``); 1 for most. The queue of ``serve`` and the chat hands it at most that many."""
        ...

    @property
    def submit(self) -> Submit | None:
        """Hand a request straight to the engine's own thread (the embedded engine's batch loop), which gives its
        items to the sink; a request crosses to that thread and back, no more. None where a generation runs on
        its caller's thread (llama-server's engine reads one HTTP stream per request): ``serve``'s queue then
        runs ``generate`` on a slot worker. At most ``slots`` at a time, as ``generate``."""
        ...

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        """Stream a reply: ``TextDelta`` events, then exactly one ``Finished``. Setting ``cancel`` stops within a
        token or two (``finish_reason="cancelled"``). At most ``slots`` generations at a time."""
        ...

    def check_request(self, request: GenerationRequest) -> None:
        """Refuse now what ``generate`` would refuse up front (a schema or forced call it cannot enforce), so
        ``serve`` answers a streamed request with a 400 before any reply is sent; nothing for an engine that
        refuses nothing early."""
        ...

    def render_prompt(self, messages: Sequence[ChatMessage]) -> str | None:
        """The prompt text this engine's chat template makes of ``messages``; None where the template is applied
        out of reach (llama-server's child): then a prompt is counted message by message
        (:func:`prompt_tokens`)."""
        ...

    @property
    def tool_format(self) -> ToolFormat:
        """How replies write tool calls (from the chat template; the generic Hermes format without one)."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def health(self) -> RunnerHealth:
        """Whether the runner can answer (``serve``'s ``/health``, the chat's status line): a ``llama-server``
        child can stop, be started again or be given up; an engine in this process always reports ``ready``."""
        ...

    @property
    def runner_pid(self) -> int | None:
        """The child process holding the model (a ``llama-server`` started here, as it runs now); None where there
        is none (this process holds it, or a server elsewhere)."""
        ...

    def measure_verify_costs(self, n_max_batch: int) -> MeasuredCosts | None:
        """Time what verifying drafts of up to ``n_max_batch`` tokens costs on this engine
        (``engine.verify_probe``) and draft by that table from now on where it was measured while the machine
        was quiet; None where drafts are not verified in this process (a ``llama-server`` child) or the context
        is too small to measure them."""
        ...

    def close(self) -> None: ...


RunnerState = Literal["ready", "restarting", "failed", "stopped"]


@dataclass(frozen=True)
class RunnerThreads:
    """The threads a ``llama-server`` child runs with now, and what the machine's load made of them
    (``llamacpp.load_follow``): fewer than ``planned`` while other programs keep cores busy."""

    threads: int
    planned: int
    """The most it is given (every physical core, unless ``--threads`` asked otherwise)."""
    relaunching: bool = False
    """Being started again with another thread count right now (requests wait, then go on)."""
    others_busy: float = 0.0
    """Cores other programs used at the last look."""
    relaunches: int = 0

    @property
    def note(self) -> str:
        """What a person is told, empty while the child has every planned thread."""
        if self.relaunching:
            return "another program's load changed: restarting the model with other threads…"
        if self.threads < self.planned:
            plural = "" if self.threads == 1 else "s"
            return f"another program is busy: {self.threads} thread{plural} of {self.planned}"
        return ""


@dataclass(frozen=True)
class RunnerHealth:
    """Whether an engine's runner (a ``llama-server`` child) can answer: ``ready``; ``restarting`` after it stopped
    unasked (``retry_after_s``: when to ask again); ``failed`` when it kept stopping and was given up; ``stopped``
    once closed. ``why`` says what happened, in one sentence and without the child's log lines."""

    state: RunnerState = "ready"
    why: str = ""
    restarts: int = 0
    """Times the runner was started again since it was opened."""
    retry_after_s: float | None = None
    threads: RunnerThreads | None = None
    """The threads it runs with, where it follows the load (None: fixed at launch)."""


def prompt_tokens(engine: ChatEngine, messages: Sequence[ChatMessage]) -> int:
    """About how many tokens the prompt of ``messages`` takes in ``engine``'s context: the one answer ``serve``
    (refusing a prompt its context cannot hold) and the chat (asking before it sends one, ``tui.context_fit``)
    give. The engine's own count of the prompt its template renders, where it renders one here; else one count
    of all the text (one round trip on llama-server) and :data:`TEMPLATE_TOKENS_PER_MESSAGE` for each message's
    markers. The tools a request offers are not in it (``serve`` adds them: ``serve.tools.tool_prompt_tokens``)."""
    try:
        rendered = engine.render_prompt(messages)
    except Exception:  # a template that cannot render these messages: counted message by message
        rendered = None
    if rendered is not None:
        return engine.count_tokens(rendered)
    text = "\n".join(m.content for m in messages)
    return engine.count_tokens(text) + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
