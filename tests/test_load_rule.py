"""The relaunch rule of a llama-server child that follows the load (``llamacpp.load_rule``): load sequences in,
relaunch or not out, and no flapping. Pure: no clock, no process."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import pytest

from clover_local.llamacpp.load_rule import (
    DOWN_AFTER_S,
    MIN_GAP_S,
    THREAD_EXPONENT,
    UP_AFTER_LAUNCH_S,
    UP_AFTER_S,
    LoadLook,
    RelaunchInputs,
    relaunch_choice,
    speed_alone,
    speed_beside,
)

TICK = 0.5


def run(
    load: Callable[[float], float],
    seconds: float,
    *,
    planned: int = 2,
    start: int = 2,
    n_cpus: int = 2,
    cost_s: float = 1.0,
    reply_tokens: float = 256.0,
    speeds: dict[int, float] | None = None,
) -> list[tuple[float, int]]:
    """Drive the rule as ``load_follow.LoadFollower.step`` does, every half second: the (time, threads) of every
    relaunch it asks for."""
    current, last_at = start, None
    looks: list[LoadLook] = []
    relaunches: list[tuple[float, int]] = []
    t = 0.0
    while t < seconds:
        t += TICK
        looks.append(LoadLook(t, load(t)))
        looks = [look for look in looks if t - look.at <= 30]
        choice = relaunch_choice(
            RelaunchInputs(
                planned=planned,
                current=current,
                n_cpus=n_cpus,
                looks=tuple(looks),
                now=t,
                last_relaunch_at=last_at,
                relaunch_cost_s=cost_s,
                next_reply_tokens=reply_tokens,
                speeds=speeds if speeds is not None else {2: 10.0, 1: 9.0},
            )
        )
        if choice.verdict != "keep":
            assert choice.threads != current
            current, last_at = choice.threads, t
            relaunches.append((t, current))
            looks = []  # as the follower does: looks beside the old child are dropped
    return relaunches


def test_an_idle_machine_never_relaunches() -> None:
    assert run(lambda t: 0.05, 300) == []


def test_a_program_busy_after_the_launch_takes_a_core_once() -> None:
    out = run(lambda t: 1.0 if t >= 20 else 0.0, 300)
    assert len(out) == 1
    at, threads = out[0]
    assert threads == 1
    assert 20 + DOWN_AFTER_S <= at <= 20 + 2 * DOWN_AFTER_S


def test_the_core_comes_back_when_the_program_stops_and_stays() -> None:
    out = run(lambda t: 1.0 if 20 <= t < 80 else 0.0, 300)
    assert [threads for _, threads in out] == [1, 2]
    back_at = out[1][0]
    assert back_at >= 80 + UP_AFTER_S * 0.75


def test_a_launch_that_gave_a_core_up_to_a_spike_takes_it_back_within_seconds() -> None:
    """The launch saw another program busy (one look, as it stopped) and started with 1 thread of 2; the machine
    is idle from then on: the core comes back after UP_AFTER_LAUNCH_S, not UP_AFTER_S, and stays."""
    out = run(lambda t: 0.0, 120, start=1)
    assert [threads for _, threads in out] == [2]
    assert UP_AFTER_LAUNCH_S * 0.75 <= out[0][0] <= UP_AFTER_LAUNCH_S * 2 < UP_AFTER_S


def test_a_launch_beside_a_program_that_stays_busy_keeps_its_one_thread() -> None:
    assert run(lambda t: 1.0, 300, start=1) == []
    out = run(lambda t: 1.0 if t < 40 else 0.0, 120, start=1)
    assert [threads for _, threads in out] == [2]
    assert 40 + UP_AFTER_LAUNCH_S * 0.75 <= out[0][0] <= 40 + UP_AFTER_LAUNCH_S * 2


def test_after_a_relaunch_taking_cores_back_waits_the_whole_window() -> None:
    """The short window is the launch's alone: a child the follower itself started with fewer threads waits
    UP_AFTER_S of free cores, so a load that comes and goes does not flap."""
    out = run(lambda t: 0.0 if t < 5 else (1.0 if t < 30 else 0.0), 120, start=1)
    assert [threads for _, threads in out] == [2, 1, 2]
    assert out[2][0] >= 30 + UP_AFTER_S * 0.75


def test_a_spike_shorter_than_the_window_changes_nothing() -> None:
    assert run(lambda t: 1.5 if 30 <= t < 31 else 0.0, 120) == []


def test_a_load_at_the_edge_does_not_flap() -> None:
    """Others at 0.15 / 0.3 cores, alternating every look: past SLACK_CORES going down on some looks, but not on
    all of them; not under UP_SLACK_CORES going up: threads stay."""
    assert run(lambda t: 0.3 if int(t / TICK) % 2 else 0.15, 300) == []
    assert run(lambda t: 0.3 if int(t / TICK) % 2 else 0.15, 300, start=1) == []


def test_a_load_between_the_two_slacks_keeps_either_count() -> None:
    assert run(lambda t: 0.2, 120, start=2) == []
    assert run(lambda t: 0.2, 120, start=1) == []


def test_a_load_that_comes_and_goes_relaunches_at_most_once_per_gap() -> None:
    def on_off(t: float) -> float:
        return 1.0 if int(t / 12) % 2 else 0.0

    out = run(on_off, 600)
    assert len(out) <= 600 / MIN_GAP_S
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(out)]
    assert all(gap >= MIN_GAP_S for gap in gaps)


def test_taking_cores_back_that_gain_less_than_the_relaunch_costs_is_not_done() -> None:
    """Idle again at 1 thread: 2 threads would save 3 x (256/9 - 256/10) = 8.5 s over the next three replies,
    less than a 30 s relaunch (a large model loading from a slow disk)."""
    out = run(lambda t: 1.0 if t < 20 else 0.0, 200, start=1, cost_s=30.0)
    assert out == []
    looks = tuple(LoadLook(t / 2, 0.0) for t in range(1, 40))
    choice = relaunch_choice(RelaunchInputs(2, 1, 2, looks, 20.0, None, 30.0, 256.0, {2: 10.0, 1: 9.0}))
    assert (choice.verdict, choice.code) == ("keep", "not-worth-it")
    assert "less than the 30.0 s" in choice.why


def test_giving_a_core_up_pays_even_when_a_relaunch_is_slow() -> None:
    """Beside a busy program 2 threads run at CONTENDED of their speed: a 256-token reply at 2.5 tokens/s
    against 9: 74 s saved, more than a 30 s relaunch."""
    out = run(lambda t: 1.0, 60, cost_s=30.0)
    assert [threads for _, threads in out] == [1]


def test_a_short_reply_does_not_pay_for_a_slow_relaunch() -> None:
    assert run(lambda t: 1.0, 60, cost_s=30.0, reply_tokens=8) == []


def test_nothing_is_decided_before_the_load_was_watched_long_enough() -> None:
    choice = relaunch_choice(RelaunchInputs(2, 2, 2, (LoadLook(0.5, 1.0),), 0.5, None, 1.0, 256.0, {2: 10.0}))
    assert (choice.verdict, choice.code) == ("keep", "too-few-looks")


def test_more_cores_than_threads_planned_are_never_taken() -> None:
    assert run(lambda t: 0.0, 120, planned=4, start=4, n_cpus=16) == []
    out = run(lambda t: 14.0 if t > 10 else 0.0, 120, planned=4, start=4, n_cpus=16)
    assert [threads for _, threads in out] == [2]


@pytest.mark.parametrize(("threads", "expected"), [(2, 10.0), (1, 10.0 * 0.5**THREAD_EXPONENT)])
def test_speed_alone_scales_from_the_count_seen(threads: int, expected: float) -> None:
    assert speed_alone(threads, {2: 10.0}) == pytest.approx(expected)


def test_a_thread_without_a_core_of_its_own_is_slow() -> None:
    assert speed_beside(2, 2, 1.0, {2: 10.0, 1: 9.0}) < speed_beside(1, 2, 1.0, {2: 10.0, 1: 9.0})
    assert speed_beside(2, 2, 0.0, {2: 10.0, 1: 9.0}) == 10.0
