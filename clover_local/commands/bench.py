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
    group = parser.add_argument_group("diffusion models (compared against themselves, not llama-cpp-python)")
    group.add_argument(
        "--block-lengths",
        default="",
        metavar="L,..",
        help="block lengths side by side; 0 = timestep schedule",
    )
    group.add_argument("--tokens-per-step", default="1,2,4", metavar="N,..", help="tokens unmasked per step")
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
    from clover_local.engine.session import resolve_model_path
    from clover_local.presets import load_preset

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
    path = resolve_model_path(args.model, preset)
    from clover_local.gguf.header import read_local_header

    if read_local_header(Path(path)).diffusion is not None:
        return _bench_diffusion(args, Path(path))
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


def _int_list(text: str, flag: str, minimum: int) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: give whole numbers separated by commas.") from None
    if any(v < minimum for v in values):
        raise UsageError(f"{flag} {text!r}: every value must be at least {minimum}.")
    return values


def _bench_diffusion(args: argparse.Namespace, path: Path) -> int:
    """A diffusion model: block lengths x tokens per step, side by side."""
    from clover_local.engine.diffusion_bench import format_rows, grid, run_diffusion_bench
    from clover_local.engine.loader import load_engine
    from clover_local.engine.native import default_threads
    from clover_local.gguf.header import read_local_header
    from clover_local.plan.diffusion import BLOCK_FAMILY, plan_diffusion

    description = read_local_header(path)
    default_blocks = "32,16" if description.architecture.arch in BLOCK_FAMILY else "0,32"
    blocks = _int_list(args.block_lengths or default_blocks, "--block-lengths", 0)
    per_step = _int_list(args.tokens_per_step, "--tokens-per-step", 1)
    answer = min(args.max_tokens, args.ctx // 2)
    plan, _ = plan_diffusion(description, ctx=args.ctx)
    settings = {"n_ctx": args.ctx, "n_threads": args.threads or default_threads(), "n_gpu_layers": 0}
    engine = load_engine(path, settings, diffusion=plan).engine
    try:
        rows = run_diffusion_bench(
            engine,
            grid(blocks, per_step),
            answer=answer,
            rounds=args.rounds,
            progress=lambda line: print(line, file=sys.stderr),
        )
    finally:
        engine.close()
    data = {
        "model": path.name,
        "answer_tokens": answer,
        "rounds": args.rounds,
        "rows": [r.to_json() for r in rows],
    }
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(data, indent=2))
    else:
        print(
            f"{path.name} (diffusion), {answer}-token answers, median of {args.rounds}, seed 42, temperature 0"
        )
        print(format_rows(rows))
    return 0
