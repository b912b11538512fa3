"""When a ``llama-server`` child that stopped unasked is started again: the decision, kept pure so it is tested
with tables of crash times (systemd's ``Restart=on-failure`` with ``StartLimitBurst``/``StartLimitIntervalSec``).

A child that stops now and then is started again after a short back-off that grows with each recent stop; one
that keeps stopping (more than ``max_stops`` within ``window_s``: a model that no longer fits, a GPU that was
reset, a worker that is gone) is given up, with the reason shown, rather than restarted blindly. A load that ran
out of memory is never retried on the same argv: that is a re-plan, not a restart."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RestartPolicy:
    """How restarts are spaced and when they stop."""

    backoff_s: tuple[float, ...] = (0.5, 2.0, 5.0)
    """The wait before a restart, by how many stops fall within ``window_s`` (the first, the second, ...; the
    last value for any later one)."""
    max_stops: int = 3
    """Stops within ``window_s`` that are still restarted; one more and the child is given up."""
    window_s: float = 300.0
    """How far back stops count (a child that ran for five minutes since its last stop starts afresh)."""


@dataclass(frozen=True)
class RestartDecision:
    """Restart after ``delay_s``, or (``delay_s`` None) give up, and why in words."""

    delay_s: float | None
    why: str


def next_restart(
    policy: RestartPolicy, stops: Sequence[float], now: float, *, out_of_memory: bool = False
) -> RestartDecision:
    """What to do after the latest of ``stops`` (monotonic times of every unasked stop so far, the latest
    included), at ``now``. ``out_of_memory``: the child's log says it could not allocate memory (while loading,
    or restarting): the same argv would fail the same way, so it is given up at once."""
    if out_of_memory:
        return RestartDecision(
            None,
            "it ran out of memory; starting it again with the same settings would fail the same way (another "
            "program may hold that memory now)",
        )
    recent = [t for t in stops if now - t <= policy.window_s]
    n = max(1, len(recent))
    if n > policy.max_stops:
        return RestartDecision(
            None, f"it stopped {n} times within {policy.window_s:.0f} s, so it was not started again"
        )
    delay = policy.backoff_s[min(n, len(policy.backoff_s)) - 1] if policy.backoff_s else 0.0
    return RestartDecision(delay, f"stop {n} of at most {policy.max_stops} within {policy.window_s:.0f} s")
