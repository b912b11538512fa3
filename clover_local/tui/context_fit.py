"""Whether a chat's next prompt fits the loaded context, and which oldest turns to leave out when it does not.

The chat asks before sending (a full context is said, never a silent empty reply). Counting uses the engine's
own tokenizer on the prompt its chat template renders, where the engine renders one, else on the messages with
a small allowance for the template's markers: ``engine.types.prompt_tokens``, the count ``serve`` uses too.
Nothing here imports Textual.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from clover_local.engine.types import ChatEngine, ChatMessage, prompt_tokens


@dataclass(frozen=True)
class Fit:
    prompt_tokens: int
    """Tokens of the prompt that would be sent."""
    n_ctx: int
    reply_room: int
    """Tokens kept free for the reply."""
    dropped: int = 0
    """Oldest messages left out to fit (the system prompt is always kept)."""

    @property
    def fits(self) -> bool:
        return self.prompt_tokens + self.reply_room <= self.n_ctx


def reply_room(n_ctx: int, max_tokens: int) -> int:
    """Room a reply needs: its own limit, but at most an eighth of the context (a short reply still helps)."""
    return max(1, min(max_tokens, n_ctx // 8))


def fit(
    engine: ChatEngine,
    system: Sequence[ChatMessage],
    turns: Sequence[ChatMessage],
    max_tokens: int,
    *,
    drop: bool,
) -> Fit:
    """How ``system + turns`` fits; with ``drop``, the oldest whole turns (a person's message and its reply)
    are left out until it fits or only the last message remains."""
    room = reply_room(engine.n_ctx, max_tokens)
    start = 0
    while True:
        used = prompt_tokens(engine, [*system, *turns[start:]])
        result = Fit(used, engine.n_ctx, room, dropped=start)
        if result.fits or not drop or start >= len(turns) - 1:
            return result
        start = _next_turn(turns, start)


def _next_turn(turns: Sequence[ChatMessage], start: int) -> int:
    """The index of the next person's message after ``start`` (a turn is left out whole)."""
    i = start + 1
    while i < len(turns) - 1 and turns[i].role != "user":
        i += 1
    return i
