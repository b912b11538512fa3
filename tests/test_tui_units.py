"""The TUI's pure pieces: thinking split across chunks, memory bars, status and progress lines, chat command."""

from __future__ import annotations

import pytest

from clover_local.cli import main
from clover_local.engine.types import GenerationStats
from clover_local.fetch.progress import DownloadProgress
from clover_local.plan.types import DeviceMemory
from clover_local.tui.screens.chat import format_status
from clover_local.tui.screens.download import describe_progress
from clover_local.tui.thinking import ThinkSplitter, strip_thinking
from clover_local.tui.widgets.memory import memory_segments


def _feed_all(chunks: list[str]) -> tuple[str, str, list[tuple[str, str]]]:
    s = ThinkSplitter()
    parts = [p for c in chunks for p in s.feed(c)] + s.flush()
    return s.thinking, s.answer, parts


@pytest.mark.parametrize("cut", range(1, 30))
def test_thinking_is_split_wherever_the_chunks_break(cut: int) -> None:
    text = "<think>plan: say hi</think>Hello <b>there</b>"
    chunks = [text[i : i + cut] for i in range(0, len(text), cut)]
    thinking, answer, parts = _feed_all(chunks)
    assert thinking == "plan: say hi"
    assert answer == "Hello <b>there</b>"
    assert "".join(t for p, t in parts if p == "answer") == answer


def test_text_that_only_looks_like_a_tag_is_kept() -> None:
    thinking, answer, _ = _feed_all(["a <thin", "k of it", " <"])
    assert (thinking, answer) == ("", "a <think of it <")
    assert strip_thinking("<think>x</think>y") == "y"


def test_memory_bar_is_exactly_as_wide_as_asked() -> None:
    gib = 1 << 30
    d = DeviceMemory("gpu0", 24 * gib, weights_bytes=14 * gib, kv_cache_bytes=3 * gib, compute_bytes=gib)
    for width in (10, 37, 78, 118):
        cells = dict(memory_segments(d, width))
        assert sum(cells.values()) == width
        assert cells["weights"] > cells["kv"] > 0 and cells["free"] > 0
    over = DeviceMemory("ram", 8 * gib, weights_bytes=12 * gib)
    assert dict(memory_segments(over, 40)) == {"weights": 40}, "over capacity: no free cells"


def test_status_line_names_each_figure() -> None:
    stats = GenerationStats(
        prompt_tokens=30,
        completion_tokens=70,
        cached_tokens=0,
        ttft_s=0.25,
        prefill_tokens_per_s=300.0,
        decode_tokens_per_s=41.26,
        draft_acceptance=0.625,
    )
    assert format_status(stats, 4096) == "ready · tok/s 41.3 · TTFT 0.25s · ctx 100/4096 · draft 62%"
    assert format_status(None, 2048, generating=True).startswith("generating… (Esc stops) · tok/s -")


def test_progress_line_has_shard_speed_and_eta() -> None:
    p = DownloadProgress(
        "downloading",
        "q4/m-00002-of-00003.gguf",
        1,
        3,
        5_000_000,
        10_000_000,
        25_000_000,
        30_000_000,
        2_500_000.0,
        2.0,
    )
    line = describe_progress(p)
    # Binary units, as the plan screen shows memory and disk (the same units on every screen).
    assert line.startswith("Downloading · file 2 of 3: m-00002-of-00003.gguf · 23.8 MiB of 28.6 MiB")
    assert "2.4 MiB/s · ETA 00:02" in line


def test_chat_command_rejects_a_missing_file_in_words(capsys: pytest.CaptureFixture[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    assert main(["chat", "--model", str(tmp_path / "none.gguf")]) == 2
    assert "No GGUF file at" in capsys.readouterr().err
    (tmp_path / "notes.txt").write_text("x")
    assert main(["chat", "--model", str(tmp_path / "notes.txt")]) == 2
    assert "is not a .gguf file" in capsys.readouterr().err


def test_settings_say_when_greedy_sampling_makes_temperature_moot() -> None:
    from clover_local.tui.screens.modals import sampling_hint
    from clover_local.user_prefs import ModelSettings

    assert "temperature and top-p change nothing" in sampling_hint(ModelSettings(top_k=1, temperature=0.9))
    assert "top-k and top-p change nothing" in sampling_hint(ModelSettings(top_k=40, temperature=0.0))
    assert sampling_hint(ModelSettings(top_k=40, temperature=0.7)) == ""


def test_the_status_line_says_when_another_program_slows_the_model() -> None:
    from clover_local.engine.types import RunnerHealth, RunnerThreads

    fewer = RunnerHealth(threads=RunnerThreads(1, 2, others_busy=1.0, relaunches=1))
    said = format_status(None, 4096, runner=fewer)
    assert said.startswith("ready · tok/s - · ")  # the state and figures first, where people look for them
    assert said.endswith(" · another program is busy: 1 thread of 2")
    moving = RunnerHealth(threads=RunnerThreads(2, 2, relaunching=True))
    assert "restarting the model with other threads" in format_status(None, 4096, runner=moving)
    every = RunnerHealth(threads=RunnerThreads(2, 2))
    assert format_status(None, 4096, runner=every) == format_status(None, 4096, runner=RunnerHealth())
