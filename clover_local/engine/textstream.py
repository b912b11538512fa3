"""Bytes of token pieces in, text that is safe to show out: never half a UTF-8 character, never part of a stop
string. Pure Python, no llama_cpp."""

from __future__ import annotations

import codecs
from collections.abc import Sequence


class StopTextStream:
    """``push(piece)`` returns the text that can be shown now, holding back what might start a stop string; once
    a stop string is seen, ``stopped`` is True and nothing more (the stop string included) is returned."""

    def __init__(self, stop: Sequence[str] = ()) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._pending = ""
        self.stopped = False

    def push(self, piece: bytes) -> str:
        if self.stopped:
            return ""
        new = self._decoder.decode(piece)
        if not self._stop:
            return new
        # Search only where a stop string can begin: the held-back tail plus the new text.
        window = self._pending + new
        hits = [i for i in (window.find(s) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            out = window[: min(hits)]
            self._pending = ""
        else:
            keep = partial_stop(window, self._stop)
            out, self._pending = window[: len(window) - keep], window[len(window) - keep :]
        return out

    def flush(self) -> str:
        """End of generation: whatever was held back (a possible stop prefix that never completed)."""
        if self.stopped:
            return ""
        out = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return out


def partial_stop(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``stops`` (held back until the
    next text says whether it completes one)."""
    for n in range(min(max(map(len, stops), default=1) - 1, len(text)), 0, -1):
        tail = text[-n:]
        if any(s.startswith(tail) for s in stops):
            return n
    return 0
