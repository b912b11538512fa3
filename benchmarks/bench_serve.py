#!/usr/bin/env python3
"""Decode speed of ``clover-local serve`` through its HTTP API, as ratios against llama-server run by hand.

Workload: code rewriting (a Python file, then "the same file after renaming X to Y", greedy), the task
self-speculative decoding is made for: the answer mostly copies the prompt. Every configuration is served at
once and the rounds are interleaved (one request per configuration per round), so a noisy shared machine
slows all of them alike; the figure per configuration is the median over rounds.

Configurations: llama-server with default flags (``-m MODEL --port P``: the baseline, 1.00x); ``serve`` with
the embedded engine, speculation on and off; ``serve`` with the llama-server engine (the plan's flags),
speculation on and off. The llama-server ones are skipped when no binary is found. The last column is each
engine's speed with speculation over its own speed without.

``--in-process``: the same request through the engines' ``generate`` directly (embedded and llama-server
engines, speculation on and off, no HTTP in between and no by-hand baseline): how the two drafters compare
without the server around them. ``--fresh`` adds a new llama-server process for every request, whose
``ngram-mod`` table then starts empty as the embedded drafter's does: llama-server keeps that table across
requests, so from the second identical request on it drafts the reply's opening from the one before. Each
request there starts from an empty cache (``cache_prompt`` false), so every
round writes what a fresh start writes: with the prompt cached, llama.cpp evaluates only its last token, a
near-tie can flip, and the same engine wrote 293 tokens one way and 400 the other. The table shows each
configuration's token count and a hash of its text, so whether two rows wrote the same text is plain.

``--concurrency 1,2,4``: many requests at once instead (``benchmarks/bench_concurrency.py``): aggregate tokens/s and
time to first token, ``serve`` with N slots on each engine beside upstream ``llama-server -np N``.

Every engine is opened as ``serve`` opens it: a launch (``clover_local.launch``), planned, then loaded as planned.

    .venv/bin/python benchmarks/bench_serve.py [--preset gemma3-270m] [--rounds 5] [--in-process] [--json]
    .venv/bin/python benchmarks/bench_serve.py --concurrency 1,2,4 [--max-tokens 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _serve_bench import BENCH_MODEL, ORDERS_SOURCE, post, reply_figures, text_hash

PROMPT = f"Original file:\n```python\n{ORDERS_SOURCE}```\n\nThe same file after renaming Order to Invoice:\n```python\n"


@dataclass
class Config:
    name: str
    url: str = ""
    api_key: str | None = None
    engine: Any = None
    """With ``--in-process``: the ChatEngine the request goes to directly."""
    reopen: Callable[[], Any] | None = None
    """With ``--fresh``: opens a new engine (a new llama-server process) for every request."""
    runs: list[dict[str, float]] = field(default_factory=list)


def one_request(cfg: Config, max_tokens: int) -> dict[str, float]:
    if cfg.engine is not None:
        if cfg.reopen is not None:
            cfg.engine.close()
            cfg.engine = cfg.reopen()
        return _in_process(cfg.engine, max_tokens)
    payload = {
        "model": BENCH_MODEL,
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stop": ["```"],
        "cache_prompt": False,  # every round writes what a fresh start writes (see --in-process)
    }
    return reply_figures(*post(cfg.url, "/v1/completions", payload, name=cfg.name, api_key=cfg.api_key))


def _close_engine(cfg: Config) -> None:
    cfg.engine.close()


def _open(args: argparse.Namespace, model: str, engine: str, spec: bool, parallel: int = 1) -> Any:
    """The engine ``serve`` would load for this model: a launch decided, then opened as decided."""
    from clover_local.launch import LaunchRequest, decide_launch, open_launch

    request = LaunchRequest(
        preset=args.preset,
        model=model,
        ctx=args.ctx,
        engine=engine,  # type: ignore[arg-type]
        spec="auto" if spec else "off",
        parallel=parallel,
        describe=False,
    )
    return open_launch(decide_launch(request))


def _reopen(args: argparse.Namespace, model: str, engine: str, spec: bool) -> Any:
    return _open(args, model, engine, spec).engine


def _in_process(engine: Any, max_tokens: int) -> dict[str, float]:
    from clover_local.engine.types import Finished, GenerationRequest, TextDelta

    # cache_prompt=False: every round writes what a fresh start writes (as the HTTP rounds ask for it)
    request = GenerationRequest(
        prompt=PROMPT, max_tokens=max_tokens, temperature=0, stop=("```",), cache_prompt=False
    )
    started = time.perf_counter()
    text: list[str] = []
    finished: list[Finished] = []
    for event in engine.generate(request):
        if isinstance(event, TextDelta):
            text.append(event.text)
        elif isinstance(event, Finished):
            finished.append(event)
    wall = time.perf_counter() - started
    stats = finished[-1].stats
    return {
        "seconds": wall,
        "text_hash": text_hash("".join(text)),
        "tokens": float(stats.completion_tokens),
        "decode_tps": stats.decode_tokens_per_s,
        "end_to_end_tps": stats.completion_tokens / wall if wall else 0.0,
        "acceptance": stats.draft_acceptance if stats.draft_acceptance is not None else float("nan"),
        "drafted": float(stats.drafted_tokens),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", default="gemma3-270m")
    parser.add_argument("--model", help="a local GGUF (default: the preset's)")
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=400)
    parser.add_argument("--in-process", action="store_true", help="call the engines directly, no HTTP")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="with --in-process: a new llama-server for every request (its ngram-mod table starts empty)",
    )
    parser.add_argument(
        "--only",
        default="",
        help="run only the configurations whose name contains this (e.g. 'speculation on')",
    )
    parser.add_argument(
        "--threads", type=int, help="with --concurrency: decode threads for every configuration"
    )
    parser.add_argument(
        "--concurrency",
        metavar="N,N,...",
        help="requests at once (e.g. 1,2,4,8): serve with N slots on each engine beside llama-server -np N",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.llamacpp.binary import find_llama_server
    from clover_local.llamacpp.server import start_llama_server
    from clover_local.model_files import require_model
    from clover_local.presets import load_preset
    from clover_local.serve.api import ApiConfig
    from clover_local.serve.runner import BackgroundServer

    model = str(require_model(None if args.model else load_preset(args.preset), args.model))
    if args.concurrency:
        from bench_concurrency import print_lone, print_plot, print_report, run_concurrency, run_lone

        levels = [int(n) for n in args.concurrency.split(",") if n.strip()]
        report = run_concurrency(args, model, levels)
        report["lone"] = run_lone(args, model)
        print(json.dumps(report, indent=2) if args.json else "", end="")
        if not args.json:
            print_report(report)
            print_plot(report)
            print_lone(report["lone"])
        return 0
    plan = decide_launch(LaunchRequest(args.preset, model, ctx=args.ctx)).plan
    binary = find_llama_server()
    configs: list[Config] = []
    with ExitStack() as stack:
        if binary is not None and not args.in_process:
            baseline = start_llama_server(["-m", model], binary=binary, adapt=False)
            stack.callback(baseline.stop)
            configs.append(
                Config("llama-server by hand (default flags)", baseline.url, api_key=baseline.api_key)
            )
        engines: list[tuple[str, str, bool]] = [
            ("serve embedded, speculation on", "embedded", True),
            ("serve embedded, speculation off", "embedded", False),
        ]
        if binary is not None:
            engines += [
                ("serve llama-server, speculation on", "llama-server", True),
                ("serve llama-server, speculation off", "llama-server", False),
            ]
        engines = [e for e in engines if args.only in e[0]]
        for name, kind, spec in engines:
            opened = _open(args, model, kind, spec)
            if args.in_process:
                cfg = Config(name.removeprefix("serve "), engine=opened.engine)
                if args.fresh and kind == "llama-server":
                    cfg.reopen = partial(_reopen, args, model, kind, spec)
                stack.callback(_close_engine, cfg)
                configs.append(cfg)
                continue
            stack.callback(opened.engine.close)
            server = BackgroundServer(opened.engine, ApiConfig(BENCH_MODEL))
            stack.enter_context(server)
            configs.append(Config(name, server.url))
        for cfg in configs:  # warm-up: page in weights, fill caches
            one_request(cfg, 16)
        for _ in range(args.rounds):
            for cfg in configs:
                cfg.runs.append(one_request(cfg, args.max_tokens))
    report = summarize(configs, binary is not None and not args.in_process)
    report["plan"] = {"threads": plan.threads, "ctx": plan.ctx, "n_gpu_layers": plan.n_gpu_layers}
    report["model"] = Path(model).name
    report["in_process"] = args.in_process
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_table(report)
    return 0


def summarize(configs: list[Config], has_baseline: bool) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    for cfg in configs:
        rows.append(
            {
                "name": cfg.name,
                "decode_tps": statistics.median(r["decode_tps"] for r in cfg.runs),
                "end_to_end_tps": statistics.median(r["end_to_end_tps"] for r in cfg.runs),
                "tokens": statistics.median(r["tokens"] for r in cfg.runs),
                "acceptance": statistics.median(r["acceptance"] for r in cfg.runs),
                "text": _text_label(cfg.runs),
                "drafted_per_round": [int(r.get("drafted", 0)) for r in cfg.runs],
                "decode_tps_per_round": [round(r["decode_tps"], 1) for r in cfg.runs],
            }
        )
    base = rows[0] if has_baseline else None
    by_name = {row["name"]: row for row in rows}
    for row in rows:
        row["decode_ratio"] = row["decode_tps"] / base["decode_tps"] if base else None
        row["end_to_end_ratio"] = row["end_to_end_tps"] / base["end_to_end_tps"] if base else None
        plain = by_name.get(row["name"].replace("speculation on", "speculation off"))
        has_plain = "speculation on" in row["name"] and plain is not None
        row["speculation_gain"] = row["decode_tps"] / plain["decode_tps"] if has_plain and plain else None
    return {
        "rounds": len(configs[0].runs) if configs else 0,
        "rows": rows,
        "baseline": base["name"] if base else None,
    }


def _text_label(runs: list[dict[str, float]]) -> str:
    """The text's hash when every round wrote the same text, "varies" when not, "-" when not recorded."""
    hashes = {int(r["text_hash"]) for r in runs if "text_hash" in r}
    if not hashes:
        return "-"
    return f"{hashes.pop():08x}" if len(hashes) == 1 else "varies"


