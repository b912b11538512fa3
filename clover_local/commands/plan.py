"""``clover-local plan``: what quant, context and llama.cpp settings fit this machine (or a described one), and why."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clover_local.plan.report import add_plan_options

    parser = subparsers.add_parser(
        "plan",
        help="decide quant, context, GPU layers and expert offload for this machine, and say why",
        description=(
            "Plan how llama.cpp should run the model on this machine (or one described with --simulate): quant, "
            "context, KV cache type, GPU layers and MoE expert offload, threads, speculative decoding, memory per "
            "device and a predicted decode speed, with the reasons for each choice. Nothing is downloaded."
        ),
    )
    add_plan_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.plan.report import describe_plan, plan_from_args, plan_to_dict

    plan, preset = plan_from_args(args)
    if args.json:
        print(json.dumps(plan_to_dict(plan), indent=2))
    else:
        print("\n".join(describe_plan(plan, preset)))
    return 0
