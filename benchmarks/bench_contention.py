#!/usr/bin/env python3
"""Decode speed on an idle machine and beside one busy process, for both engines and several thread counts.

A desktop always runs something else. llama.cpp's CPU threads wait for each other at every operation by
spinning, so when they fill every core, one busy program (here ``python -c 'while True: pass'``) can stall
them all. This measures, side by side in one run, each configuration idle and then with one busy process
started just for its run: the embedded engine (llama-cpp-python) and ``llama-server`` (the built binary),
with the plan's threads and with the alternatives (all physical cores, and all cores with ``--poll 0``, which
makes llama-server's idle workers sleep instead of spin between tokens). Rounds are interleaved; the figure
per configuration is the median over rounds. Greedy, speculation off (plain decoding), Gemma 3 270M.

A run that the competitor stalls is cut off after ``--cap-s`` seconds and its rate is tokens so far / time.

    .venv/bin/python benchmarks/bench_contention.py [--rounds 3] [--tokens 128] [--cap-s 20] [--batches] [--json]

``--batches`` measures the batch threads instead: a code edit with speculation on (its verification batches run
on the batch threads), with the plan's batch threads (every physical core; the embedded engine drops them to the
decode threads while another program is busy) against batches on the decode threads only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from clover_local.detect import detect_machine
from clover_local.engine.types import ChatEngine, ChatMessage, Finished, GenerationRequest
from clover_local.plan.planner import make_plan
from clover_local.plan.types import Plan, Wishes
from clover_local.presets import load_preset

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
BUSY = [sys.executable, "-c", "while True: pass"]


@dataclass
class Config:
    engine: str
    """``embedded`` or ``llama-server``."""
    threads: int
    label: str
    extra_args: tuple[str, ...] = ()
    threads_batch: int | None = None
    """None: the plan's for these threads."""
    idle: list[float] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.engine}, {self.label}"


def decode_rate(engine: ChatEngine, tokens: int, cap_s: float, batches: bool = False) -> float:
    """Decode tokens/s of one greedy reply, cut off after ``cap_s`` seconds. ``batches``: a code edit with
    speculation on, whose verification batches run on the batch threads."""
    cancel = threading.Event()
    timer = threading.Timer(cap_s, cancel.set)
    timer.start()
    if batches:
        from clover_local.testing.spec_workloads import WORKLOADS

        edit = next(w for w in WORKLOADS if w.name == "rename_python")
        request = GenerationRequest(
            prompt=edit.completion, max_tokens=tokens, temperature=0.0, stop=("```",), cache_prompt=False
        )
    else:
        request = GenerationRequest(
            messages=(ChatMessage("user", PROMPT),), max_tokens=tokens, temperature=0.0, speculative=False
        )
    stats = None
    try:
        for event in engine.generate(request, cancel):
            if isinstance(event, Finished):
                stats = event.stats
    finally:
        timer.cancel()
    return stats.decode_tokens_per_s if stats is not None else 0.0


@contextmanager
def busy_process() -> Iterator[None]:
    """One process spinning on a core for as long as the block runs."""
    proc = subprocess.Popen(BUSY)
    try:
        time.sleep(0.5)  # let the scheduler see it as busy
        yield
    finally:
        proc.kill()
        proc.wait()