def print_table(report: dict[str, Any]) -> None:
    print(f"model {report['model']}, {report['rounds']} rounds, medians; plan {report['plan']}")
    print(
        f"{'configuration':<40} {'decode t/s':>10} {'ratio':>6} {'end-to-end t/s':>14} {'ratio':>6} {'accept':>7}"
        f" {'spec/plain':>10} {'tokens':>6} {'text':>8}  drafted per round"
    )
    for r in report["rows"]:
        ratio = f"{r['decode_ratio']:.2f}x" if r["decode_ratio"] else "-"
        e2e_ratio = f"{r['end_to_end_ratio']:.2f}x" if r["end_to_end_ratio"] else "-"
        acc = "-" if r["acceptance"] != r["acceptance"] else f"{r['acceptance']:.0%}"
        gain = f"{r['speculation_gain']:.2f}x" if r["speculation_gain"] else "-"
        print(
            f"{r['name']:<40} {r['decode_tps']:>10.1f} {ratio:>6} {r['end_to_end_tps']:>14.1f} {e2e_ratio:>6} {acc:>7}"
            f" {gain:>10} {r['tokens']:>6.0f} {r['text']:>8}  {' '.join(map(str, r['drafted_per_round']))}"
        )
    if report["baseline"] is None and not report.get("in_process"):
        print("(no llama-server found: no baseline; build one with scripts/build-llama-server)")


if __name__ == "__main__":
    raise SystemExit(main())
