#!/usr/bin/env python3
"""Speed on a busy desktop, side by side in one run (issue 48): the llama-server route as the product opens it
(``decide_launch`` + ``open_launch``: the plan's flags, threads that follow the load) beside upstream llama-server
on its defaults (``-m FILE -c CTX -t CORES -np 1``: the command a person types), the same binary and file.

Each round, for each of the two (their order alternating between rounds, one server in memory at a time):

- **idle**: load (start to ``/health``), a ~400-token prompt (nothing cached), plain decoding (greedy, no
  speculation: the product's launch with ``--spec off``, since n-gram drafts on a random-weights model land on
  its looping text and say nothing of real text);
- **busy after**: a program that keeps one core busy starts after the launch; :data:`SETTLE_S` later (a person
  switching back to the chat) the next reply: its decode speed and its whole time (a relaunch it waited for
  included);
- **stops again**: the program ends; :data:`UP_SETTLE_S` later, the next reply;
- **busy before**: the program runs first, then the launch (the product decides it beside the load, as a person's
  would be) and a reply.

Figures are medians over the rounds; ratios are taken within each round (product / upstream, and each busy figure
/ the same server's idle decode), then the median. Where this CPU must not repack weights (``--no-repack``: the
pinned llama.cpp's AMX kernels crash), upstream's defaults get that flag too, or they would not run.

    .venv/bin/python benchmarks/bench_busy_desktop.py --preset smollm2-135m --rounds 3
    CLOVER_RUNTIMES_DIR=... .venv/bin/python benchmarks/bench_busy_desktop.py --model ~/clover-shaped.gguf --rounds 3

Run it alone: other programs' load is what it measures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import clover_local  # noqa: F401  (loads libllama before numpy, as every entry point does)
from _texts import CODE, words
from clover_local.engine.repack import repack_safe_here
from clover_local.engine.types import Finished, GenerationRequest, GenerationStats, TextDelta
from clover_local.launch import Launch, LaunchRequest, decide_launch, open_launch
from clover_local.llamacpp.server import start_llama_server
from clover_local.llamacpp.server_args import threads_in
from clover_local.llamacpp.server_engine import LlamaServerEngine

SETTLE_S = 8.0
"""After a program gets busy, the next message comes this much later (the follower needs ~2 s to be sure)."""
UP_SETTLE_S = 16.0
QUIET_S = 5.0
"""After a server stops (and after the busy program does), the next launch waits this long, as a person would."""
CAP_S = 30.0
"""The longest a measured reply may run (then its speed is taken from what streamed)."""
"""After it stops, the next message comes this much later (the follower waits 10 s before taking cores back)."""


@dataclass
class Run:
    """One server's figures in one round."""

    name: str
    load_s: float = 0.0
    prompt_tps: float = 0.0
    idle_tps: float = 0.0
    busy_after_tps: float = 0.0
    busy_after_reply_s: float = 0.0
    busy_after_threads: int | None = None
    stopped_tps: float = 0.0
    stopped_threads: int | None = None
    busy_before_tps: float = 0.0
    busy_before_threads: int | None = None
    argv: list[str] = field(default_factory=list)


def _log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


@contextmanager
def busy_program() -> Iterator[None]:
    """Another program keeping one core busy (a Python loop), as a build or a browser tab would: in a session of
    its own, as a person's other programs are (Linux shares the CPU between sessions first, autogroup scheduling;
    a child in the benchmark's own session would take its share from the benchmark alone)."""
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
    try:
        yield
    finally:
        spinner.kill()
        spinner.wait()


def _run(engine: LlamaServerEngine, request: GenerationRequest) -> tuple[GenerationStats, float]:
    began = time.perf_counter()
    for event in engine.generate(request):
        if isinstance(event, Finished):
            return event.stats, time.perf_counter() - began
    raise RuntimeError("the reply ended without its statistics")


