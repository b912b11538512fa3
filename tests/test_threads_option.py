"""``--threads N`` means the same on every command that takes it: a whole number, 1 or more, and the plan's most."""

from __future__ import annotations

import json

import pytest

from clover_local.cli import main


@pytest.mark.parametrize("command", ["plan", "command", "serve", "run", "bench", "worker"])
@pytest.mark.parametrize("value", ["0", "-2", "two"])
def test_a_thread_count_that_is_not_a_positive_number_is_refused_by_name(
    command: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--threads", value])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --threads" in err and ("1 or more" in err or "not a number" in err)


def test_plan_holds_the_threads_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--simulate", "ram=16G,cpu=8", "--threads", "3", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["threads"] == 3
