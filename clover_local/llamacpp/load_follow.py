"""A ``llama-server`` child that follows the machine's load: started again with fewer threads when other programs
take cores, and with more when they give them back, between requests only, keeping the slots' state.

A thread of its own looks at the other programs' CPU use every :data:`LOOK_EVERY_S` (everything but this process
and the child's tree, :class:`CpuLookout`), keeps the speeds the child reached alone at each thread count, and asks
the pure rule (``llamacpp.load_rule.relaunch_choice``) whether a relaunch pays. When it does, the engine's
:class:`RequestGate` lets no new request in, waits for those in flight to finish (at most :data:`DRAIN_S`), and the
engine saves each slot, starts the child again with the new ``-t``/``-tb`` and restores the slots; the requests
that waited then go on. What it did is in :meth:`LoadFollower.state` (``/health``, the chat's status line) and in
the log (``clover_local.runner``)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import psutil

from clover_local.engine.types import RunnerThreads
from clover_local.llamacpp.load_rule import LoadLook, RelaunchChoice, RelaunchInputs, relaunch_choice
from clover_local.plan.threads import SLACK_CORES

log = logging.getLogger("clover_local.runner")

LOOK_EVERY_S = 0.5
KEEP_LOOKS_S = 30.0
DRAIN_S = 60.0
"""How long a wanted relaunch waits for the requests in flight to finish before it gives up (and tries later)."""
DEFAULT_REPLY_TOKENS = 256.0
"""Tokens a reply is expected to take before any was seen."""
SPEED_MIN_TOKENS = 16
"""A reply shorter than this says nothing of the decode speed (llama-server times one token at thousands a
second), so its speed is not kept."""
REPLY_WEIGHT = 0.3
"""Weight of the newest reply in the running mean of reply lengths, and of the newest speed seen."""


class RequestGate:
    """Requests pass while it is open; :meth:`exclusive` closes it, waits for those inside to leave, and holds it
    closed while a relaunch runs (requests arriving meanwhile wait, then go on)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._inside = 0
        self._closed = False

    @property
    def inside(self) -> int:
        return self._inside

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        with self._cond:
            while self._closed:
                self._cond.wait()
            self._inside += 1
        try:
            yield
        finally:
            with self._cond:
                self._inside -= 1
                self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self, drain_s: float) -> Iterator[bool]:
        """Closed to new requests inside the block; yields whether those in flight left within ``drain_s``
        (False: the block must not relaunch)."""
        with self._cond:
            self._closed = True
            drained = self._cond.wait_for(lambda: self._inside == 0, timeout=drain_s)
        try:
            yield drained
        finally:
            with self._cond:
                self._closed = False
                self._cond.notify_all()


class LoadLookout(Protocol):
    def look(self) -> LoadLook | None:
        """Cores the other programs used since the last look (None: nothing to say yet)."""
        ...


