"""Batch threads: every planned core while the other programs leave them free, the decode threads while they
do not; and the thread count never changes the text."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from waiting import wait_until

from clover_local.engine.batch_threads import (
    SLACK_CORES,
    BatchThreads,
    CpuSample,
    batch_threads_for,
    others_busy_cores,
)


def test_other_programs_cpu_is_the_machines_less_this_processs() -> None:
    before = CpuSample(at=10.0, busy_s=100.0, mine_s=40.0)
    after = CpuSample(at=12.0, busy_s=103.0, mine_s=41.0)  # 3 CPU-s in 2 s, 1 of them ours
    assert others_busy_cores(before, after) == pytest.approx(1.0)
    assert others_busy_cores(after, after) == 0.0
    assert others_busy_cores(before, CpuSample(12.0, 100.5, 41.0)) == 0.0  # ticks are coarse: never negative


@pytest.mark.parametrize(
    ("threads", "batch", "cpus", "others", "chosen"),
    [
        (1, 2, 2, 0.0, 2),  # idle 2-core machine: both cores for batches
        (1, 2, 2, SLACK_CORES, 2),  # a terminal redrawing leaves them free
        (1, 2, 2, 0.9, 1),  # one busy program: back to the decode thread
        (7, 8, 8, 0.5, 7),
        (15, 16, 32, 1.0, 16),  # hyperthreads: one busy program leaves 16 logical CPUs free
        (2, 2, 2, 2.0, 2),  # nothing to switch when batches get no more threads than decoding
    ],
)
def test_all_batch_threads_only_when_the_others_leave_the_cores_free(
    threads: int, batch: int, cpus: int, others: float, chosen: int
) -> None:
    assert batch_threads_for(threads, batch, cpus, others) == chosen


def test_the_guard_looks_at_most_every_quarter_second_and_switches_both_ways() -> None:
    now = [0.0]
    busy = [0.0]
    applied: list[tuple[int, int]] = []

    def sample() -> CpuSample:
        return CpuSample(now[0], busy[0], 0.0)

    guard = BatchThreads(
        lambda t, tb: applied.append((t, tb)), 1, 2, sample=sample, clock=lambda: now[0], n_cpus=2
    )
    assert guard.before_batch() == 2 and applied == []
    now[0], busy[0] = 1.0, 1.0  # another program used a whole core
    assert guard.before_batch() == 1 and applied == [(1, 1)]
    now[0], busy[0] = 1.1, 1.1
    assert guard.before_batch() == 1  # too soon to look again
    now[0], busy[0] = 2.0, 1.1  # quiet again
    assert guard.before_batch() == 2 and applied == [(1, 1), (1, 2)] and guard.switches == 2
    now[0], busy[0] = 3.0, 2.1
    with guard.pinned(2):  # measuring the plan's own costs: all threads, whatever the load
        assert guard.current == 2 and guard.before_batch() == 2
    assert BatchThreads(lambda t, tb: applied.append((t, tb)), 2, 2, sample=sample).before_batch() == 2


@pytest.mark.slow
def test_busy_programs_on_every_core_take_the_batch_threads_back() -> None:
    import psutil

    applied: list[tuple[int, int]] = []
    guard = BatchThreads(lambda t, tb: applied.append((t, tb)), 1, psutil.cpu_count(logical=True) or 2)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(guard.threads_batch)]
    try:
        wait_until(lambda: guard.before_batch() == 1, "the batch threads dropped to the decode thread", 120)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert applied[-1] == (1, 1)


@pytest.mark.slow
def test_the_thread_count_never_changes_the_text(gemma_path: Path) -> None:
    from helpers_engine import generate_text

    from clover_local import runtime
    from clover_local.engine.loader import load_engine
    from clover_local.engine.types import GenerationRequest
    from clover_local.plan.llama_args import llama_cpp_kwargs
    from clover_local.presets import load_preset
    from clover_local.testing.spec_workloads import WORKLOADS

    preset = load_preset("gemma3-270m")
    plan, _ = runtime.plan_for(preset, model=gemma_path, ctx=2048)
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
            with engine.batch_threads.pinned(threads_batch):  # exactly these threads, whatever else runs
                for speculative in (False, True):
                    texts[threads_batch, speculative] = generate_text(
                        engine, replace(request, speculative=speculative)
                    )[0]
        finally:
            engine.close()
    assert texts[1, False] and texts[2, False] == texts[1, False]  # prompt processing on 1 or 2 threads
    assert texts[2, True] == texts[1, True]  # verification batches on 1 or 2 threads
