"""Regular expressions from a tasks file, searched in a model's reply without letting one hang the run.

Python's ``re`` backtracks, and a pattern like ``(a+)+$`` on a long reply runs for minutes holding the GIL, so no
thread can stop it. The search runs in a small child interpreter instead (standard library only), one at a time,
each given :data:`SEARCH_TIMEOUT_S`; past it the child is killed, the check fails saying so, and the next search
starts a fresh child. Patterns are compiled (and bounded in length) when the tasks file is read.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading

SEARCH_TIMEOUT_S = 2.0
"""One search, in the child (started and ready before the clock runs)."""
MAX_TEXT_CHARS = 200_000
"""A reply is searched up to this many characters (replies are bounded by the token budget anyway)."""

_CHILD = r"""
import json, re, sys
sys.stdout.write("R\n")
sys.stdout.flush()
for line in sys.stdin:
    job = json.loads(line)
    try:
        found = re.search(job["p"], job["t"]) is not None
        sys.stdout.write("1\n" if found else "0\n")
    except Exception as exc:
        sys.stdout.write("E" + str(exc).replace("\n", " ") + "\n")
    sys.stdout.flush()
"""


class RegexTimeout(Exception):
    """The search ran past its time limit (a pattern that backtracks badly on this reply)."""


class SafeRegex:
    """Searches run in a child process with a time limit; ``close()`` (or the context) stops the child."""

    def __init__(self, timeout_s: float = SEARCH_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._child: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def search(self, pattern: str, text: str) -> bool:
        """Whether ``pattern`` matches somewhere in ``text``; raises :class:`RegexTimeout` past the limit and
        ``ValueError`` when the pattern fails."""
        with self._lock:
            child = self._started()
            assert child.stdin is not None and child.stdout is not None
            job = json.dumps({"p": pattern, "t": text[:MAX_TEXT_CHARS]})
            answer: list[str] = []
            reader = threading.Thread(target=lambda: answer.append(child.stdout.readline()), daemon=True)  # type: ignore[union-attr]
            try:
                child.stdin.write(job + "\n")
                child.stdin.flush()
            except OSError:
                self._stop()
                raise ValueError("the regex child process stopped") from None
            reader.start()
            reader.join(self.timeout_s)
            timed_out = reader.is_alive()
            if timed_out or not answer or not answer[0]:
                self._stop()
                if timed_out:
                    raise RegexTimeout(f"the regex ran past {self.timeout_s:g} s on this reply")
                raise ValueError("the regex child process stopped")
            line = answer[0].rstrip("\n")
            if line.startswith("E"):
                raise ValueError(line[1:])
            return line == "1"

    def _started(self) -> subprocess.Popen[str]:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CHILD],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                encoding="utf-8",
            )
            assert self._child.stdout is not None
            if self._child.stdout.readline() != "R\n":  # no time limit: a busy machine starts Python slowly
                self._stop()
                raise ValueError("the regex child process did not start")
        return self._child

    def _stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        child.kill()
        child.wait()
        for stream in (child.stdin, child.stdout):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def __enter__(self) -> SafeRegex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