class CpuLookout:
    """The other programs' CPU use between two looks: the machine's busy time less this process's and the
    child's (its whole process tree). A new child (another pid) starts the count again."""

    def __init__(
        self, child_pid: Callable[[], int | None], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._child_pid = child_pid
        self._clock = clock
        self._last: tuple[float, float, float, int | None] | None = None

    def _sample(self) -> tuple[float, float, float, int | None]:
        total = psutil.cpu_times()
        busy = sum(total) - total.idle - getattr(total, "iowait", 0.0) - getattr(total, "steal", 0.0)
        own = psutil.Process().cpu_times()
        ours = own.user + own.system
        pid = self._child_pid()
        if pid is not None:
            try:
                child = psutil.Process(pid)
                for p in (child, *child.children(recursive=True)):
                    t = p.cpu_times()
                    ours += t.user + t.system
            except psutil.Error:
                pid = None
        return self._clock(), busy, ours, pid

    def look(self) -> LoadLook | None:
        """Cores the other programs used since the last look (None at the first look, or after a new child)."""
        now = self._sample()
        last, self._last = self._last, now
        if last is None or last[3] != now[3] or now[0] <= last[0]:
            return None
        others = (now[1] - last[1]) - (now[2] - last[2])
        return LoadLook(now[0], max(0.0, others / (now[0] - last[0])))


@dataclass(frozen=True)
class FollowLoad:
    """What a launch asks of the load follower: the most threads (every physical core here) and the decode speed
    the plan predicts there, used until one is seen."""

    ceiling: int
    predicted_tokens_per_s: float


class LoadFollower:
    """Watches the load from a thread of its own and starts the child again when :func:`relaunch_choice` says
    so. ``relaunch(threads)`` is the engine's: it runs inside the gate's exclusive block and returns the seconds
    it took, or raises (then the follower stops following: the supervisor handles the child)."""

    def __init__(
        self,
        *,
        gate: RequestGate,
        relaunch: Callable[[int], float],
        threads: int,
        follow: FollowLoad,
        first_start_s: float,
        lookout: LoadLookout,
        n_cpus: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        look_every_s: float = LOOK_EVERY_S,
        on_change: Callable[[RunnerThreads], None] | None = None,
    ) -> None:
        self._gate = gate
        self._relaunch = relaunch
        self._clock = clock
        self._lookout = lookout
        self._look_every_s = look_every_s
        self._on_change = on_change
        self.ceiling = max(1, follow.ceiling, threads)
        self.current = threads
        self.n_cpus = n_cpus or psutil.cpu_count(logical=True) or 1
        self.speeds: dict[int, float] = {}
        self._prior = (threads, follow.predicted_tokens_per_s)
        self.reply_tokens = DEFAULT_REPLY_TOKENS
        self.relaunch_cost_s = first_start_s
        self.relaunches = 0
        self.last_relaunch_at: float | None = None
        self.last_choice: RelaunchChoice | None = None
        self.looks: deque[LoadLook] = deque()
        self._relaunching = False
        self._stopped = False
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="llama-server-load", daemon=True)

    def start(self) -> LoadFollower:
        self._lookout.look()
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()

    def join(self, timeout_s: float) -> None:
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def state(self) -> RunnerThreads:
        """The threads in use now, and what the load made of them."""
        last = self.looks[-1].others if self.looks else 0.0
        return RunnerThreads(
            self.current,
            self.ceiling,
            relaunching=self._relaunching,
            others_busy=last,
            relaunches=self.relaunches,
        )

    def reply_finished(self, started_at: float, completion_tokens: int, decode_tokens_per_s: float) -> None:
        """A reply ended: its length feeds the expected next one; its decode speed is kept for the thread count
        it ran with when no other program took a core meanwhile and it was long enough to time."""
        if completion_tokens > 0:
            self.reply_tokens += REPLY_WEIGHT * (completion_tokens - self.reply_tokens)
        during = [look.others for look in list(self.looks) if look.at >= started_at]
        long_enough = completion_tokens >= SPEED_MIN_TOKENS  # a 1-token reply's "speed" is its timer's noise
        if long_enough and decode_tokens_per_s > 0 and during and max(during) <= SLACK_CORES:
            seen = self.speeds.get(self.current)
            self.speeds[self.current] = (
                decode_tokens_per_s if seen is None else seen + REPLY_WEIGHT * (decode_tokens_per_s - seen)
            )

    def inputs(self) -> RelaunchInputs:
        speeds = dict(self.speeds)
        if not speeds and self._prior[1] > 0:
            speeds[self._prior[0]] = self._prior[1]
        return RelaunchInputs(
            planned=self.ceiling,
            current=self.current,
            n_cpus=self.n_cpus,
            looks=tuple(self.looks),
            now=self._clock(),
            last_relaunch_at=self.last_relaunch_at,
            relaunch_cost_s=self.relaunch_cost_s,
            next_reply_tokens=self.reply_tokens,
            speeds=speeds,
        )

    def step(self) -> RelaunchChoice | None:
        """One look, and a relaunch when it pays and nothing is in flight (what the thread does each time)."""
        look = self._lookout.look()
        if look is not None:
            self.looks.append(look)
        while self.looks and self._clock() - self.looks[0].at > KEEP_LOOKS_S:
            self.looks.popleft()
        if self._stopped:
            return None
        choice = relaunch_choice(self.inputs())
        if choice != self.last_choice and choice.verdict == "keep" and choice.code == "not-worth-it":
            log.info("llama-server keeps %d threads: %s", self.current, choice.why)
        self.last_choice = choice
        if choice.verdict == "keep":
            return choice
        self._do_relaunch(choice)
        return choice

    def _do_relaunch(self, choice: RelaunchChoice) -> None:
        with self._gate.exclusive(DRAIN_S) as drained:
            if not drained or self._closing.is_set():
                return
            self._relaunching = True
            self._changed()
            log.warning("starting llama-server again with %d threads: %s", choice.threads, choice.why)
            try:
                took = self._relaunch(choice.threads)
            except Exception as exc:
                self._stopped = True
                log.error(
                    "llama-server could not be started again with %d threads (%s); threads stay "
                    "fixed from now on",
                    choice.threads,
                    exc,
                )
                return
            finally:
                self._relaunching = False
            self.current = choice.threads
            self.relaunches += 1
            self.relaunch_cost_s = took
            self.last_relaunch_at = self._clock()
            self.looks.clear()  # looks taken beside the old child said what its threads did
            self._lookout.look()
            log.warning("llama-server runs with %d threads (%.1f s to start again)", self.current, took)
        self._changed()

    def _changed(self) -> None:
        if self._on_change is not None:
            try:
                self._on_change(self.state())
            except Exception:
                log.exception("a runner-threads listener failed")

    def _run(self) -> None:
        while not self._closing.wait(self._look_every_s):
            try:
                self.step()
            except Exception:  # never let a look stop the following
                log.exception("looking at the machine's load failed")
