"""``clover-local run``: one prompt in, one reply out, on the runner the launch chooses (the embedded engine, or a
runtime's llama-server for a model only it loads); for scripts and benchmarks."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clover_local.commands.diffusion_args import add_diffusion_arguments, diffusion_wishes
from clover_local.commands.options import (
    add_force_option,
    add_model_argument,
    add_rpc_options,
    add_spec_option,
    add_threads_option,
    apply_model_ref,
    launch_from_args,
    require_local_model,
)
from clover_local.errors import UsageError
from clover_local.plan.reasons import Notice

if TYPE_CHECKING:
    from clover_local.launch import OpenedEngine
    from clover_local.plan.types import Plan


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "run",
        help="generate one reply to a prompt and print it",
        description=(
            "Load the model as the plan says, on the runner it chooses (in-process with llama-cpp-python, or an "
            "installed runtime's llama-server for a model only that runtime loads; the plan says which), "
            "generate one reply and print it. With --json: one object with the text and the stats."
        ),
    )
    add_model_argument(parser)
    parser.add_argument(
        "--model", metavar="MODEL", help="the model, as MODEL (a local GGUF file, a preset...)"
    )
    parser.add_argument(
        "--preset",
        metavar="NAME",
        help="a preset (its downloaded model; with a .gguf MODEL: its settings); default: clover-35b-a3b",
    )
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", metavar="TEXT", help="the user message")
    prompt.add_argument("--prompt-file", metavar="F", help="read the user message from F ('-': stdin)")
    parser.add_argument("--system", metavar="S", help="a system message")
    parser.add_argument("--max-tokens", type=int, default=512, metavar="N", help="reply length limit (512)")
    parser.add_argument("--temperature", type=float, metavar="T", help="0 = greedy (default: the preset's)")
    parser.add_argument("--seed", type=int, metavar="S", help="sampling seed (default: random)")
    add_spec_option(parser)
    parser.add_argument("--ctx", type=int, metavar="N", help="context size in tokens (default: planned)")
    add_threads_option(parser, "CPU threads (default: planned)")
    parser.add_argument(
        "--template",
        metavar="NAME",
        help="chat template: gguf, completion (plain text, for base models) or a llama.cpp built-in name",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object: text and stats")
    add_diffusion_arguments(parser)
    add_rpc_options(parser)
    add_force_option(parser)
    parser.set_defaults(func=run)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    if args.prompt_file == "-":
        return sys.stdin.read()
    path = Path(args.prompt_file).expanduser()
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--prompt-file {path}: {exc.strerror}.") from None
    except UnicodeDecodeError:
        raise UsageError(f"--prompt-file {path} is not UTF-8 text.") from None


def _open(args: argparse.Namespace) -> OpenedEngine:
    """The launch the options ask for, opened. A GGUF given without a preset is planned exactly as a preset's
    file is (GPU layers, experts, context), as the preset its name says or as itself (its own header);
    ``--preset NAME --model FILE``: that file with that preset's settings; ``--rpc``: pooled with the workers'
    devices, in llama-server (the launch decides that)."""
    from clover_local.launch import open_launch
    from clover_local.model_files import require_model
    from clover_local.presets import load_preset

    if args.rpc is not None and args.template is not None:
        raise UsageError("--template is not used with --rpc (llama-server takes the preset's template).")
    apply_model_ref(args)
    require_local_model(args)
    # A bare --model: the launch plans it as the preset its file name says (model_files.preset_for_file).
    preset = load_preset(args.preset) if args.preset or not args.model else None
    path = require_model(preset, args.model, getattr(args, "quant", None) or "auto")
    launch = launch_from_args(
        args, preset=preset, model=str(path), diffusion=diffusion_wishes(args), chat_template=args.template
    )
    opened = open_launch(launch)
    return replace(opened, notices=(*plan_notices(opened.plan), *opened.notices))


def plan_notices(plan: Plan) -> tuple[Notice, ...]:
    """What ``run`` says of its plan before the reply: the workers it pools (or why it does not), and how a
    diffusion model will be decoded (steps, blocks, algorithm), which is worth saying every time."""
    from clover_local.plan.pooled import pooling_summary

    decodes = plan.diffusion is not None
    said = tuple(Notice("diffusion", r.text) for r in plan.reasons if r.code == "diffusion" and decodes)
    summary = pooling_summary(plan)
    return (Notice("pooling", summary), *said) if summary else said


def run(args: argparse.Namespace) -> int:
    from clover_local.engine.types import ChatMessage, Finished, GenerationRequest, TextDelta

    if args.max_tokens <= 0:
        raise UsageError(f"--max-tokens must be positive, not {args.max_tokens}.")
    if args.temperature is not None and args.temperature < 0:
        raise UsageError(f"--temperature must be 0 or more, not {args.temperature}.")
    text = _read_prompt(args)
    opened = _open(args)
    for note in opened.notices:
        print(f"note: {note.text}", file=sys.stderr)
    messages = [ChatMessage("system", args.system)] if args.system else []
    messages.append(ChatMessage("user", text))
    request = GenerationRequest(
        messages=tuple(messages), max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed
    )
    engine = opened.engine
    parts: list[str] = []
    stats = None
    try:
        for event in engine.generate(request):
            if isinstance(event, TextDelta):
                parts.append(event.text)
                if not args.json:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            elif isinstance(event, Finished):
                stats = event.stats
    finally:
        engine.close()
    if args.json:
        out = {"text": "".join(parts), "stats": asdict(stats) if stats else None, "model": engine.model_name}
        print(json.dumps(out, ensure_ascii=False))
    else:
        sys.stdout.write("\n")
        if stats is not None:
            accepted, d = stats.draft_acceptance, stats.diffusion
            acc = f", draft acceptance {accepted:.0%}" if accepted is not None else ""
            if d is not None:
                acc = f", diffusion: {d.steps} steps, {d.tokens_per_step:.2f} tokens/step, {d.algorithm}"
            print(
                f"[{stats.completion_tokens} tokens, {stats.decode_tokens_per_s:.1f} tok/s, "
                f"ttft {stats.ttft_s:.2f}s{acc}]",
                file=sys.stderr,
            )
    return 0
