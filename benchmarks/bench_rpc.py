#!/usr/bin/env python3
"""Decode speed with llama.cpp RPC workers on one machine, next to the plan's prediction.

Two ``rpc-server`` workers on 127.0.0.1 (CPU backend, started as ``clover-local worker`` starts them), and
Gemma 3 270M Q4_K_M served by the built ``llama-server``, greedy, the same prompt, three ways:

- ``local``: this machine alone (the plan for this machine as detected),
- ``2 workers``: ``--rpc`` to both workers, read and measured through the RPC protocol (the real path): the plan
  puts every layer on the workers,
- ``3-way split``: workers described with less free memory, so this machine keeps the first layers.

Each row: the plan's predicted decode tokens/s, the measured median over ``--runs`` replies (llama-server's own
``predicted_per_second``), their ratio, and the network's predicted share. On one machine the "network" is
loopback and the workers share this machine's cores and memory: the table shows what RPC costs in
round trips and copies, not what a second machine adds.

    .venv/bin/python benchmarks/bench_rpc.py            # 3 runs each, 64 tokens
    .venv/bin/python benchmarks/bench_rpc.py --runs 5 --tokens 96
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from clover_local.detect import detect_machine, parse_simulate  # noqa: E402
from clover_local.engine.types import ChatMessage, Finished, GenerationRequest  # noqa: E402
from clover_local.gguf.header import read_local_header  # noqa: E402
from clover_local.llamacpp.rpc_server import start_worker  # noqa: E402
from clover_local.llamacpp.server import free_port, plan_server_argv, start_llama_server  # noqa: E402
from clover_local.llamacpp.server_engine import LlamaServerEngine  # noqa: E402
from clover_local.model_files import detect  # noqa: E402
from clover_local.plan.planner import make_plan  # noqa: E402
from clover_local.plan.types import Plan, Wishes  # noqa: E402
from clover_local.presets import load_preset  # noqa: E402
from clover_local.testing.models import gemma_path  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def measure(plan: Plan, runs: int, tokens: int) -> list[float]:
    speeds = []
    with start_llama_server(plan_server_argv(plan), ready_timeout_s=600) as server:
        engine = LlamaServerEngine(server, owns_process=False)
        request = GenerationRequest(
            messages=(ChatMessage("user", PROMPT),), max_tokens=tokens, temperature=0.0
        )
        for _ in range(runs + 1):  # the first reply warms up and is not counted
            done = [e for e in engine.generate(request) if isinstance(e, Finished)][-1]
            speeds.append(done.stats.decode_tokens_per_s)
    return speeds[1:]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    preset = load_preset("gemma3-270m")
    model = str(gemma_path())
    desc = read_local_header(gemma_path())  # exact sizes, as `plan --model` uses
    wishes = Wishes(ctx=2048, speculative=False)
    machine = detect_machine()
    threads = machine.cpu.physical_cores
    workers = [start_worker("127.0.0.1", free_port(), threads=threads) for _ in range(2)]
    try:
        rpc = ",".join(f"cpu@{w.endpoint}" for w in workers)
        pooled_machine = detect(None, rpc)
        a, b = workers
        split_machine = parse_simulate(
            f"ram={machine.memory.total_bytes},cpu={threads},rpc=cpu:1060M@{a.endpoint},"
            f"rpc=cpu:1730M@{b.endpoint}"
        )
        links = [w.link for w in pooled_machine.workers]  # measured; the memory is described
        split_machine = replace(
            split_machine,
            workers=tuple(replace(w, link=links[i]) for i, w in enumerate(split_machine.workers)),
        )
        rows = [
            ("local", make_plan(machine, preset, desc, wishes, model)),
            ("2 workers", make_plan(pooled_machine, preset, desc, wishes, model)),
            ("3-way split", make_plan(split_machine, preset, desc, wishes, model)),
        ]
        print(f"links: {'; '.join(w.link.source for w in pooled_machine.workers)}", file=sys.stderr)
        print(
            "| setup | layers (this machine / worker 1 / worker 2) | predicted tok/s | network share | measured tok/s "
            "(median) | measured / predicted |"
        )
        print("| --- | --- | ---: | ---: | ---: | ---: |")
        for name, plan in rows:
            speeds = measure(plan, args.runs, args.tokens)
            med = statistics.median(speeds)
            share = f"{plan.network.share:.0%}" if plan.network else "-"
            print(
                f"| {name} | {_layers(plan)} | {plan.predicted_tokens_per_s:.1f} | {share} | {med:.1f} "
                f"({', '.join(f'{s:.1f}' for s in speeds)}) | {med / plan.predicted_tokens_per_s:.2f} |",
                flush=True,
            )
    finally:
        for w in workers:
            w.stop()
    return 0


def _layers(plan: Plan) -> str:
    from clover_local.plan import memory

    n = 18
    n_dev = len(plan.memory.gpus)
    devices = (
        memory.layer_devices(n, plan.n_gpu_layers, n_dev, plan.tensor_split) if n_dev else [-1] * (n + 1)
    )
    counts = [sum(1 for d in devices[:n] if d == i) for i in (-1, *range(n_dev))]
    return " / ".join(str(c) for c in counts)


if __name__ == "__main__":
    raise SystemExit(main())
