#!/usr/bin/env python3
"""What a speculative verification batch costs on this machine, and so the most speculation can gain.

Verifying k drafted tokens decodes k + 1 tokens in one batch, with logits for every one of them (each position's
pick is checked). This times that batch against one plain decoding step, on the same context, interleaved
(medians of ``--rounds``), and prints the ceiling: the speed-up at 100% acceptance, ``(k + 1) * step / batch``.
No drafter gets above it; where it is low (a small model with a large vocabulary on a CPU: the output layer
is computed per position), so is every mode's gain.

    .venv/bin/python benchmarks/bench_verify_batch.py [--model PATH] [--threads 1] [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import clover_local  # noqa: F401  (loads libllama before numpy, as every entry point does)

BATCHES = (1, 2, 4, 8, 16)
"""Drafted tokens per verification (the batch is one more)."""
CONTEXT = 500


def main(argv: list[str] | None = None) -> int:
    from llama_cpp import llama_cpp as C

    from clover_local.engine.native import load_llama
    from clover_local.testing.models import gemma_path

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: Gemma 3 270M)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    model = args.model or gemma_path()
    llm = load_llama(
        model,
        n_ctx=2048,
        n_batch=512,
        n_threads=args.threads,
        n_threads_batch=args.threads,
        logits_all=True,
        verbose=False,
    )
    text = b"def total(order):\n    return sum(line.price * line.qty for line in order.lines)\n" * 40
    tokens = llm.tokenize(text)[: CONTEXT + max(BATCHES) + 1]
    llm.eval(tokens[:CONTEXT])
    memory = C.llama_get_memory(llm.ctx)

    def timed(n: int) -> float:
        C.llama_memory_seq_rm(memory, -1, CONTEXT, -1)
        llm.n_tokens = CONTEXT
        t0 = time.perf_counter()
        llm.eval(tokens[CONTEXT : CONTEXT + n])
        return time.perf_counter() - t0

    times: dict[int, list[float]] = {1: [], **{k + 1: [] for k in BATCHES}}
    for _ in range(args.rounds):
        for n in times:
            times[n].append(timed(n))
    step = statistics.median(times[1])
    rows = []
    for k in BATCHES:
        batch = statistics.median(times[k + 1])
        rows.append(
            {
                "drafted": k,
                "batch_ms": round(batch * 1000, 3),
                "batch_in_steps": round(batch / step, 4),
                "ceiling": round((k + 1) * step / batch, 4),
            }
        )
    report = {"model": str(model), "threads": args.threads, "step_ms": round(step * 1000, 3), "batches": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{model.name}, {args.threads} thread(s): one step {step * 1000:.1f} ms")
    print(f"{'drafted':>8} {'batch ms':>9} {'in steps':>9} {'ceiling':>8}")
    for r in rows:
        print(f"{r['drafted']:>8} {r['batch_ms']:>9.1f} {r['batch_in_steps']:>9.2f} {r['ceiling']:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
