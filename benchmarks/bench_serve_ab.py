#!/usr/bin/env python3
"""Four-at-once ``serve`` throughput of two checkouts, side by side in one run: did a change to ``serve`` slow it?

The workload is ``bench_serve.py --concurrency N``'s (``bench_concurrency.one_round``: N different chat requests
at once, greedy, streamed; aggregate completion tokens/s over the wall time of the round). For each engine, one
``clover-local serve --parallel N`` per checkout runs as a process of its own (cwd and ``PYTHONPATH`` that
checkout), all at once, and the rounds alternate between them (the order flips every round), so a noisy shared
machine slows both alike. Figures: the median over rounds per checkout, B over A of those medians, and the median
of each round's B over A (a round of each, measured one after the other, shares the machine's load of the moment).

    .venv/bin/python benchmarks/bench_serve_ab.py --a /work/main --b . --preset smollm2-135m --ctx 1024 \\
        --threads 2 --concurrency 4 --max-tokens 128 --rounds 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_concurrency import Target, _wait_until_serving, one_round


@contextmanager
def serve_from(checkout: Path, args: Any, model: str, engine: str) -> Iterator[tuple[str, str]]:
    """``clover-local serve`` run from ``checkout``'s code: its URL and model name, stopped on exit."""
    from clover_local.llamacpp.server import free_port

    port = free_port()
    argv = [sys.executable, "-m", "clover_local", "serve", "--model", model, "--engine", engine]
    argv += ["--port", str(port), "--ctx", str(args.ctx), "--parallel", str(args.concurrency)]
    argv += ["--preset", args.preset, "--threads", str(args.threads)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        argv, cwd=checkout, env=env, stdout=subprocess.DEVNULL, stderr=log, start_new_session=True
    )
    try:
        yield f"http://127.0.0.1:{port}", _wait_until_serving(proc, port, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--a", required=True, help="the checkout measured first (the baseline)")
    parser.add_argument("--b", required=True, help="the checkout compared with it")
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--ctx", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--engines", default="embedded,llama-server")
    args = parser.parse_args()

    from clover_local.model_files import require_model
    from clover_local.presets import load_preset

    model = str(require_model(load_preset(args.preset), None))
    checkouts = {"A": Path(args.a).resolve(), "B": Path(args.b).resolve()}
    print(f"A = {checkouts['A']}\nB = {checkouts['B']}")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {args.preset}, N={args.concurrency}")
    for engine in args.engines.split(","):
        with ExitStack() as stack:
            targets: dict[str, Target] = {}
            for label, checkout in checkouts.items():
                url, model_id = stack.enter_context(serve_from(checkout, args, model, engine))
                targets[label] = Target(f"{label} {engine}", url, model=model_id)
            for t in targets.values():  # warm-up
                one_round(t, 1, 8)
                t.rounds.clear()
            for r in range(args.rounds):
                order = ["A", "B"] if r % 2 == 0 else ["B", "A"]
                for label in order:
                    one_round(targets[label], args.concurrency, args.max_tokens)
            tps = {label: [tokens / wall for wall, tokens, _ in t.rounds] for label, t in targets.items()}
            med = {label: statistics.median(v) for label, v in tps.items()}
            for label in ("A", "B"):
                rounds = " ".join(f"{x:.1f}" for x in tps[label])
                print(f"{engine:>12} {label}: median {med[label]:.1f} tokens/s  (rounds: {rounds})")
            paired = statistics.median(b / a for a, b in zip(tps["A"], tps["B"], strict=True))
            print(
                f"{engine:>12} B/A: {med['B'] / med['A']:.3f} of the medians, {paired:.3f} median of the rounds'"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
