#!/usr/bin/env python3
"""Speculation on every prompt, side by side in one run: the embedded engine and llama-server, each with and
without self-speculative decoding, on the plan's threads, per model and per prompt.

Prompts (``clover_local/testing/spec_workloads.py``): free chat and counting, where drafting has little to copy
and must not slow decoding down, and three code edits (rename in a Python module, re-indent JSON, edit a README
section), where the reply copies the prompt. Base models (no chat template in the GGUF) get the completion prompt,
models with their own template the chat message. Greedy, every request from an empty cache (``cache_prompt`` false), and llama-server started
afresh for every request, so its ``ngram-mod`` table starts empty as the embedded drafter's does. Rounds are
interleaved (every configuration once per round) and ratios are taken within a round, then the median.

Also printed per model: the verification ceiling, what a batch of ``n_max + 1`` tokens costs here as the
engine measured it (``engine.verify_probe``, kept in ``$CLOVER_DATA_DIR/verify-costs.json``), i.e. the most any
drafting can gain on this machine.

    .venv/bin/python benchmarks/bench_speculation.py [--models gemma3-270m,smollm2-135m] [--rounds 3]
        [--max-tokens 256] [--workloads ...] [--threads N] [--busy N] [--json] [--out .bench/speculation.json]

Threads (issue 28): embedded plain decoding beside llama-server plain at ``-t 1`` and at the plan's threads, the
ratio to the faster; with ``--busy N`` every round again beside N programs that each keep a core busy, the
embedded engine's threads following the load against the llama-server launch the plan decides while they run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import clover_local  # noqa: F401  (loads libllama before numpy, as every entry point does)
from _serve_bench import text_hash
from clover_local.testing.spec_workloads import WORKLOADS, Workload

CONFIGS = (
    "embedded plain",
    "embedded spec",
    "llama-server plain",
    "llama-server ngram-mod",
    "llama-server -t 1 plain",
)
"""``llama-server plain`` runs on the plan's threads (every physical core on an idle machine), ``-t 1`` on one:
embedded plain decoding is compared with the faster of the two (issue 28)."""
BUSY = "busy: "
"""Prefix of the configurations measured beside ``--busy N`` programs that keep a core each busy."""


@dataclass
class Cell:
    runs: list[dict[str, float]] = field(default_factory=list)


@dataclass
class ModelRun:
    preset: str
    path: Path
    plan: Any
    chat: bool
    ceiling: float | None
    costs: tuple[float, ...]
    cells: dict[tuple[str, str], Cell] = field(default_factory=dict)
    busy_server_threads: int | None = None


def configs_busy(run: ModelRun, workload: Workload) -> list[str]:
    return sorted(c for (w, c) in run.cells if w == workload.name and c.startswith(BUSY))


def request_for(workload: Workload, chat: bool, max_tokens: int) -> Any:
    from clover_local.engine.types import ChatMessage, GenerationRequest

    stop = ("```",) if workload.copies and not chat else ()
    if chat:
        return GenerationRequest(
            messages=(ChatMessage("user", workload.chat),),
            max_tokens=max_tokens,
            temperature=0.0,
            cache_prompt=False,
        )
    return GenerationRequest(
        prompt=workload.completion, max_tokens=max_tokens, temperature=0.0, stop=stop, cache_prompt=False
    )


def run_once(engine: Any, request: Any, speculative: bool) -> dict[str, float]:
    from clover_local.engine.types import Finished, TextDelta

    text: list[str] = []
    stats = None
    for event in engine.generate(replace(request, speculative=speculative)):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            stats = event.stats
    assert stats is not None
    return {
        "decode_tps": stats.decode_tokens_per_s,
        "tokens": float(stats.completion_tokens),
        "drafted": float(stats.drafted_tokens),
        "accepted": float(stats.accepted_tokens),
        "text_hash": float(text_hash("".join(text))),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="gemma3-270m,smollm2-135m")
    parser.add_argument("--workloads", default=",".join(w.name for w in WORKLOADS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--threads", type=int, default=None, help="decode threads (default: the plan's)")
    parser.add_argument("--no-llama-server", action="store_true")
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        help="then run every round again beside N programs that each keep a core busy (embedded plain and the "
        "llama-server launch decided while they run)",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(".bench/speculation.json"))
    args = parser.parse_args(argv)

    from clover_local.launch import LaunchRequest, decide_launch, measure_verify_costs, open_launch
    from clover_local.llamacpp.binary import find_llama_server

    workloads = [w for w in WORKLOADS if w.name in args.workloads.split(",")]
    with_server = not args.no_llama_server and find_llama_server() is not None
    configs = [c for c in CONFIGS if with_server or c.startswith("embedded")]
    busy_configs = (
        [BUSY + c for c in configs if c in ("embedded plain", "llama-server plain")] if args.busy else []
    )
    load_before = os.getloadavg()[0]
    started = time.time()
    runs: list[ModelRun] = []
    for name in args.models.split(","):
        # One launch per configuration, each decided as `run` would decide it: the embedded one drafts by
        # n-gram (and plain decoding is the same engine with speculation off per request); llama-server is
        # launched plain and with ngram-mod, afresh for every request.
        base = LaunchRequest(name, ctx=4096, threads=args.threads)
        launch = decide_launch(replace(base, engine="embedded", spec="ngram"))
        opened = open_launch(launch, measure_costs=False)
        probe = measure_verify_costs(opened)
        if probe is not None:
            print(probe.notice, file=sys.stderr)
        engine = opened.engine
        spec = engine.speculative
        costs = tuple(spec.batch_costs)
        run = ModelRun(
            name,
            Path(launch.plan.model_path),
            launch.plan,
            chat=engine.template.kind == "jinja",  # the GGUF's own template: an instruct model
            ceiling=len(costs) / costs[-1] if costs else None,
            costs=costs,
        )
        server_launches: dict[Any, Any] = (
            {
                False: decide_launch(replace(base, engine="llama-server", spec="off")),
                True: decide_launch(replace(base, engine="llama-server", spec="ngram")),
            }
            if with_server
            else {}
        )
        if with_server:
            server_launches["t1"] = decide_launch(replace(base, engine="llama-server", spec="off", threads=1))
        try:
            for workload in workloads:  # warm-up: page the weights in, first allocations
                run_once(engine, request_for(workload, run.chat, 8), False)
            _rounds(run, engine, server_launches, workloads, configs, args)
            if busy_configs and with_server:
                with _busy_programs(args.busy):
                    # Decided while they run: the plan's llama-server threads follow the load it measured.
                    busy_launch = decide_launch(replace(base, engine="llama-server", spec="off"))
                    print(f"busy: llama-server launch gets -t {busy_launch.plan.threads}", file=sys.stderr)
                    run.busy_server_threads = busy_launch.plan.threads
                    _rounds(run, engine, {False: busy_launch}, workloads, busy_configs, args)
        finally:
            engine.close()
        runs.append(run)
    report = summarize(
        runs, workloads, configs, args, (load_before, os.getloadavg()[0]), time.time() - started
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
        print_thread_table(report)
    return 0


def _rounds(
    run: ModelRun,
    engine: Any,
    server_launches: dict[Any, Any],
    workloads: list[Workload],
    configs: list[str],
    args: argparse.Namespace,
) -> None:
    """Every configuration once per round and prompt, interleaved; llama-server launched afresh per request."""
    from clover_local.launch import open_launch

    for r in range(args.rounds):
        for workload in workloads:
            request = request_for(workload, run.chat, args.max_tokens)
            for config in configs:
                plain = config.removeprefix(BUSY)
                if plain.startswith("embedded"):
                    result = run_once(engine, request, plain == "embedded spec")
                else:
                    spec_on = plain.endswith("ngram-mod")
                    key: Any = "t1" if "-t 1" in plain else spec_on
                    server = open_launch(server_launches[key]).engine
                    try:
                        result = run_once(server, request, spec_on)
                    finally:
                        server.close()
                run.cells.setdefault((workload.name, config), Cell()).runs.append(result)
                print(
                    f"{run.preset} round {r + 1} {workload.name:<14} {config:<30} "
                    f"{result['decode_tps']:7.1f} tok/s  {result['tokens']:.0f} tokens, "
                    f"{result['accepted']:.0f}/{result['drafted']:.0f} accepted",
                    file=sys.stderr,
                )


@contextmanager
def _busy_programs(n: int) -> Iterator[None]:
    """``n`` other programs, each keeping one core busy, for the block (and a second for the load to show).
    Each in a session of its own, as another program is: Linux shares the CPU between sessions first
    (autogroup scheduling), and llama-server runs in its own, so a busy child left in this process's session
    would take its share from the embedded engine alone."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)
    ]
    try:
        time.sleep(1.0)
        yield
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()


