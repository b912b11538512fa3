"""The thread decision (one function, both engines): every physical core while the other programs leave them
free, fewer while they do not; the embedded engine decides between steps, llama-server once, at launch."""

from __future__ import annotations

import pytest

from clover_local.detect import parse_simulate
from clover_local.detect.cpu_load import CpuSample
from clover_local.detect.probe import ProbeInputs, detect_machine
from clover_local.errors import UsageError
from clover_local.plan.llama_args import llama_cpp_kwargs, llama_server_args
from clover_local.plan.planner import make_plan
from clover_local.plan.threads import SLACK_CORES, plan_threads, threads_for_load
from clover_local.plan.types import Wishes
from clover_local.presets import load_preset


@pytest.mark.parametrize(
    ("threads", "batch", "cpus", "others", "chosen"),
    [
        (2, 2, 2, 0.0, (2, 2)),  # idle 2-core machine: both cores decode and batch
        (2, 2, 2, SLACK_CORES, (2, 2)),  # a terminal redrawing leaves them free
        (2, 2, 2, 0.9, (1, 1)),  # one busy program: one thread
        (2, 2, 2, 2.0, (1, 1)),  # both cores busy: never fewer than one
        (8, 8, 8, 0.5, (7, 7)),
        (8, 8, 8, 3.3, (4, 4)),  # three busy programs and a bit: four cores left
        (16, 16, 32, 1.0, (16, 16)),  # hyperthreads: one busy program leaves 31 logical CPUs
        (4, 8, 8, 2.0, (4, 6)),  # --threads 4: the most for decoding; batches keep their own most
        (4, 8, 8, 6.0, (2, 2)),  # both follow the load; batches never below the decode threads
        (1, 1, 1, 0.0, (1, 1)),
    ],
)
def test_threads_follow_the_other_programs_load(
    threads: int, batch: int, cpus: int, others: float, chosen: tuple[int, int]
) -> None:
    assert threads_for_load(threads, batch, cpus, others) == chosen


@pytest.mark.parametrize(
    ("physical", "logical", "wanted", "threads", "batch"),
    [
        (1, 1, None, 1, 1),
        (2, 2, None, 2, 2),  # the 2-core machine: both cores, given back between steps while others are busy
        (4, 8, None, 4, 4),
        (16, 32, None, 16, 16),
        (8, 16, 4, 4, 8),  # --threads is the most for decoding
        (8, 16, 12, 12, 12),  # more threads asked than physical cores: batches get as many
        (0, 0, None, 1, 1),  # a machine that reports nothing still gets a thread
    ],
)
def test_the_embedded_engine_plans_every_physical_core(
    physical: int, logical: int, wanted: int | None, threads: int, batch: int
) -> None:
    chosen = plan_threads(physical, logical, wanted)
    assert (chosen.threads, chosen.threads_batch) == (threads, batch)
    count = f"{threads} thread{'' if threads == 1 else 's'}"  # '1 thread', not '1 threads'
    assert count in chosen.reason and "gives cores back" in chosen.reason


@pytest.mark.parametrize(
    ("physical", "logical", "wanted", "others", "threads", "said"),
    [
        (2, 2, None, None, 2, "not measured"),
        (2, 2, None, 0.1, 2, "used 0.1 cores"),
        (2, 2, None, 1.0, 1, "used 1.0 cores"),
        (8, 8, None, 2.5, 5, "used 2.5 cores"),
        (8, 16, None, 2.5, 8, "used 2.5 cores"),  # hyperthreads left free
        (8, 8, 3, 7.0, 3, "as asked"),  # --threads: exactly that, whatever the load
    ],
)
def test_llama_server_gets_the_threads_the_load_measured_at_launch_leaves(
    physical: int, logical: int, wanted: int | None, others: float | None, threads: int, said: str
) -> None:
    chosen = plan_threads(physical, logical, wanted, engine="llama-server", others_busy=others)
    assert (chosen.threads, chosen.threads_batch) == (threads, threads)
    assert said in chosen.reason
    if wanted:
        assert "fixed at launch" in chosen.reason
    else:
        assert "starts it again between requests with the threads the load allows" in chosen.reason


def test_both_engines_get_their_threads_from_the_plan() -> None:
    preset = load_preset("gemma3-270m")
    embedded = make_plan(parse_simulate("ram=16G,cpu=2,busy=1"), preset, None, Wishes(ctx=2048))
    kwargs = llama_cpp_kwargs(embedded)
    # the most: the engine follows the load
    assert kwargs["n_threads"] == 2 and kwargs["n_threads_batch"] == 2
    server = make_plan(
        parse_simulate("ram=16G,cpu=2,busy=1"), preset, None, Wishes(ctx=2048, engine="llama-server")
    )
    argv = llama_server_args(server)
    assert argv[argv.index("-t") + 1] == "1" and argv[argv.index("-tb") + 1] == "1"
    assert any("used 1.0 cores" in r.text for r in server.reasons)
    idle = make_plan(parse_simulate("ram=16G,cpu=2"), preset, None, Wishes(ctx=2048, engine="llama-server"))
    argv = llama_server_args(idle)
    assert argv[argv.index("-t") + 1] == "2" and argv[argv.index("-tb") + 1] == "2"


def test_the_probe_measures_the_other_programs_load() -> None:
    # Two samples a second apart: the machine used 1.5 CPU-s, this process 0.5 of them.
    samples = iter([CpuSample(10.0, 100.0, 5.0), CpuSample(11.0, 101.5, 5.5)])
    machine = detect_machine(inputs=ProbeInputs(sample_cpu=lambda: next(samples)))
    assert machine.cpu.others_busy_cores == pytest.approx(1.0)


def test_a_simulated_load_must_be_a_number() -> None:
    with pytest.raises(UsageError, match="busy"):
        parse_simulate("cpu=4,busy=lots")
    assert parse_simulate("cpu=4").cpu.others_busy_cores is None
