"""``bench`` runs launches as decided: every launch its verbs open is what ``decide_launch`` gives for that launch's
request on its machine, and its settings are its plan's (``llama_settings``). A plan or request patched after the
decision (the speculation made to look unmeasured, a chat template swapped at opening) would show one launch and
load another. Tiny random GGUFs on the embedded engine, a few tokens each."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from clover_local import launch as launch_module
from clover_local.cli import main
from clover_local.launch import Launch, decide_launch
from clover_local.plan.llama_args import llama_settings
from clover_local.testing.models import tiny_model


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Launch]:
    """Every launch ``open_launch`` is given from here on, checked against its decision before it is loaded (a
    measurement made after loading changes what a later decision reads)."""
    seen: list[Launch] = []
    real: Callable[..., Any] = launch_module.open_launch

    def checked(launch: Launch, **kwargs: Any) -> Any:
        assert launch.settings == llama_settings(launch.plan), "settings not rendered from the plan"
        again = decide_launch(launch.request, machine=launch.machine)
        assert launch.plan == again.plan, "the plan opened is not the plan its request decides"
        assert launch.settings == again.settings
        seen.append(launch)
        return real(launch, **kwargs)

    monkeypatch.setattr(launch_module, "open_launch", checked)
    return seen


@pytest.mark.usefixtures("quiet_cpu")
def test_bench_verify_costs_measures_again_on_the_launch_as_decided(
    opened: list[Launch], capsys: pytest.CaptureFixture[str]
) -> None:
    """The second run finds the costs the first kept, so its plan says "measured": it is opened so, and measured
    again all the same (the probe is told to, the plan is not made to look unmeasured)."""
    args = ["bench", "verify-costs", "--model", str(tiny_model("llama")), "--ctx", "512", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(args) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["key"] == second["key"] and second["costs"][0] == 1.0
    assert [launch.plan.speculative.costs_source for launch in opened] == ["model", "measured"]


def test_bench_spec_modes_opens_each_mode_as_decided(opened: list[Launch]) -> None:
    """Each mode's launch is decided with no chat template (the workloads are plain prompts), on one machine;
    greedy sampling is asked per request, not patched into the launch's preset."""
    model = str(tiny_model("llama"))
    flags = "--rounds 1 --max-tokens 8 --ctx 2048 --threads 1 --workloads code_rewrite"
    args = ["bench", "spec-modes", "off,ngram", "--spec-engine", "embedded", "--model", model, *flags.split()]
    assert main(args) == 0
    assert [launch.plan.speculative.mode for launch in opened] == ["off", "ngram"]
    assert {launch.plan.chat_template for launch in opened} == {"completion"}
    assert len({id(launch.machine) for launch in opened}) == 1
