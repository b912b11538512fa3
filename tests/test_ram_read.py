"""The RAM read-rate probe behind the decode prediction (``detect.ram_read``, issue 48): against a fake clock (what
it computes), kept per machine and measured again when the machine changes, and one real run."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from clover_local.detect.probe import ProbeInputs, detect_machine
from clover_local.detect.ram_read import (
    KEEP_FILE,
    RamRead,
    keep_ram_read,
    kept_ram_read,
    measure_ram_read,
    ram_read_here,
)
from clover_local.detect.simulate import parse_simulate
from clover_local.plan.speed import LLAMA_READ_SHARE, predict_tokens_per_s, ram_read_rate


class FakeMemory:
    """A clock that a read of N bytes moves on by N / ``rate`` seconds (``parallel`` reads overlap)."""

    def __init__(self, rate: float) -> None:
        self.now = 0.0
        self.rate = rate
        self.reads: list[int] = []

    def clock(self) -> float:
        return self.now

    def buffer(self) -> Any:
        return np.zeros(1024, dtype=np.float32)

    def read(self, view: Any) -> object:
        self.reads.append(int(view.nbytes))
        self.now += view.nbytes / self.rate
        return 0


def test_the_probe_reports_bytes_per_second_of_the_reads() -> None:
    fake = FakeMemory(rate=12e9)
    got = measure_ram_read(1, "m", clock=fake.clock, make_buffer=fake.buffer, read=fake.read)
    assert got.one_thread == pytest.approx(12e9)
    assert got.all_threads == pytest.approx(12e9)
    assert got.threads == 1 and got.machine == "m" and got.quiet


def test_every_thread_reads_its_own_part_of_the_buffer() -> None:
    fake = FakeMemory(rate=10e9)
    got = measure_ram_read(
        4, "m", clock=fake.clock, make_buffer=fake.buffer, read=fake.read, others_busy=lambda: 1.5
    )
    assert sorted(set(fake.reads)) == [
        1024,
        4096,
    ]  # a quarter of the buffer each, and the whole on one thread
    assert got.threads == 4 and not got.quiet and got.others_busy == 1.5


def test_a_rate_is_each_thread_alone_up_to_what_all_read_together() -> None:
    read = RamRead(10e9, 25e9, 4, "m", "2026-12-06")
    assert read.rate(1) == 10e9
    assert read.rate(2) == 20e9
    assert read.rate(4) == 25e9
    assert read.rate(16) == 25e9


def _measured(rate: float, machine: str = "m", busy: float = 0.0) -> RamRead:
    return RamRead(rate, rate * 2, 2, machine, time.strftime("%Y-%m-%d"), busy)  # taken today


def test_measured_once_then_kept(tmp_path: Path) -> None:
    calls: list[str] = []

    def measure(threads: int, machine: str) -> RamRead:
        calls.append(machine)
        return _measured(9e9, machine)

    first = ram_read_here(tmp_path, "m", 2, measure=measure)
    again = ram_read_here(tmp_path, "m", 2, measure=measure)
    assert first == again and calls == ["m"]
    assert json.loads((tmp_path / KEEP_FILE).read_text())["one_thread"] == 9e9


def test_another_machine_measures_again(tmp_path: Path) -> None:
    keep_ram_read(tmp_path, _measured(9e9, "old machine"))
    assert kept_ram_read(tmp_path, "new machine") is None
    got = ram_read_here(tmp_path, "new machine", 2, measure=lambda t, m: _measured(20e9, m))
    assert got.one_thread == 20e9
    assert kept_ram_read(tmp_path, "new machine") == got


def test_a_busy_measurement_is_used_but_not_kept(tmp_path: Path) -> None:
    got = ram_read_here(tmp_path, "m", 2, measure=lambda t, m: _measured(3e9, m, busy=1.0))
    assert got.one_thread == 3e9 and not got.quiet
    assert kept_ram_read(tmp_path, "m") is None


def test_a_low_reading_does_not_stay_the_machines_figure(tmp_path: Path) -> None:
    """Another program's memory traffic only lowers a read: a kept figure from an earlier day is measured again,
    and the best quiet one stays (a low one is replaced, a high one is not lowered)."""
    low = replace(_measured(5e9, "m"), date="2026-01-01")
    keep_ram_read(tmp_path, low)
    got = ram_read_here(tmp_path, "m", 2, measure=lambda t, m: _measured(9e9, m))
    assert got.all_threads == _measured(9e9, "m").all_threads
    assert kept_ram_read(tmp_path, "m") == got
    keep_ram_read(tmp_path, replace(got, date="2026-01-02"))
    again = ram_read_here(tmp_path, "m", 2, measure=lambda t, m: _measured(4e9, m))
    assert again.all_threads == got.all_threads and again.date == _measured(4e9, "m").date
    busy = ram_read_here(tmp_path, "m", 2, measure=lambda t, m: _measured(1e9, m, busy=1.0))
    assert busy == again  # kept today: not measured again


@pytest.mark.parametrize("text", ["", "not json", "[]", '{"one_thread": 1}', '{"machine": "m"}'])
def test_a_damaged_file_is_measured_again(tmp_path: Path, text: str) -> None:
    (tmp_path / KEEP_FILE).write_text(text)
    got = ram_read_here(tmp_path, "m", 2, measure=lambda t, m: _measured(8e9, m))
    assert got.one_thread == 8e9


def test_a_real_run_on_this_machine() -> None:
    got = measure_ram_read(2, "here")
    assert got.one_thread > 1e8 and got.all_threads >= got.one_thread
    assert got.others_busy == 0.0  # not asked here


def test_detection_carries_the_kept_figure() -> None:
    """The test session keeps this machine's figure in every test's data folder (conftest), as a person's first
    plan does: detection reads it back."""
    machine = detect_machine()
    assert machine.memory.ram_read is not None
    assert any(p.name == "ram-read" and p.ok for p in machine.probes)
    quiet = detect_machine(inputs=ProbeInputs(ram_read=lambda cpu, mem: None))
    assert quiet.memory.ram_read is None


def test_the_prediction_follows_the_measured_rate_and_says_so() -> None:
    base = parse_simulate("ram=32G,cpu=4")
    slow = replace(base, memory=replace(base.memory, ram_read=RamRead(5e9, 10e9, 4, "m", "2026-12-06")))
    fast = replace(base, memory=replace(base.memory, ram_read=RamRead(10e9, 20e9, 4, "m", "2026-12-06")))
    rate, source = ram_read_rate(fast, 2)
    assert rate == pytest.approx(20e9 * LLAMA_READ_SHARE)
    assert "measured 2026-12-06" in source
    # Both figures, so the rate the plan uses (half) is not read as the one measured
    assert "50%, of the 20 GB/s 2 threads streamed" in source
    assert "not measured" in ram_read_rate(base, 2)[1]
    slow_tps, _ = predict_tokens_per_s(slow, [], 2e9, threads=2)
    fast_tps, notes = predict_tokens_per_s(fast, [], 2e9, threads=2)
    assert fast_tps == pytest.approx(2 * slow_tps, rel=0.01)
    assert "measured 2026-12-06" in notes[0]
