#!/usr/bin/env python3
"""TUI benchmark: does the chat screen slow generation down, and how fast does the app paint?

    .venv/bin/python benchmarks/bench_tui.py --rounds 5 --tokens 128

1. Tokens shown per second: the same prompt, greedy, generated headless (``engine.generate`` in a loop) and in
   the chat screen (Textual app under Pilot, every token written through ``MarkdownStream`` to the screen),
   interleaved round by round on one loaded engine. Rate = completion tokens / (request -> last token shown).
   Ratio chat / headless; target >= 0.97.
2. First paint: ``clover-local chat --model <Gemma>`` and ``clover-local`` (plan screen) started in a real
   terminal (tmux); time from spawn until their first screen is visible in ``capture-pane``. Target < 1 s.

Prints a Markdown table; ``--out`` writes the JSON too.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

from clover_local import user_prefs
from clover_local.engine.types import ChatEngine, ChatMessage, Finished, GenerationRequest, TextDelta
from clover_local.launch import open_launch
from clover_local.presets import load_preset
from clover_local.testing.models import gemma_path
from clover_local.tui import services

_SOCKETS = itertools.count()
PROMPT = "Write a numbered list of twenty fruits, one per line, with a short note on each."


def headless_rate(engine: ChatEngine, request: GenerationRequest) -> tuple[float, int]:
    """Generate in a plain thread, as the chat's worker does, so the two sides differ only by the UI."""
    result: list[tuple[float, int]] = []
    worker = threading.Thread(target=lambda: result.append(_headless(engine, request)))
    worker.start()
    worker.join()
    return result[0]


def _headless(engine: ChatEngine, request: GenerationRequest) -> tuple[float, int]:
    start = time.perf_counter()
    last = start
    tokens = 0
    for event in engine.generate(request):
        if isinstance(event, TextDelta):
            last = time.perf_counter()
        elif isinstance(event, Finished):
            tokens = event.stats.completion_tokens
    return tokens / (last - start), tokens


async def chat_rate(engine: ChatEngine, settings: user_prefs.ModelSettings) -> tuple[float, int]:
    from textual.app import App

    from clover_local.chat_store import ChatStore
    from clover_local.tui.app import CloverApp
    from clover_local.tui.screens.chat import ChatScreen

    scratch = tempfile.mkdtemp(prefix="clover-bench-chats-")  # the chat screen keeps every chat: not in yours
    screen = ChatScreen(engine, "bench", settings, store=ChatStore(Path(scratch) / "chats.sqlite3"))

    class Host(App[None]):
        CSS_PATH = CloverApp.CSS_PATH

        def on_mount(self) -> None:
            self.push_screen(screen)

    async with Host().run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await screen.send(PROMPT)
        while screen.replies_done < 1:
            await asyncio.sleep(0.005)
        assert screen.last_stats is not None
        tokens = screen.last_stats.completion_tokens
        rate = tokens / (screen.reply_shown_at - screen.reply_started_at)
    shutil.rmtree(scratch, ignore_errors=True)
    return rate, tokens


def first_paint_s(argv: list[str], marker: str, env: dict[str, str]) -> float:
    """Seconds from spawning ``argv`` in a fresh 80x24 tmux until ``marker`` is on screen."""
    sock = f"clover-bench-{os.getpid()}-{next(_SOCKETS)}"
    base = ["tmux", "-L", sock, "-f", os.devnull]
    try:
        start = time.perf_counter()
        subprocess.run(
            [*base, "new-session", "-d", "-s", "b", "-x", "80", "-y", "24", *argv], check=True, env=env
        )
        while True:
            out = subprocess.run(
                [*base, "capture-pane", "-p", "-t", "b"], capture_output=True, text=True
            ).stdout
            if marker in out:
                return time.perf_counter() - start
            if time.perf_counter() - start > 30:
                raise SystemExit(f"no first paint after 30 s for {argv}:\n{out}")
            time.sleep(0.005)
    finally:
        subprocess.run([*base, "kill-server"], capture_output=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    preset = load_preset("gemma3-270m")
    settings = replace(
        user_prefs.ModelSettings.from_preset(preset), max_tokens=args.tokens, ctx=2048, spec_mode="off"
    )
    engine = open_launch(services.launch_for(preset, str(gemma_path()), settings)).engine
    request = GenerationRequest(
        messages=(ChatMessage("user", PROMPT),),
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        top_p=settings.top_p,
        top_k=settings.top_k,
        speculative=False,
    )
    headless_rate(engine, request)  # warm-up: page in the weights
    rows: list[dict[str, float]] = []
    for i in range(args.rounds):
        # Alternate the order, so a neighbour's load on a shared machine does not favour one side.
        if i % 2:
            c, c_tokens = asyncio.run(chat_rate(engine, settings))
            h, h_tokens = headless_rate(engine, request)
        else:
            h, h_tokens = headless_rate(engine, request)
            c, c_tokens = asyncio.run(chat_rate(engine, settings))
        rows.append({"headless_tps": h, "chat_tps": c, "tokens": c_tokens, "headless_tokens": h_tokens})
        print(
            f"round {i + 1}: headless {h:.1f} tok/s, chat {c:.1f} tok/s ({c_tokens} tokens)", file=sys.stderr
        )
    engine.close()

    paint: dict[str, list[float]] = {"chat": [], "plan": []}
    if shutil.which("tmux"):
        exe = str(Path(sys.executable).with_name("clover-local"))
        with tempfile.TemporaryDirectory() as tmp:
            env = {**os.environ, "CLOVER_CONFIG_DIR": f"{tmp}/config", "CLOVER_DATA_DIR": f"{tmp}/data"}
            for _ in range(args.rounds):
                paint["chat"].append(
                    first_paint_s([exe, "chat", "--model", str(gemma_path())], "Loading", env)
                )
                paint["plan"].append(first_paint_s([exe], "plan for this machine", env))

    ratio = statistics.median(r["chat_tps"] / r["headless_tps"] for r in rows)
    report = {
        "rounds": rows,
        "median_headless_tps": statistics.median(r["headless_tps"] for r in rows),
        "median_chat_tps": statistics.median(r["chat_tps"] for r in rows),
        "median_ratio": ratio,
        "first_paint_s": {k: statistics.median(v) for k, v in paint.items() if v},
    }
    print("| measure | value | target |")
    print("| --- | --- | --- |")
    print(f"| headless decode (Gemma 3 270M, CPU) | {report['median_headless_tps']:.1f} tok/s | |")
    print(f"| shown in the chat screen | {report['median_chat_tps']:.1f} tok/s | |")
    print(f"| chat / headless (median of {args.rounds}) | {ratio:.3f} | >= 0.97 |")
    for name, value in report["first_paint_s"].items():
        print(f"| first paint, {name} screen (tmux) | {value:.2f} s | < 1 s |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
