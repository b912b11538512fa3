"""When a llama-server child that stopped unasked is started again: the pure decision, as a table of stop times."""

from __future__ import annotations

import pytest

from clover_local.llamacpp.restart_policy import RestartPolicy, next_restart

POLICY = RestartPolicy(backoff_s=(0.5, 2.0, 5.0), max_stops=3, window_s=300.0)


@pytest.mark.parametrize(
    ("stops", "now", "delay"),
    [
        ((100.0,), 100.0, 0.5),  # the first stop: soon
        ((100.0, 110.0), 110.0, 2.0),  # the second within the window: later
        ((100.0, 110.0, 120.0), 120.0, 5.0),  # the third: later still
        ((100.0, 110.0, 120.0, 130.0), 130.0, None),  # the fourth within 300 s: given up
        ((100.0, 110.0, 120.0, 500.0), 500.0, 0.5),  # the old ones are out of the window: starts afresh
        ((0.0, 350.0, 360.0), 360.0, 2.0),
    ],
)
def test_restarts_back_off_then_stop(stops: tuple[float, ...], now: float, delay: float | None) -> None:
    decision = next_restart(POLICY, stops, now)
    assert decision.delay_s == delay
    if delay is None:
        assert "4 times within 300 s" in decision.why


def test_out_of_memory_is_never_retried_on_the_same_argv() -> None:
    decision = next_restart(POLICY, (100.0,), 100.0, out_of_memory=True)
    assert decision.delay_s is None
    assert "out of memory" in decision.why


def test_the_last_back_off_repeats() -> None:
    policy = RestartPolicy(backoff_s=(1.0,), max_stops=5)
    assert [next_restart(policy, [0.0] * n, 0.0).delay_s for n in range(1, 7)] == [1.0] * 5 + [None]
