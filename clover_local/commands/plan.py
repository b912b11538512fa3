"""``clover-local plan``: what quant, context and llama.cpp settings fit this machine (or a described one), and why;
with ``--compare-fit``, llama.cpp's own fit (``llama-fit-params``) next to the plan."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from clover_local.launch_types import Launch


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clover_local.commands.options import add_plan_options

    parser = subparsers.add_parser(
        "plan",
        help="decide quant, context, GPU layers and expert offload for this machine, and say why",
        description=(
            "Plan how llama.cpp should run the model on this machine (or one described with --simulate): quant, "
            "context, KV cache type, GPU layers and MoE expert offload, threads, speculative decoding, memory per "
            "device and a predicted decode speed, with the reasons for each choice. Sizes are exact from the GGUF "
            "header, read from the Hub with range requests (a few MB) when the model is not downloaded; nothing "
            "is downloaded."
        ),
    )
    add_plan_options(parser)
    parser.add_argument(
        "--why",
        action="store_true",
        help="every reason behind the plan (context, KV cache, threads, loading...), not only those that decide "
        "it (--json always has them all, each with its code)",
    )
    parser.add_argument(
        "--compare-fit",
        action="store_true",
        help="also run llama.cpp's llama-fit-params on the local model file and show its choice next to the plan",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.commands.options import launch_from_args
    from clover_local.llamacpp.fit_params import compare_fit
    from clover_local.plan.render import plan_to_dict

    launch = launch_from_args(args)
    plan, preset = launch.plan, launch.preset
    fit = compare_fit(plan, preset, simulated=args.simulate is not None) if args.compare_fit else None
    if args.json:
        out = plan_to_dict(plan)
        if fit is not None:
            out["compare_fit"] = fit
        out["notices"] = [n.text for n in launch.notices]  # as "reasons"; "notes" as "why"
        out["notes"] = [{"code": n.code, "text": n.text} for n in launch.notices]
        print(json.dumps(out, indent=2))
        return 0
    print("\n".join(plan_text(launch, fit, every_reason=args.why)))
    return 0


def plan_text(launch: Launch, fit: dict[str, Any] | None = None, *, every_reason: bool = False) -> list[str]:
    """What ``plan`` prints: the plan (``render.describe_plan``), the command that runs it, the launch's notes
    and llama-fit-params' choice beside it."""
    from clover_local.plan.render import describe_plan

    lines = describe_plan(launch.plan, launch.preset, every_reason=every_reason)
    if launch.runner.kind == "llama-server":
        lines += ["", "Command (`clover-local command`):", f"  {launch.command}"]
    if launch.notices:
        lines += ["", "Notes:"] + [f"  - {n.text}" for n in launch.notices]
    if fit is not None:
        lines += ["", "Plan vs llama.cpp's own fit (llama-fit-params):", *fit_lines(fit)]
    return lines


def fit_lines(fit: dict[str, Any]) -> list[str]:
    """llama-fit-params' choice beside the plan (``llamacpp.fit_params.compare_fit``), indented, or why not."""
    if not fit["shown"]:
        return [f"  not shown: {fit['why']}"]
    return [f"  {line}" if line else "" for line in fit["text"]]