def _best_ratio(cell: Cell, others: list[Cell]) -> float:
    """Median over rounds of the cell's decode speed over the fastest of ``others`` in the same round."""
    rounds = zip(cell.runs, *(o.runs for o in others), strict=False)
    return float(
        statistics.median(
            a["decode_tps"] / max(b["decode_tps"] for b in rest)
            for a, *rest in rounds
            if max(b["decode_tps"] for b in rest) > 0
        )
    )


def _ratio(cell_a: Cell, cell_b: Cell) -> float:
    """Median over rounds of a's decode speed over b's in the same round."""
    pairs = zip(cell_a.runs, cell_b.runs, strict=False)
    return statistics.median(a["decode_tps"] / b["decode_tps"] for a, b in pairs if b["decode_tps"] > 0)


def summarize(
    runs: list[ModelRun],
    workloads: list[Workload],
    configs: list[str],
    args: argparse.Namespace,
    load: tuple[float, float],
    seconds: float,
) -> dict[str, Any]:
    models = []
    for run in runs:
        rows = []
        for w in workloads:
            cells = {c: run.cells[(w.name, c)] for c in configs}
            row: dict[str, Any] = {"workload": w.name, "copies": w.copies}
            for c, cell in cells.items():
                row[c] = {
                    "decode_tps": round(statistics.median(x["decode_tps"] for x in cell.runs), 1),
                    "tokens": statistics.median(x["tokens"] for x in cell.runs),
                    "drafted": sum(x["drafted"] for x in cell.runs),
                    "accepted": sum(x["accepted"] for x in cell.runs),
                    "same_text_every_round": len({x["text_hash"] for x in cell.runs}) == 1,
                }
            row["embedded spec / plain"] = round(_ratio(cells["embedded spec"], cells["embedded plain"]), 3)
            if "llama-server ngram-mod" in cells:
                row["llama-server ngram-mod / plain"] = round(
                    _ratio(cells["llama-server ngram-mod"], cells["llama-server plain"]), 3
                )
                row["embedded spec / llama-server ngram-mod"] = round(
                    _ratio(cells["embedded spec"], cells["llama-server ngram-mod"]), 3
                )
            if "llama-server -t 1 plain" in cells:
                row["embedded plain / best llama-server plain"] = round(
                    _best_ratio(
                        cells["embedded plain"],
                        [cells["llama-server plain"], cells["llama-server -t 1 plain"]],
                    ),
                    3,
                )
            busy = {c: run.cells[(w.name, c)] for c in configs_busy(run, w)}
            for c, cell in busy.items():
                row[c] = {"decode_tps": round(statistics.median(x["decode_tps"] for x in cell.runs), 1)}
            if len(busy) == 2:
                row["busy: embedded plain / llama-server plain"] = round(
                    _ratio(busy[BUSY + "embedded plain"], busy[BUSY + "llama-server plain"]), 3
                )
            rows.append(row)
        models.append(
            {
                "preset": run.preset,
                "model": run.path.name,
                "chat": run.chat,
                "threads": run.plan.threads,
                "threads_batch": run.plan.threads_batch,
                "busy_server_threads": run.busy_server_threads,
                "verify_costs": list(run.costs),
                "ceiling": round(run.ceiling, 3) if run.ceiling else None,
                "rows": rows,
            }
        )
    return {
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "load_average": load,
        "seconds": round(seconds, 1),
        "cpu_count": os.cpu_count(),
        "busy_programs": args.busy,
        "models": models,
    }