def _decode(engine: LlamaServerEngine, tokens: int, cap_s: float = CAP_S) -> tuple[float, float]:
    """Decode tokens/s of a greedy reply (llama-server's own timing), and the reply's whole time. A reply still
    going after ``cap_s`` (upstream beside a busy program can decode at 0.1 tokens/s) is stopped there and its
    speed taken from the pieces streamed until then."""
    # A short prompt: beside a busy program upstream reads prompts at a fraction of a token a second, and nothing
    # streams (nor can be stopped) before the first token.
    request = GenerationRequest(prompt=CODE[:60], max_tokens=tokens, temperature=0.0, cache_prompt=False)
    cancel = threading.Event()
    timer = threading.Timer(cap_s, cancel.set)
    began = time.perf_counter()
    stamps: list[float] = []
    timer.start()
    try:
        for event in engine.generate(request, cancel):
            now = time.perf_counter()
            if isinstance(event, TextDelta):
                stamps.append(now)
            elif isinstance(event, Finished):
                if event.stats.finish_reason != "cancelled" and event.stats.decode_tokens_per_s > 0:
                    return event.stats.decode_tokens_per_s, now - began
                break
    finally:
        timer.cancel()
    took = time.perf_counter() - began
    if len(stamps) < 2:
        return 0.0, took
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]), took


def _prompt(engine: LlamaServerEngine, tokens: int) -> float:
    text = words(tokens)
    stats, _ = _run(engine, GenerationRequest(prompt=text, max_tokens=1, temperature=0.0, cache_prompt=False))
    return stats.prefill_tokens_per_s


def _threads(engine: LlamaServerEngine) -> int | None:
    health = engine.health()
    if health.threads is not None:
        return health.threads.threads
    return threads_in(engine.process.argv) if engine.process is not None else None


Opener = Callable[[], tuple[LlamaServerEngine, float]]
"""Starts one of the two: the engine, and the seconds from starting the process to its ``/health`` answering."""


def product_opener(request: LaunchRequest) -> Opener:
    def open_() -> tuple[LlamaServerEngine, float]:
        launch = decide_launch(request)  # decided now: beside the load when the program runs first
        began = time.perf_counter()  # the load is timed from here, as upstream's from its start
        engine = open_launch(launch, measure_costs=False).engine
        assert isinstance(engine, LlamaServerEngine)
        return engine, time.perf_counter() - began

    return open_


def upstream_opener(launch: Launch, cores: int) -> Opener:
    plan, binary = launch.plan, launch.runner.binary
    assert binary is not None, "the upstream runner needs a llama-server"
    argv = ["-m", plan.model_path or "", "-c", str(plan.ctx), "-t", str(cores), "-np", "1"]
    if not repack_safe_here():
        argv.append("--no-repack")  # upstream's defaults crash on this CPU otherwise (the AMX kernels)

    def open_() -> tuple[LlamaServerEngine, float]:
        began = time.perf_counter()
        process = start_llama_server(argv, binary=binary, adapt=False)
        return LlamaServerEngine(process, model_name=launch.preset.name, slots=1), time.perf_counter() - began

    return open_


