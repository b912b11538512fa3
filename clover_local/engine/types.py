"""The contract between engines (embedded llama-cpp-python, upstream llama-server) and their users
(``run``, ``bench``, ``serve``, the TUI chat). Plain values; no llama_cpp import here."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

Role = Literal["system", "user", "assistant"]
FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class ChatMessage:
    role: Role
    content: str


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
class Finished:
    stats: GenerationStats


GenerationEvent = TextDelta | Refining | Finished


class ChatEngine(Protocol):
    """What the CLI, the server and the TUI need from an engine."""

    @property
    def model_name(self) -> str: ...

    @property
    def n_ctx(self) -> int: ...

    def generate(
        self, request: GenerationRequest, cancel: threading.Event | None = None
    ) -> Iterator[GenerationEvent]:
        """Stream a reply: ``TextDelta`` events, then exactly one ``Finished``. Setting ``cancel`` stops within a
        token or two (``finish_reason="cancelled"``). Not thread-safe: one generation at a time per engine."""
        ...

    def count_tokens(self, text: str) -> int: ...

    def close(self) -> None: ...