def print_table(report: dict[str, Any]) -> None:
    print(
        f"{report['rounds']} rounds, {report['max_tokens']} tokens, greedy, medians; load average "
        f"{report['load_average'][0]:.1f} before, {report['load_average'][1]:.1f} after; {report['seconds']:.0f} s"
    )
    for m in report["models"]:
        ceiling = f"{m['ceiling']:.2f}x" if m["ceiling"] else "-"
        print(
            f"\n{m['model']} ({'chat' if m['chat'] else 'completion'}), -t {m['threads']} -tb {m['threads_batch']}, "
            f"verification ceiling {ceiling} (a {len(m['verify_costs'])}-token batch costs "
            f"{m['verify_costs'][-1] if m['verify_costs'] else 0:.2f} steps)"
        )
        print(
            "| prompt | embedded plain | embedded spec | spec/plain | llama-server plain | ngram-mod | "
            "ngram-mod/plain | embedded spec / ngram-mod | embedded accepted |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in m["rows"]:
            ls_plain = r.get("llama-server plain", {}).get("decode_tps", "-")
            ls_spec = r.get("llama-server ngram-mod", {}).get("decode_tps", "-")
            es = r["embedded spec"]
            acc = f"{es['accepted']:.0f}/{es['drafted']:.0f}"
            print(
                f"| {r['workload']} | {r['embedded plain']['decode_tps']} | {es['decode_tps']} | "
                f"{r['embedded spec / plain']:.2f}x | {ls_plain} | {ls_spec} | "
                f"{_fmt(r.get('llama-server ngram-mod / plain'))} | "
                f"{_fmt(r.get('embedded spec / llama-server ngram-mod'))} | {acc} |"
            )


def print_thread_table(report: dict[str, Any]) -> None:
    """Embedded plain decoding against llama-server at one thread and at the plan's, idle and busy."""
    for m in report["models"]:
        busy = report["busy_programs"]
        print(
            f"\n{m['model']}: embedded plain (threads follow the load, at most {m['threads']}) and llama-server "
            f"plain at -t 1 and -t {m['threads']}"
            + (
                f"; beside {busy} busy program(s), llama-server as planned then (-t {m['busy_server_threads']})"
                if busy
                else ""
            )
        )
        print(
            "| prompt | embedded | llama-server -t 1 | llama-server -t N | embedded / best | busy: embedded | "
            "busy: llama-server | busy: embedded / llama-server |"
        )
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in m["rows"]:

            def cell(c: str, r: dict[str, Any] = r) -> Any:
                return r.get(c, {}).get("decode_tps", "-")

            print(
                f"| {r['workload']} | {cell('embedded plain')} | {cell('llama-server -t 1 plain')} | "
                f"{cell('llama-server plain')} | {_fmt(r.get('embedded plain / best llama-server plain'))} | "
                f"{cell(BUSY + 'embedded plain')} | {cell(BUSY + 'llama-server plain')} | "
                f"{_fmt(r.get('busy: embedded plain / llama-server plain'))} |"
            )


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


if __name__ == "__main__":
    raise SystemExit(main())
