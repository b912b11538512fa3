"""When a ``llama-server`` child should be started again with another thread count: a pure decision, from looks
at the other programs' CPU use, the speeds seen, and what a relaunch costs.

llama-server's threads are fixed at launch and wait for each other at every step (they spin at the barrier), so
one that shares its core with another busy program stalls them all: a child launched with 2 threads on an idle
2-core machine decoded at 0.2x once a program got busy beside it (issue 48). The embedded engine changes its
threads between steps (``engine.batch_threads``); the child can only be started again. That costs seconds (the
weights come back from the page cache) and is done between requests only (``llamacpp.load_follow``), when:

- the load has said so for long enough: fewer threads after :data:`DOWN_AFTER_S` of every look saying so, more
  after :data:`UP_AFTER_S` (:data:`UP_AFTER_LAUNCH_S` when the launch itself gave cores up), and going up needs the cores freer than going down does (:data:`UP_SLACK_CORES`
  against ``plan.threads.SLACK_CORES``), so a load at the edge does not flap;
- the last relaunch was at least :data:`MIN_GAP_S` ago;
- the replies to come (:data:`HORIZON_REPLIES` of the expected length: a load outlasts a reply) gain more time
  than the relaunch costs, at the speeds seen on this machine (a thread count never seen alone is scaled from
  one that was, :data:`THREAD_EXPONENT`; a thread without a core of its own runs at :data:`CONTENDED` of its
  speed).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from clover_local.plan.threads import SLACK_CORES, threads_for_load

DOWN_AFTER_S = 2.0
"""Every look this long says the cores are taken before the child gives them up."""
UP_AFTER_S = 10.0
"""Every look this long says the cores are free again before the child takes them back."""
UP_AFTER_LAUNCH_S = DOWN_AFTER_S
"""A launch that took fewer threads than planned did so from one short look (the machine's probe, under a
second): as long a watch the other way as it takes to give a core up is enough to take it back, so a load spike
at the moment of launch costs seconds, not :data:`UP_AFTER_S` (issue 48: a SmolLM2 launch decided as another
program stopped decoded at 0.64x of its idle speed until the follower took the core back)."""
MIN_GAP_S = 15.0
"""Never two relaunches closer than this."""
UP_SLACK_CORES = 0.1
"""Other programs may use this much of a core and still give a thread its core back: less than
``SLACK_CORES`` (what they may use before a thread gives its core up), so a load between the two keeps the
threads as they are."""
CONTENDED = 0.25
"""Speed of a child whose threads outnumber the free cores, as a share of its speed alone (measured: 0.22 on the
full-size Clover-shaped model, 0.10 on SmolLM2 135M, 2 cores, one busy program; issue 48)."""
HORIZON_REPLIES = 3
"""Replies a relaunch is weighed over: a load that lasts long enough to be seen (seconds of looks) lasts longer
than one reply, so the threads chosen serve the next few."""
THREAD_EXPONENT = 0.5
"""Decode speed alone scales as threads to this power where only one count was seen: between memory-bound
decoding (1 thread at 0.9x of 2 on the full-size Clover-shaped model) and compute-bound (0.6x on SmolLM2 135M,
2-core VM; docs/speed.md). Once a count is seen alone, its own speed is used."""

Verdict = Literal["keep", "fewer", "more"]


@dataclass(frozen=True)
class LoadLook:
    """One look at the machine: how many cores' worth of CPU the other programs used since the look before."""

    at: float
    """Monotonic seconds."""
    others: float


@dataclass(frozen=True)
class RelaunchInputs:
    planned: int
    """The most threads the launch gives (its ``-t``)."""
    current: int
    """Threads the child runs with now."""
    n_cpus: int
    """Logical CPUs."""
    looks: Sequence[LoadLook]
    """Oldest first."""
    now: float
    last_relaunch_at: float | None
    relaunch_cost_s: float
    """What starting the child again costs (its last start, saving and restoring the slots)."""
    next_reply_tokens: float
    """Tokens the next reply is expected to generate."""
    speeds: Mapping[int, float]
    """Decode tokens/s seen at each thread count while no other program took a core (one prior at least)."""


@dataclass(frozen=True)
class RelaunchChoice:
    verdict: Verdict
    threads: int
    """Threads to relaunch with (``current`` when the verdict is keep)."""
    code: str
    """Why, as a code: ``steady``, ``too-few-looks``, ``too-soon``, ``not-worth-it``, ``load-rose``,
    ``load-fell``."""
    why: str
    gain_s: float = 0.0
    """Seconds the next replies are expected to gain (fewer or more), 0 when not weighed."""


