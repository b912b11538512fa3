"""``clover-local bench``: the embedded engine against plain llama-cpp-python, side by side, on this machine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from clover_local.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "bench",
        help="measure decode speed: llama-cpp-python vs the embedded engine, with and without speculation",
        description=(
            "Runs the same greedy prompts (code rewrite, summary, free chat) through (a) llama-cpp-python's "
            "create_completion, (b) the embedded engine, (c) the engine with self-speculative decoding and "
            "(d) llama-cpp-python's LlamaPromptLookupDecoding, interleaved, and prints medians and ratios."
        ),
    )
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", metavar="PATH", help="a local GGUF (default: the gemma3-270m test model)")
    model.add_argument("--preset", metavar="NAME", help="a preset's downloaded model (default: gemma3-270m)")
    parser.add_argument("--rounds", type=int, default=3, metavar="N", help="runs per engine and workload (3)")
    parser.add_argument("--max-tokens", type=int, default=256, metavar="N", help="tokens per reply (256)")
    parser.add_argument("--ctx", type=int, default=2048, metavar="N", help="context size (2048)")
    parser.add_argument("--threads", type=int, metavar="N", help="CPU threads (default: physical cores)")
    parser.add_argument("--workloads", default="code_rewrite,summary,free_chat", help="comma-separated")
    parser.add_argument("--engines", default="a,b,c,d", help="comma-separated subset of a,b,c,d")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    parser.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")
    parser.add_argument("--show", metavar="FILE", help="print the table of a saved JSON report and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.engine.benchmark import ENGINES, WORKLOADS, format_table, load_report, run_benchmark

    if args.show:
        try:
            print(format_table(load_report(Path(args.show))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--show {args.show}: not a saved benchmark report ({exc}).") from None
        return 0
    from clover_local.engine.native import default_threads
    from clover_local.presets import load_preset
    from clover_local.runtime import require_model

    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    engines = tuple(e.strip() for e in args.engines.split(",") if e.strip())
    bad = [w for w in workloads if w not in WORKLOADS] + [e for e in engines if e not in ENGINES]
    if bad or not workloads or not engines:
        raise UsageError(
            f"Unknown workload or engine: {', '.join(bad) or '(none given)'}.",
            f"Workloads: {', '.join(WORKLOADS)}; engines: {', '.join(ENGINES)}.",
        )
    if args.rounds <= 0 or args.max_tokens <= 1 or args.ctx < 256:
        raise UsageError("--rounds must be positive, --max-tokens above 1 and --ctx at least 256.")
    preset = None if args.model else load_preset(args.preset or "gemma3-270m")
    path = require_model(preset, args.model)
    # Plain CPU settings both llama-cpp-python and the engine understand, so the comparison is like for like.
    settings = {
        "n_ctx": args.ctx,
        "n_batch": 512,
        "n_threads": args.threads or default_threads(),
        "n_gpu_layers": 0,
        "flash_attn": False,
    }
    report = run_benchmark(
        Path(path),
        settings,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
        workloads=workloads,
        engines=engines,
        progress=lambda line: print(line, file=sys.stderr),
    )
    data = report.to_json()
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(
            f"{report.model}, {settings['n_threads']} threads, {args.max_tokens} tokens, median of {args.rounds}"
        )
        print("decode tokens/s (after the first token), greedy\n")
        print(format_table(report))
    return 0
