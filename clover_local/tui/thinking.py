"""Split a streamed reply into the model's thinking (``<think>...</think>``) and its answer.

Pure Python, fed chunk by chunk as tokens arrive. A tag may arrive split across chunks, so text that could
be the start of a tag is held back until the next chunk decides it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Part = Literal["thinking", "answer"]
OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"


@dataclass
class ThinkSplitter:
    """Feed chunks; get back ``(part, text)`` pieces in order. ``flush()`` at the end releases held text."""

    in_thinking: bool = False
    _held: str = ""
    thinking_text: list[str] = field(default_factory=list)
    answer_text: list[str] = field(default_factory=list)

    def feed(self, chunk: str) -> list[tuple[Part, str]]:
        text = self._held + chunk
        self._held = ""
        out: list[tuple[Part, str]] = []
        while text:
            tag = CLOSE_TAG if self.in_thinking else OPEN_TAG
            at = text.find(tag)
            if at >= 0:
                self._emit(out, text[:at])
                self.in_thinking = not self.in_thinking
                text = text[at + len(tag) :]
                continue
            keep = _partial_tag_suffix(text, tag)
            self._emit(out, text[: len(text) - keep])
            self._held = text[len(text) - keep :]
            break
        return out

    def flush(self) -> list[tuple[Part, str]]:
        out: list[tuple[Part, str]] = []
        self._emit(out, self._held)
        self._held = ""
        return out

    @property
    def answer(self) -> str:
        return "".join(self.answer_text)

    @property
    def thinking(self) -> str:
        return "".join(self.thinking_text)

    def _emit(self, out: list[tuple[Part, str]], text: str) -> None:
        if not text:
            return
        part: Part = "thinking" if self.in_thinking else "answer"
        (self.thinking_text if self.in_thinking else self.answer_text).append(text)
        out.append((part, text))


def _partial_tag_suffix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def strip_thinking(text: str) -> str:
    """The answer alone, for history sent back to the model and for copying."""
    splitter = ThinkSplitter()
    splitter.feed(text)
    splitter.flush()
    return splitter.answer
