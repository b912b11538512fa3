"""Batch threads: every planned core while the other programs leave them free, the decode threads while they
do not; and the thread count never changes the text."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from waiting import wait_until

from clover_local.detect.cpu_load import CpuSample, others_busy_cores
from clover_local.engine.batch_threads import LoadThreads


def test_other_programs_cpu_is_the_machines_less_this_processs() -> None:
    before = CpuSample(at=10.0, busy_s=100.0, mine_s=40.0)
    after = CpuSample(at=12.0, busy_s=103.0, mine_s=41.0)  # 3 CPU-s in 2 s, 1 of them ours
    assert others_busy_cores(before, after) == pytest.approx(1.0)
    assert others_busy_cores(after, after) == 0.0
    assert others_busy_cores(before, CpuSample(12.0, 100.5, 41.0)) == 0.0  # ticks are coarse: never negative


class _Load:
    """A machine whose other programs use ``busy`` cores from now on, one second per look."""

    def __init__(self) -> None:
        self.now = 0.0
        self.busy_s = 0.0
        self.busy = 0.0

    def sample(self) -> CpuSample:
        return CpuSample(self.now, self.busy_s, 0.0)

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.busy_s += self.busy * seconds


def test_the_guard_looks_at_most_every_quarter_second_and_switches_both_ways() -> None:
    load = _Load()
    applied: list[tuple[int, int]] = []
    guard = LoadThreads(
        lambda t, tb: applied.append((t, tb)), 2, 2, sample=load.sample, clock=lambda: load.now, n_cpus=2
    )
    assert guard.before_step() == (2, 2) and applied == []
    load.busy = 1.0  # another program uses a whole core
    load.advance(1.0)
    assert guard.before_step() == (1, 1) and applied == [(1, 1)]
    load.busy = 0.0
    load.advance(0.1)
    assert guard.before_step() == (1, 1)  # too soon to look again
    load.advance(0.9)  # quiet again
    assert guard.before_step() == (2, 2) and applied == [(1, 1), (2, 2)] and guard.switches == 2
    load.busy = 1.0
    load.advance(1.0)
    with guard.pinned(2):  # measuring the plan's own costs: all threads, whatever the load
        assert guard.current == (2, 2) and guard.before_step() == (2, 2)


def test_a_look_that_began_while_the_engine_was_idle_decides_nothing() -> None:
    """Between requests the engine does not look: a burst of other work then (a client writing its request, a
    process exiting) must not take a thread from the next request; the quarter second after it decides."""
    load = _Load()
    applied: list[tuple[int, int]] = []
    guard = LoadThreads(
        lambda t, tb: applied.append((t, tb)), 2, 2, sample=load.sample, clock=lambda: load.now, n_cpus=2
    )
    load.busy = 1.5  # a burst while no request ran
    load.advance(3.0)
    load.busy = 0.0
    assert guard.before_step() == (2, 2) and applied == []  # a window of 3 s: not a reading of now
    load.advance(0.3)
    assert guard.before_step() == (2, 2) and applied == []  # the fresh window was quiet
    load.busy = 1.0  # busy from now on: the next fresh look takes a thread back
    load.advance(0.3)
    assert guard.before_step() == (1, 1) and applied == [(1, 1)]
    load.advance(5.0)  # idle a long time while it stayed busy: keeps one thread until it looks again
    assert guard.before_step() == (1, 1)
    load.advance(0.3)
    assert guard.before_step() == (1, 1) and applied == [(1, 1)]


@pytest.mark.slow
def test_busy_programs_on_every_core_take_the_threads_back() -> None:
    import psutil

    applied: list[tuple[int, int]] = []
    n = psutil.cpu_count(logical=True) or 2
    guard = LoadThreads(lambda t, tb: applied.append((t, tb)), n, n)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        wait_until(lambda: guard.before_step() == (1, 1), "the threads dropped to one", 120)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert applied[-1] == (1, 1)


@pytest.mark.slow
def test_threads_that_change_between_steps_never_change_the_text(smollm2_path: Path) -> None:
    """The same engine, the same greedy request: once on one fixed thread, once with the threads switching
    between one and two at every step (prompt batches and one-token steps alike, as the load would)."""
    from helpers_engine import generate_text
    from llama_cpp import llama_cpp as C

    from clover_local.engine.embedded import EmbeddedEngine
    from clover_local.engine.types import ChatMessage, GenerationRequest
    from clover_local.launch import LaunchRequest, decide_launch, open_launch

    launch = decide_launch(LaunchRequest(preset="smollm2-135m", model=str(smollm2_path), ctx=1024))
    engine = open_launch(launch).engine
    assert isinstance(engine, EmbeddedEngine)
    request = GenerationRequest(
        messages=(ChatMessage("user", "Write a short story about a lighthouse keeper and a storm."),),
        max_tokens=48,
        temperature=0.0,
        speculative=False,
        cache_prompt=False,
    )
    try:
        with engine.threads.pinned(1):
            alone = generate_text(engine, request)[0]
        load = _Load()
        load.busy = 1.0  # busy at first: the first step drops to one thread
        ctx = engine._ctx
        applied: list[int] = []

        def apply(t: int, tb: int) -> None:
            C.llama_set_n_threads(ctx, t, tb)
            applied.append(int(C.llama_n_threads(ctx)))
            load.busy = 1.0 if t == 2 else 0.0  # the next look sees the load that switches back

        def clock() -> float:  # a second passes between steps: the guard looks before every one
            load.advance(1.0)
            return load.now

        engine.threads = LoadThreads(apply, 2, 2, sample=load.sample, clock=clock, n_cpus=2)
        switching = generate_text(engine, request)[0]
    finally:
        engine.close()
    assert alone and switching == alone
    assert applied.count(1) > 10 and applied.count(2) > 10  # llama.cpp really ran on both counts


@pytest.mark.slow
def test_the_thread_count_never_changes_the_text(gemma_path: Path) -> None:
    from helpers_engine import generate_text

    from clover_local.engine.loader import load_engine
    from clover_local.engine.types import GenerationRequest
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.plan.llama_args import llama_cpp_kwargs
    from clover_local.presets import load_preset
    from clover_local.testing.spec_workloads import WORKLOADS

    preset = load_preset("gemma3-270m")
    plan = decide_launch(LaunchRequest(preset, str(gemma_path), ctx=2048)).plan
    readme = next(w for w in WORKLOADS if w.name == "edit_readme")  # a reply that copies: drafts get verified
    request = GenerationRequest(prompt=readme.completion, max_tokens=40, temperature=0.0, stop=("```",))
    texts: dict[tuple[int, bool], str] = {}
    for threads_batch in (1, 2):
        sized = replace(plan, threads=1, threads_batch=threads_batch)
        engine = load_engine(
            gemma_path,
            llama_cpp_kwargs(sized),
            chat_template=plan.chat_template,
            speculative=plan.speculative,
        ).engine
        try:
            with engine.threads.pinned(1, threads_batch):  # exactly these threads, whatever else runs
                for speculative in (False, True):
                    texts[threads_batch, speculative] = generate_text(
                        engine, replace(request, speculative=speculative)
                    )[0]
        finally:
            engine.close()
    assert texts[1, False] and texts[2, False] == texts[1, False]  # prompt processing on 1 or 2 threads
    assert texts[2, True] == texts[1, True]  # verification batches on 1 or 2 threads