def one_round(name: str, opener: Opener, args: argparse.Namespace) -> Run:
    run = Run(name)
    engine, run.load_s = opener()
    run.argv = list(engine.process.argv) if engine.process else []
    try:
        _decode(engine, 8)  # warm: the first reply after a load pays for pages and kernels
        run.prompt_tps = _prompt(engine, args.prompt)
        run.idle_tps, _ = _decode(engine, args.decode)
        _log(f"{name}: load {run.load_s:.1f} s, prompt {run.prompt_tps:.1f}, idle decode {run.idle_tps:.1f}")
        with busy_program():
            time.sleep(SETTLE_S)
            run.busy_after_tps, run.busy_after_reply_s = _decode(engine, args.decode)
            run.busy_after_threads = _threads(engine)
        _log(f"{name}: busy after launch {run.busy_after_tps:.1f} ({run.busy_after_threads} threads)")
        time.sleep(UP_SETTLE_S)
        run.stopped_tps, _ = _decode(engine, args.decode)
        run.stopped_threads = _threads(engine)
        _log(f"{name}: stopped again {run.stopped_tps:.1f} ({run.stopped_threads} threads)")
    finally:
        engine.close()
    time.sleep(QUIET_S)
    with busy_program():
        time.sleep(2.0)  # running before the launch is decided, as a person's browser would be
        engine, _ = opener()
        try:
            _decode(engine, 8)
            run.busy_before_tps, _ = _decode(engine, args.decode)
            run.busy_before_threads = _threads(engine)
        finally:
            engine.close()
    time.sleep(
        QUIET_S
    )  # a server that stopped unmaps its pages: the next launch's probe would see that as load
    _log(f"{name}: busy before launch {run.busy_before_tps:.1f} ({run.busy_before_threads} threads)")
    return run


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def report(runs: list[tuple[Run, Run]], meta: dict[str, object]) -> str:
    """A markdown table: each figure's median for upstream and the product, and the within-round ratios."""

    def col(pick: Callable[[Run], float], which: int) -> float:
        return _median([pick(pair[which]) for pair in runs])

    def ratio(pick: Callable[[Run], float], of: Callable[[Run], float] | None = None) -> str:
        if of is None:  # product / upstream
            values = [pick(p) / pick(u) for u, p in runs if pick(u) > 0]
        else:
            values = [pick(p) / of(p) for _, p in runs if of(p) > 0]
        return f"{_median(values):.2f}x" if values else "-"

    def keep(pick: Callable[[Run], float], which: int) -> str:
        values = [pick(pair[which]) / pair[which].idle_tps for pair in runs if pair[which].idle_tps > 0]
        return f"{_median(values):.2f}x" if values else "-"

    rows: list[tuple[str, Callable[[Run], float], bool]] = [
        ("load, s", lambda r: r.load_s, False),
        ("prompt, tokens/s", lambda r: r.prompt_tps, False),
        ("decode idle, tokens/s", lambda r: r.idle_tps, False),
        ("decode, a program busy after the launch", lambda r: r.busy_after_tps, True),
        ("  that reply's whole time, s", lambda r: r.busy_after_reply_s, False),
        ("decode, the program stopped again", lambda r: r.stopped_tps, True),
        ("decode, a program busy before the launch", lambda r: r.busy_before_tps, True),
    ]
    lines = [
        f"{meta['model']} · {meta['date']} · {meta['machine']} · {meta['rounds']} rounds",
        "",
        "| figure | upstream defaults | clover-local | clover-local / upstream | upstream of its idle | "
        "clover-local of its idle |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for label, pick, busy in rows:
        u, p = col(pick, 0), col(pick, 1)
        fmt = "{:.1f}"
        lines.append(
            f"| {label} | {fmt.format(u)} | {fmt.format(p)} | {ratio(pick)} | "
            f"{keep(pick, 0) if busy else ''} | {keep(pick, 1) if busy else ''} |"
        )
    threads = [(p.busy_after_threads, p.stopped_threads, p.busy_before_threads) for _, p in runs]
    lines += ["", f"clover-local's threads (busy after, stopped again, busy before), each round: {threads}"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default=None)
    parser.add_argument(
        "--model", default=None, help="a GGUF file (the Clover-shaped one: its runtime's llama-server)"
    )
    parser.add_argument(
        "--llama-server", default=None, help="the llama-server for a preset (default: as found)"
    )
    parser.add_argument("--ctx", type=int, default=16384)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--decode", type=int, default=96)
    parser.add_argument("--prompt", type=int, default=400)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    request = LaunchRequest(
        args.preset,
        args.model,
        ctx=args.ctx,
        engine="llama-server",
        llama_server=args.llama_server,
        spec="off",
        parallel=1,
    )
    launch = decide_launch(request)
    if launch.runner.kind != "llama-server" or launch.runner.binary is None:
        raise SystemExit(f"no llama-server runs this model here: {launch.runner.why}")
    cores = max(1, launch.machine.cpu.physical_cores)
    product, upstream = product_opener(request), upstream_opener(launch, cores)
    _log(f"warming the page cache: {launch.plan.model_path}")
    upstream()[0].close()
    pairs: list[tuple[Run, Run]] = []
    for n in range(args.rounds):
        if n % 2 == 0:
            u = one_round("upstream", upstream, args)
            p = one_round("clover-local", product, args)
        else:
            p = one_round("clover-local", product, args)
            u = one_round("upstream", upstream, args)
        pairs.append((u, p))
    meta: dict[str, object] = {
        "model": Path(launch.plan.model_path or "").name,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{launch.machine.cpu.model}, {launch.machine.cpu.logical_cores} logical cores, "
        f"{launch.machine.memory.total_bytes / 2**30:.0f} GiB",
        "rounds": args.rounds,
        "binary": str(launch.runner.binary.path),
    }
    text = report(pairs, meta)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps({"meta": meta, "rounds": [[asdict(u), asdict(p)] for u, p in pairs]}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
