"""The thread decision (one function, both engines): one core is left to the rest of the machine."""

from __future__ import annotations

import pytest

from clover_local.detect import parse_simulate
from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
from clover_local.plan.planner import make_plan
from clover_local.plan.threads import plan_threads
from clover_local.plan.types import Wishes
from clover_local.presets import load_preset


@pytest.mark.parametrize(
    ("physical", "logical", "wanted", "threads", "batch"),
    [
        (1, 1, None, 1, 1),
        (2, 2, None, 1, 2),  # the 2-core machine: one thread decodes, one core stays free; batches get both
        (4, 8, None, 3, 4),
        (8, 8, None, 7, 8),
        (16, 32, None, 15, 16),
        (2, 2, 2, 2, 2),  # --threads is honoured
        (8, 16, 4, 4, 8),
        (8, 16, 12, 12, 12),  # more threads asked than physical cores: batches get as many
        (0, 0, None, 1, 1),  # a machine that reports nothing still gets a thread
    ],
)
def test_one_core_is_left_free_for_generation_and_batches_get_every_physical_core(
    physical: int, logical: int, wanted: int | None, threads: int, batch: int
) -> None:
    chosen = plan_threads(physical, logical, wanted)
    assert (chosen.threads, chosen.threads_batch) == (threads, batch)
    assert f"{threads} thread" in chosen.reason


def test_both_engines_get_the_same_threads_from_the_plan() -> None:
    plan = make_plan(parse_simulate("ram=16G,cpu=2"), load_preset("gemma3-270m"), None, Wishes(ctx=2048))
    argv = llama_server_args(plan)
    kwargs = llama_cpp_kwargs(plan)
    assert argv[argv.index("-t") + 1] == "1" and kwargs["n_threads"] == 1
    assert argv[argv.index("-tb") + 1] == "1" and kwargs["n_threads_batch"] == 2  # llama-server: no guard
    assert any("spin-wait" in r for r in plan.reasons)
