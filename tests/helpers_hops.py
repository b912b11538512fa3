"""The threads one request or reply is on, in order, for the tests that count its crossings
(tests/test_slots_crossings.py for ``serve``, tests/test_chat_crossings.py for the app's chat; issue 50)."""

from __future__ import annotations

import threading


class Hops:
    """Each ``here()`` notes the thread it runs on; ``crossings`` counts the changes of thread between notes (the
    reads between posts are the same crossing back)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def here(self) -> None:
        with self._lock:
            self.threads.append(threading.current_thread())

    @property
    def crossings(self) -> int:
        return sum(a is not b for a, b in zip(self.threads, self.threads[1:], strict=False))
