#!/usr/bin/env python3
"""The plan's decode prediction beside plain decoding measured on this machine (issue 48), with no record of an
earlier benchmark: each model is planned in a fresh data folder (so the prediction comes from the RAM read rate
measured here, ``detect.ram_read``, never from a kept speed), opened as the plan says with speculation off, and
decodes ``--tokens`` greedy tokens ``--rounds`` times after a warm-up; the median beside the prediction.

    .venv/bin/python benchmarks/check_speed_prediction.py smollm2-135m gemma3-270m
    CLOVER_RUNTIMES_DIR=... .venv/bin/python benchmarks/check_speed_prediction.py ~/clover-shaped.gguf

A name is a preset, a path a GGUF file (a ``clover_moe`` file runs on an installed runtime's llama-server).
Run it alone: other programs' load slows what it measures, not what the plan predicts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import clover_local  # noqa: F401  (loads libllama before numpy, as every entry point does)
from _texts import words
from clover_local.engine.types import Finished, GenerationRequest
from clover_local.launch import LaunchRequest, decide_launch, open_launch
from clover_local.plan.speed import SPEED_CTX_SAMPLE


def measure(name: str, tokens: int, rounds: int) -> tuple[float, float, str, str]:
    """(predicted, measured median) decode tokens/s, the engine, and the plan's speed note. The context is
    filled as the prediction assumes (``plan.speed.SPEED_CTX_SAMPLE`` tokens, less the reply): the prompt is read
    once, then each round decodes from it (cached)."""
    is_file = Path(name).expanduser().is_file()
    request = LaunchRequest(
        None if is_file else name, str(Path(name).expanduser()) if is_file else None, spec="off", ctx=8192
    )
    launch = decide_launch(request)
    note = next((r.text for r in launch.plan.reasons if r.code.startswith("speed")), "")
    opened = open_launch(launch, measure_costs=False)
    engine = opened.engine
    speeds: list[float] = []
    filled = min(launch.plan.ctx, SPEED_CTX_SAMPLE) - tokens - 16
    per_word = engine.count_tokens(words(360)) / 360
    prompt = words(int(filled / per_word))
    try:
        for n in range(rounds + 1):
            request_ = GenerationRequest(prompt=prompt, max_tokens=tokens, temperature=0.0, cache_prompt=True)
            for event in engine.generate(request_):
                if isinstance(event, Finished) and n > 0:  # the first is a warm-up
                    speeds.append(event.stats.decode_tokens_per_s)
    finally:
        engine.close()
    return launch.plan.predicted_tokens_per_s, statistics.median(speeds), launch.runner.kind, note


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("models", nargs="+")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as fresh:
        os.environ["CLOVER_DATA_DIR"] = fresh  # no kept speeds: the prediction alone
        rows = []
        for name in args.models:
            predicted, measured, engine, note = measure(name, args.tokens, args.rounds)
            rows.append((Path(name).name, engine, predicted, measured))
            print(f"{name}: predicted {predicted:.1f}, measured {measured:.1f} ({note})", file=sys.stderr)
    print(f"{time.strftime('%Y-%m-%d')}, plain decoding, {args.rounds} rounds of {args.tokens} tokens\n")
    print("| model | engine | predicted tokens/s | measured tokens/s | predicted / measured |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, engine, predicted, measured in rows:
        print(f"| {name} | {engine} | {predicted:.1f} | {measured:.1f} | {predicted / measured:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