def open_engine(config: Config, plan: Plan, stack: ExitStack) -> ChatEngine:
    preset = load_preset("gemma3-270m")
    if config.engine == "embedded":
        from clover_local.engine.loader import load_engine
        from clover_local.plan.llama_args import llama_cpp_kwargs

        result = load_engine(
            plan.model_path or "",
            llama_cpp_kwargs(plan),
            chat_template=plan.chat_template,
            sampling=preset.sampling,
            speculative=plan.speculative,
        )
        stack.callback(result.engine.close)
        return result.engine
    from clover_local.llamacpp.server import find_llama_server, plan_server_argv, start_llama_server
    from clover_local.llamacpp.server_engine import LlamaServerEngine

    binary = find_llama_server()
    if binary is None:
        raise SystemExit("no llama-server found (scripts/build-llama-server)")
    process = start_llama_server([*plan_server_argv(plan), *config.extra_args], binary=binary)
    engine = LlamaServerEngine(process, model_name=preset.name, sampling=preset.sampling)
    stack.callback(engine.close)
    return engine


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--cap-s", type=float, default=20.0, help="cut a stalled run off after this long")
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--engines", default="embedded,llama-server")
    parser.add_argument(
        "--batches",
        action="store_true",
        help="measure batch threads: a code edit with speculation on, batches on the plan's threads or on the "
        "decode threads only",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from clover_local.llamacpp.binary import find_llama_server
    from clover_local.testing.models import gemma_path

    machine = detect_machine()
    preset = load_preset("gemma3-270m")
    base = make_plan(machine, preset, None, Wishes(ctx=args.ctx, speculative=False), str(gemma_path()))
    cores = machine.cpu.physical_cores
    engines = [e for e in args.engines.split(",") if e]
    if "llama-server" in engines and find_llama_server() is None:
        print(
            "no llama-server found (scripts/build-llama-server): measuring the embedded engine only",
            file=sys.stderr,
        )
        engines.remove("llama-server")
    configs: list[Config] = []
    for engine in engines:
        if args.batches:
            configs.append(
                Config(engine, base.threads, f"plan: -t {base.threads} -tb {base.threads_batch}", ())
            )
            if base.threads_batch != base.threads:
                label = f"-t {base.threads} -tb {base.threads} (batches on the decode threads)"
                configs.append(Config(engine, base.threads, label, (), base.threads))
            continue
        configs.append(Config(engine, base.threads, f"plan: {base.threads} thread(s)"))
        if cores != base.threads:
            configs.append(Config(engine, cores, f"all {cores} cores"))
            if engine == "llama-server":
                configs.append(Config(engine, cores, f"all {cores} cores, --poll 0", ("--poll", "0")))

    load_before = os.getloadavg()[0]
    with ExitStack() as stack:
        opened: list[tuple[Config, ChatEngine]] = []
        for config in configs:
            plan = make_plan(
                machine,
                preset,
                None,
                Wishes(ctx=args.ctx, speculative=args.batches, threads=config.threads),
                str(gemma_path()),
            )
            if config.threads_batch is not None:
                plan = replace(plan, threads_batch=config.threads_batch)
            opened.append((config, open_engine(config, plan, stack)))
        for _, engine in opened:  # warm up: page in the weights, first allocations
            decode_rate(engine, 8, args.cap_s, args.batches)
        for r in range(args.rounds):
            for config, engine in opened:
                config.idle.append(decode_rate(engine, args.tokens, args.cap_s, args.batches))
                with busy_process():
                    config.busy.append(decode_rate(engine, args.tokens, args.cap_s, args.batches))
                print(
                    f"round {r + 1}: {config.name}: idle {config.idle[-1]:.1f}, busy {config.busy[-1]:.1f} tok/s",
                    file=sys.stderr,
                )
    load = (load_before, os.getloadavg()[0])
    report(configs, machine.cpu.physical_cores, machine.cpu.logical_cores, load, args)
    return 0


def report(
    configs: list[Config], physical: int, logical: int, load: tuple[float, float], args: argparse.Namespace
) -> None:
    rows = []
    for c in configs:
        idle, busy = statistics.median(c.idle), statistics.median(c.busy)
        rows.append(
            {"configuration": c.name, "idle": idle, "busy": busy, "kept": busy / idle if idle else 0.0}
        )
    if args.json:
        out = {"physical_cores": physical, "logical_cores": logical, "load_average": load, "rows": rows}
        print(json.dumps(out, indent=2))
        return
    print(
        f"Gemma 3 270M Q4_K_M, CPU ({physical} physical / {logical} logical cores), greedy, {args.tokens} tokens"
        f"{' of a code edit with speculation on' if args.batches else ''}, "
        f"median of {args.rounds} interleaved rounds; busy = one `python -c 'while True: pass'` beside it; "
        f"1-minute load average {load[0]:.1f} before, {load[1]:.1f} after (other jobs on the machine)"
    )
    print()
    print("| engine, threads | idle tok/s | with one busy process | kept |")
    print("| --- | ---: | ---: | ---: |")
    for row in rows:
        kept = (
            f"{row['kept']:.2f}" if row["idle"] else "-"
        )  # no token within the cap even without the competitor
        print(f"| {row['configuration']} | {row['idle']:.1f} | {row['busy']:.1f} | {kept} |")


if __name__ == "__main__":
    raise SystemExit(main())
