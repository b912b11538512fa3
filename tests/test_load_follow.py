"""The load follower's moves around requests (``llamacpp.load_follow``): a relaunch waits for the request in
flight, requests that arrive meanwhile wait for it and then go on, a failed relaunch stops the following, speeds
are kept only from replies that ran alone, and the lookout counts other programs only. Scripted looks on a fake
clock; nothing timed (held with events, waited for with ``wait_until``)."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

import pytest
from waiting import wait_until

from clover_local.engine.types import RunnerThreads
from clover_local.llamacpp.load_follow import CpuLookout, FollowLoad, LoadFollower, RequestGate
from clover_local.llamacpp.load_rule import DOWN_AFTER_S, LoadLook


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Scripted:
    """Looks saying the other programs use ``others`` cores, one each half second of the fake clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.others = 0.0

    def look(self) -> LoadLook | None:
        self.clock.now += 0.5
        return LoadLook(self.clock.now, self.others)


def follower(
    relaunch: object,
    *,
    threads: int = 2,
    cost: float = 1.0,
    on_change: Callable[[RunnerThreads], None] | None = None,
) -> tuple[LoadFollower, Scripted, RequestGate]:
    clock = Clock()
    looks = Scripted(clock)
    gate = RequestGate()
    f = LoadFollower(
        gate=gate,
        relaunch=relaunch,  # type: ignore[arg-type]
        threads=threads,
        follow=FollowLoad(2, 10.0),
        first_start_s=cost,
        lookout=looks,
        n_cpus=2,
        clock=clock,
        on_change=on_change,
    )
    return f, looks, gate


def steps_until_relaunch(f: LoadFollower, most: int = 40) -> None:
    for _ in range(most):
        choice = f.step()
        if choice is not None and choice.verdict != "keep":
            return
    raise AssertionError(f"no relaunch after {most} looks: {f.last_choice}")


def test_a_busy_program_relaunches_with_one_thread_and_says_so() -> None:
    asked: list[int] = []
    changes: list[RunnerThreads] = []
    f, looks, _ = follower(lambda n: asked.append(n) or 1.5, on_change=changes.append)
    for _ in range(10):
        f.step()
    assert asked == [] and f.state().note == ""
    looks.others = 1.0
    steps_until_relaunch(f)
    assert asked == [1]
    assert f.current == 1 and f.relaunches == 1 and f.relaunch_cost_s == 1.5
    assert [c.relaunching for c in changes] == [True, False]
    assert f.state().note == "another program is busy: 1 thread of 2"
    for _ in range(int(DOWN_AFTER_S * 4)):
        f.step()
    assert asked == [1], "no second relaunch while the load stays"


def test_a_relaunch_waits_for_the_request_in_flight_and_holds_new_ones() -> None:
    in_relaunch = threading.Event()
    release = threading.Event()
    asked: list[int] = []

    def relaunch(n: int) -> float:
        in_relaunch.set()
        release.wait(60)
        asked.append(n)
        return 1.0

    f, looks, gate = follower(relaunch)
    looks.others = 1.0
    leave = threading.Event()
    inside = threading.Event()

    def request() -> None:
        with gate.request():
            inside.set()
            leave.wait(60)

    first = threading.Thread(target=request)
    first.start()
    inside.wait(60)
    stepping = threading.Thread(target=steps_until_relaunch, args=(f,))
    stepping.start()
    wait_until(lambda: gate._closed, "the gate to close for the relaunch")
    assert not in_relaunch.is_set(), "the relaunch must wait for the request in flight"
    later_done = threading.Event()

    def later() -> None:
        with gate.request():
            later_done.set()

    second = threading.Thread(target=later)
    second.start()
    leave.set()
    in_relaunch.wait(60)
    assert in_relaunch.is_set()
    assert not later_done.is_set(), "a request that arrived meanwhile waits for the relaunch"
    release.set()
    stepping.join(60)
    second.join(60)
    first.join(60)
    assert later_done.is_set() and asked == [1]


def test_a_failed_relaunch_stops_the_following() -> None:
    calls: list[int] = []

    def broken(n: int) -> float:
        calls.append(n)
        raise RuntimeError("out of memory")

    f, looks, _ = follower(broken)
    looks.others = 1.0
    steps_until_relaunch(f)
    for _ in range(100):
        f.step()
    assert calls == [1]
    assert f.current == 2 and f.relaunches == 0


def test_speeds_are_kept_only_from_replies_that_ran_alone() -> None:
    f, looks, _ = follower(lambda n: 1.0)
    for _ in range(4):
        f.step()
    start = looks.clock.now
    for _ in range(4):
        f.step()
    f.reply_finished(start, 100, 12.0)
    assert f.speeds == {2: 12.0}
    looks.others = 1.0
    start = looks.clock.now
    for _ in range(2):
        f.step()
    f.reply_finished(start, 100, 3.0)
    assert f.speeds == {2: 12.0}, "a reply beside a busy program says nothing of the speed alone"
    assert f.reply_tokens < 256
    looks.others = 0.0
    start = looks.clock.now
    for _ in range(2):
        f.step()
    f.reply_finished(start, 1, 4000.0)  # one token: llama-server's timer says thousands a second
    assert f.speeds == {2: 12.0}, "a reply too short to time is not a speed"


def test_the_lookout_counts_other_programs_not_the_child() -> None:
    """A busy program counted as another program by one lookout and as the child by another, looked at side by
    side: what the second leaves out is what the program used (whatever else the machine runs)."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        others = CpuLookout(lambda: None)
        child = CpuLookout(lambda: busy.pid)
        others.look()
        child.look()
        seen: list[float] = []

        def differs() -> bool:
            a, b = others.look(), child.look()
            assert a is not None and b is not None
            seen.append(a.others - b.others)
            return sum(seen[-4:]) / len(seen[-4:]) >= 0.5 and len(seen) >= 4

        wait_until(differs, "the busy program's CPU time counted as the child's")
    finally:
        busy.kill()
        busy.wait()


def test_a_new_child_starts_the_count_again() -> None:
    pid: list[int | None] = [None]
    lookout = CpuLookout(lambda: pid[0])
    lookout.look()
    assert lookout.look() is not None
    pid[0] = 1  # init: another pid than before
    assert lookout.look() is None


@pytest.mark.parametrize("held", [0, 1])
def test_the_gate_drains_or_gives_up(held: int) -> None:
    gate = RequestGate()
    inside = threading.Event()
    leave = threading.Event()

    def request() -> None:
        with gate.request():
            inside.set()
            leave.wait(60)

    t = threading.Thread(target=request)
    if held:
        t.start()
        inside.wait(60)
    with gate.exclusive(0.0 if held else 5.0) as drained:
        assert drained is (not held)
    leave.set()
    if held:
        t.join(60)
    with gate.request():
        assert gate.inside == 1
