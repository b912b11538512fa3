"""``clover-local bench``: the embedded engine against plain llama-cpp-python, side by side, on this machine."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_local.errors import UsageError

if TYPE_CHECKING:
    from clover_local.engine.benchmark import BenchReport


VERBS = ("engines", "spec-modes", "verify-costs", "llama-bench", "show")
DEFAULT_PRESET = "gemma3-270m"
"""The one default model of every bench verb (a base model: the workloads are completion prompts)."""


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
    parser.add_argument(
        "verb",
        nargs="?",
        choices=VERBS,
        default="engines",
        help="engines (default): the engines side by side; spec-modes LIST: each speculation mode; verify-costs:"
        " what verifying a draft costs here; llama-bench: record llama-bench's speed for later plans; show FILE:"
        " the table of a saved report",
    )
    parser.add_argument("target", nargs="?", metavar="LIST|FILE", help="spec-modes' modes, or show's file")
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--model", metavar="PATH", help=f"a local GGUF (default: the {DEFAULT_PRESET} model)")
    model.add_argument(
        "--preset", metavar="NAME", help=f"a preset's downloaded model (default: {DEFAULT_PRESET})"
    )
    parser.add_argument("--rounds", type=int, default=3, metavar="N", help="runs per engine and workload (3)")
    parser.add_argument("--max-tokens", type=int, default=256, metavar="N", help="tokens per reply (256)")
    parser.add_argument("--ctx", type=int, default=2048, metavar="N", help="context size (2048)")
    from clover_local.commands.options import add_threads_option

    add_threads_option(parser, "CPU threads (default: physical cores)")
    parser.add_argument("--workloads", default="code_rewrite,summary,free_chat", help="comma-separated")
    parser.add_argument("--engines", default="a,b,c,d", help="comma-separated subset of a,b,c,d")
    parser.add_argument("--json", action="store_true", help="print the whole report as JSON")
    parser.add_argument("--out", metavar="FILE", help="also write the JSON report to FILE")
    parser.add_argument("--show", metavar="FILE", help="print the table of a saved JSON report and exit")
    parser.add_argument(
        "--spec-modes",
        metavar="LIST",
        help="instead: each speculation mode side by side, e.g. off,ngram,mtp (off = plain decoding), on the"
        " plan for this machine; the ratios are remembered for --spec auto",
    )
    parser.add_argument(
        "--spec-engine",
        choices=("llama-server", "embedded"),
        default="llama-server",
        help="engine for --spec-modes (embedded: off, ngram, mtp)",
    )
    group = parser.add_argument_group("diffusion models (compared against themselves, not llama-cpp-python)")
    group.add_argument(
        "--block-lengths",
        default="",
        metavar="L,..",
        help="block lengths side by side; 0 = timestep schedule",
    )
    group.add_argument("--tokens-per-step", default="1,2,4", metavar="N,..", help="tokens unmasked per step")
    parser.add_argument(
        "--verify-costs",
        action="store_true",
        help="measure again what verifying a draft costs on this machine for the plan (the embedded engine does "
        "it once at a plan's first load) and keep it for later plans",
    )
    parser.add_argument(
        "--llama-bench",
        action="store_true",
        help="measure decode with llama-bench at the plan's placement on this machine and record it: later "
        "plans use the measurement instead of the estimate",
    )
    parser.add_argument(
        "--vs-llama-bench",
        action="store_true",
        help="also run llama-bench with the same settings and report engine (b) against it",
    )
    parser.set_defaults(func=run)


def _verb(args: argparse.Namespace) -> str:
    """The verb asked for; the older flags (``--show FILE``, ``--llama-bench``, ``--verify-costs``,
    ``--spec-modes LIST``) name the same verbs."""
    if args.verb == "show" or args.show:
        args.show = args.show or args.target
        if not args.show:
            raise UsageError("bench show needs the report's file.", "clover-local bench show FILE")
        return "show"
    if args.verb == "spec-modes" or args.spec_modes:
        args.spec_modes = args.spec_modes or args.target or "off,ngram,mtp"
        return "spec-modes"
    if args.llama_bench:
        return "llama-bench"
    if args.verify_costs:
        return "verify-costs"
    return str(args.verb)


def run(args: argparse.Namespace) -> int:
    from clover_local.engine.benchmark import ENGINES, WORKLOADS, format_table, load_report, run_benchmark

    verb = _verb(args)
    if verb == "show":
        try:
            print(format_table(load_report(Path(args.show))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--show {args.show}: not a saved benchmark report ({exc}).") from None
        return 0
    if verb == "llama-bench":
        return _record_llama_bench(args)
    if verb == "verify-costs":
        return _measure_verify_costs(args)
    if verb == "spec-modes":
        return _bench_spec_modes(args)
    from clover_local.gguf.header import read_local_header
    from clover_local.model_files import require_model
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
    preset = None if args.model else load_preset(args.preset or DEFAULT_PRESET)
    path = require_model(preset, args.model)
    if read_local_header(Path(path)).diffusion is not None:
        return _bench_diffusion(args, Path(path))
    # The plan's CPU settings (this machine without its GPUs), in the keys both llama-cpp-python and the engine
    # understand, flash attention off in both: the comparison is like for like.
    settings = _cpu_settings(args, path)
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
    if args.vs_llama_bench:
        data["llama_bench"] = _llama_bench_same_settings(Path(path), settings, args.max_tokens)
    if not _json_report(args, data):
        print(
            f"{report.model}, {settings['n_threads']} threads, {args.max_tokens} tokens, median of {args.rounds}"
        )
        print("decode tokens/s (after the first token), greedy\n")
        print(format_table(report))
        if args.vs_llama_bench:
            _print_vs_llama_bench(report, data["llama_bench"])
    return 0


def _json_report(args: argparse.Namespace, data: dict[str, Any]) -> bool:
    """``--out FILE`` gets the JSON report, and ``--json`` prints it (True: then no table)."""
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=2), encoding="utf-8")
    if args.json:
        print(json.dumps(data, indent=2))
    return bool(args.json)


def _cpu_settings(args: argparse.Namespace, path: Path) -> dict[str, Any]:
    """The settings of the launch for ``path`` on this machine's CPU (``--ctx``, ``--threads``), flash attention
    off, room for n-gram speculation (engine c: ``engine.benchmark.run_benchmark``), rendered by the settings
    producer; ``Llama`` takes them too (the engine's own keys are dropped by ``native.load_llama``)."""
    from dataclasses import replace

    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.model_files import detect
    from clover_local.plan.llama_args import llama_settings
    from clover_local.plan.types import SpeculativePlan

    cpu_only = replace(detect(), gpus=())
    request = LaunchRequest(
        None, str(path), ctx=args.ctx, threads=args.threads, engine="embedded", spec="off"
    )
    plan = decide_launch(request, machine=cpu_only).plan
    like_for_like = replace(plan, flash_attn="off", speculative=SpeculativePlan(enabled=True))
    return llama_settings(like_for_like).kwargs()


def _measure_verify_costs(args: argparse.Namespace) -> int:
    """``bench --verify-costs``: the plan's first-load measurement, made again now (even where costs are kept),
    on the launch as decided, and kept."""
    from clover_local.launch import LaunchRequest, decide_launch, measure_verify_costs, open_launch
    from clover_local.measure.records import load_verify_costs, verify_costs_path
    from clover_local.model_files import require_model
    from clover_local.presets import load_preset

    preset = None if args.model else load_preset(args.preset or DEFAULT_PRESET)
    path = require_model(preset, args.model)
    request = LaunchRequest(preset, str(path), ctx=args.ctx, threads=args.threads, engine="embedded")
    launch = decide_launch(request)
    plan = launch.plan
    spec = plan.speculative
    if not spec.costs_key or spec.mode != "ngram":
        raise UsageError(
            f"This plan does not draft with n-grams (speculation: {spec.mode}), so there is no verification cost "
            "to measure.",
            "Use a plan with n-gram speculation (--spec ngram).",
        )
    opened = open_launch(launch, measure_costs=False)
    try:
        probe = measure_verify_costs(opened, again=True)
    finally:
        opened.engine.close()
    if probe is None or not probe.kept:
        print(probe.notice.text if probe else "Nothing was measured.", file=sys.stderr)
        print("Run it again while the machine is otherwise idle.", file=sys.stderr)
        return 1
    record = next(r for r in reversed(load_verify_costs()) if r.key == spec.costs_key)
    data = {
        "key": record.key,
        "costs": list(record.costs),
        "step_ms": record.step_ms,
        "others_busy": record.others_busy,
        "saved_to": str(verify_costs_path()),
    }
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(
        f"{Path(path).name}: one plain step {record.step_ms:.1f} ms (-t {plan.threads}, batches on the decode threads)"
    )
    print("batch of m tokens, in plain steps; ceiling = m / cost (the most drafting m - 1 tokens can gain)")
    for m, cost in enumerate(record.costs, start=1):
        if m in (2, 3, 5, 9, len(record.costs)):
            print(f"  m={m:>2}: {cost:5.2f} steps, ceiling {m / cost:4.2f}x")
    print(f"Kept for later plans: {data['saved_to']}")
    return 0


def _bench_spec_modes(args: argparse.Namespace) -> int:
    """``bench --spec-modes``: one engine per mode on this machine's plan; table, JSON, remembered ratios."""
    from dataclasses import replace

    from clover_local.engine.benchmark import WORKLOADS
    from clover_local.launch import EMBEDDED_DRAFTERS, LaunchRequest, decide_launch
    from clover_local.measure.records import save_spec_ratios
    from clover_local.measure.spec_bench import format_spec_table, run_spec_bench
    from clover_local.model_files import detect, require_model
    from clover_local.plan.speculation import SPEC_MODES
    from clover_local.presets import load_preset

    modes = [m.strip() for m in args.spec_modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in SPEC_MODES or m == "auto"]
    workloads = {w.strip(): WORKLOADS[w.strip()] for w in args.workloads.split(",") if w.strip() in WORKLOADS}
    if bad or not modes or not workloads:
        raise UsageError(
            f"--spec-modes {args.spec_modes!r}: unknown mode(s) {', '.join(bad) or '(none)'} or no known"
            " workload.",
            f"Modes: {', '.join(m for m in SPEC_MODES if m != 'auto')}; workloads: {', '.join(WORKLOADS)}.",
        )
    preset = load_preset(args.preset or (None if args.model else DEFAULT_PRESET))
    path = require_model(None if args.model else preset, args.model)
    bad = [m for m in modes if m not in EMBEDDED_DRAFTERS] if args.spec_engine == "embedded" else []
    if bad:
        raise UsageError(
            f"The embedded engine does not run {', '.join(bad)}.", "Use --spec-engine llama-server for them."
        )
    engine = args.spec_engine
    # No chat template: the workloads are plain prompts. Every mode is decided for the same machine.
    request = LaunchRequest(
        preset, str(path), ctx=args.ctx, threads=args.threads, engine=engine, chat_template="completion"
    )
    machine = detect()
    report = run_spec_bench(
        lambda mode: decide_launch(replace(request, spec=mode), machine=machine),  # type: ignore[arg-type]
        modes,
        workloads,
        engine_name=engine,
        rounds=args.rounds,
        max_tokens=args.max_tokens,
        progress=lambda line: print(line, file=sys.stderr),
    )
    data = report.to_json()
    if report.ratios():
        data["saved_to"] = str(save_spec_ratios(str(path), report.ratios(), engine=engine))
    if not _json_report(args, data):
        print(f"{report.model}, {engine}, {args.max_tokens} tokens, median of {args.rounds}, greedy")
        print("decode tokens/s per mode (off = plain decoding)\n")
        print(format_spec_table(report))
        if "saved_to" in data:
            print(f"\nRemembered for --spec auto: {data['saved_to']}")
    return 0


def _llama_bench_binary() -> Path:
    from clover_local.measure.llama_bench import beside_llama_server

    bench = beside_llama_server("llama-bench")
    if bench is None:
        raise UsageError(
            "llama-bench was not found (it is built next to llama-server).",
            "Build it with scripts/build-llama-server.",
        )
    return bench


def _llama_bench_same_settings(model: Path, settings: dict[str, Any], n_gen: int) -> dict[str, Any]:
    """llama-bench with the benchmark's own settings (threads, GPU layers, flash attention)."""
    from clover_local.errors import CloverError
    from clover_local.measure.llama_bench import Placement, run_llama_bench

    where = Placement(
        n_gpu_layers=int(settings.get("n_gpu_layers", 0)),
        threads=int(settings["n_threads"]),
        flash_attn=bool(settings.get("flash_attn")),
    )
    try:
        result = run_llama_bench(_llama_bench_binary(), model, where, n_gen=n_gen)
    except CloverError as exc:
        return {"error": str(exc)}
    return {"decode_tokens_per_s": result.decode_tokens_per_s, "n_gen": n_gen, "argv": list(result.argv)}


def _print_vs_llama_bench(report: BenchReport, bench: dict[str, Any]) -> None:
    tg = bench.get("decode_tokens_per_s")
    if not isinstance(tg, float):
        print(f"\nllama-bench failed: {bench.get('error')}")
        return
    print(f"\nllama-bench tg{bench['n_gen']}: {tg:.1f} tokens/s")
    for workload in sorted({s.workload for s in report.samples}):
        b = report.median("b", workload)
        if b:
            print(f"  {workload}: (b) engine / llama-bench = {b / tg:.2f}")


def _record_llama_bench(args: argparse.Namespace) -> int:
    """Plan for this machine, run llama-bench at that placement, record it for the planner."""
    import datetime

    from clover_local.detect import detect_machine
    from clover_local.gguf.header import read_local_header
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.measure.llama_bench import run_llama_bench
    from clover_local.measure.records import add_record
    from clover_local.plan.measured import SpeedRecord, machine_key, model_key

    preset = args.preset or (None if args.model else DEFAULT_PRESET)
    launch = decide_launch(LaunchRequest(preset, args.model, ctx=args.ctx))
    plan = launch.plan
    if not plan.model_path:
        raise UsageError(
            "The planned model is not downloaded, so it cannot be measured.",
            f"Run `clover-local download --preset {preset}` first, or pass --model PATH.",
        )
    desc = read_local_header(Path(plan.model_path))
    # The llama-bench beside the llama-server that runs this model: an installed runtime's for Clover (the
    # pinned build's cannot load clover_moe), else the pinned build's.
    runner = launch.runner.binary
    bench = (runner.sibling("llama-bench") if runner is not None else None) or _llama_bench_binary()
    result = run_llama_bench(bench, Path(plan.model_path), plan, n_gen=args.max_tokens)
    record = SpeedRecord(
        machine=machine_key(detect_machine()),
        model=model_key(desc.quant, desc.file_bytes),
        n_gpu_layers=plan.n_gpu_layers,
        n_cpu_moe=plan.n_cpu_moe,
        tokens_per_s=round(result.decode_tokens_per_s, 2),
        predicted_tokens_per_s=plan.estimated_tokens_per_s,
        when=datetime.date.today().isoformat(),
        threads=plan.threads,
    )
    where = add_record(record)
    print(
        f"llama-bench: {record.tokens_per_s:.1f} tokens/s decode at the plan's placement "
        f"(GPU layers {plan.n_gpu_layers}, experts of {plan.n_cpu_moe} layers in RAM); "
        f"the estimate was {plan.estimated_tokens_per_s:.1f}. Recorded in {where}: plans on this machine now "
        "use it."
    )
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
    from clover_local.gguf.header import read_local_header
    from clover_local.plan.diffusion import BLOCK_FAMILY, plan_diffusion

    description = read_local_header(path)
    default_blocks = "32,16" if description.architecture.arch in BLOCK_FAMILY else "0,32"
    blocks = _int_list(args.block_lengths or default_blocks, "--block-lengths", 0)
    per_step = _int_list(args.tokens_per_step, "--tokens-per-step", 1)
    answer = min(args.max_tokens, args.ctx // 2)
    plan, _ = plan_diffusion(description, ctx=args.ctx)
    engine = load_engine(path, _cpu_settings(args, path), diffusion=plan).engine
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
    if not _json_report(args, data):
        print(
            f"{path.name} (diffusion), {answer}-token answers, median of {args.rounds}, seed 42, temperature 0"
        )
        print(format_rows(rows))
    return 0