def _span(looks: Sequence[LoadLook], now: float, window: float) -> list[LoadLook]:
    return [look for look in looks if now - look.at <= window]


def _covers(looks: Sequence[LoadLook], now: float, window: float) -> bool:
    """Looks reaching back most of the window (a look covers the time since the look before it)."""
    return bool(looks) and now - looks[0].at >= 0.75 * window and len(looks) >= 2


def down_target(planned: int, n_cpus: int, others: float) -> int:
    """Threads a look allows: every core the other programs leave (``plan.threads.threads_for_load``)."""
    return threads_for_load(planned, planned, n_cpus, others)[0]


def up_target(planned: int, n_cpus: int, others: float) -> int:
    """Threads a look allows when taking cores back: stricter than :func:`down_target`."""
    return max(1, min(planned, math.floor(n_cpus - others + UP_SLACK_CORES)))


def speed_alone(threads: int, speeds: Mapping[int, float]) -> float:
    """Decode tokens/s at ``threads`` with the cores to itself: as seen, else scaled from the nearest count seen."""
    if threads in speeds:
        return speeds[threads]
    if not speeds:
        return 0.0
    seen = min(speeds, key=lambda t: (abs(t - threads), -t))
    return float(speeds[seen] * (threads / seen) ** THREAD_EXPONENT)


def speed_beside(threads: int, n_cpus: int, others: float, speeds: Mapping[int, float]) -> float:
    """Decode tokens/s at ``threads`` while other programs use ``others`` cores."""
    free = math.floor(n_cpus - others + SLACK_CORES)
    alone = speed_alone(threads, speeds)
    return alone * (CONTENDED if threads > max(1, free) else 1.0)


def relaunch_choice(inputs: RelaunchInputs) -> RelaunchChoice:
    """Keep the child's threads, or start it again with fewer or more (see the module's docstring)."""
    i = inputs
    down_looks = _span(i.looks, i.now, DOWN_AFTER_S)
    up_after = UP_AFTER_LAUNCH_S if i.last_relaunch_at is None and i.current < i.planned else UP_AFTER_S
    up_looks = _span(i.looks, i.now, up_after)
    fewer = max((down_target(i.planned, i.n_cpus, look.others) for look in down_looks), default=i.current)
    more = min((up_target(i.planned, i.n_cpus, look.others) for look in up_looks), default=i.current)
    if fewer < i.current:
        verdict: Verdict = "fewer"
        target, looks, window = fewer, down_looks, DOWN_AFTER_S
    elif more > i.current:
        verdict, target, looks, window = "more", more, up_looks, up_after
    else:
        return RelaunchChoice("keep", i.current, "steady", f"{i.current} threads suit the load")
    if not _covers(_span(i.looks, i.now, window * 1.5), i.now, window):
        return RelaunchChoice(
            "keep", i.current, "too-few-looks", f"the load has not been watched for {window:.0f} s yet"
        )
    if i.last_relaunch_at is not None and i.now - i.last_relaunch_at < MIN_GAP_S:
        return RelaunchChoice("keep", i.current, "too-soon", f"started again less than {MIN_GAP_S:.0f} s ago")
    others = sum(look.others for look in looks) / len(looks)
    now_speed = speed_beside(i.current, i.n_cpus, others, i.speeds)
    then_speed = speed_beside(target, i.n_cpus, others, i.speeds)
    if now_speed <= 0 or then_speed <= 0:
        return RelaunchChoice("keep", i.current, "not-worth-it", "no speed to weigh it by")
    tokens = i.next_reply_tokens * HORIZON_REPLIES
    gain = tokens / now_speed - tokens / then_speed
    if gain <= i.relaunch_cost_s:
        return RelaunchChoice(
            "keep",
            i.current,
            "not-worth-it",
            f"{target} threads would save {max(gain, 0.0):.1f} s over the next {HORIZON_REPLIES} replies, less than the "
            f"{i.relaunch_cost_s:.1f} s a relaunch costs",
            gain,
        )
    if verdict == "fewer":
        why = (
            f"other programs use {others:.1f} of {i.n_cpus} cores: {target} thread{'s' if target > 1 else ''}"
        )
        return RelaunchChoice("fewer", target, "load-rose", why, gain)
    why = f"the cores are free again ({others:.1f} used by other programs): {target} threads"
    return RelaunchChoice("more", target, "load-fell", why, gain)
