"""``clover-local detect [--json] [--simulate SPEC]``: what this machine has, as the planner will see it."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "detect",
        help="show CPU, RAM, disk, every GPU (free/total) and what the llama.cpp build can use",
        description=(
            "Detect this machine: CPU and its AVX2/AVX-512/NEON support, RAM, free disk where models are stored, "
            "each GPU with its own free and total memory, and the llama.cpp backends of the installed "
            "llama-cpp-python. Every probe fails soft; the probe lines say what was found or why not."
        ),
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--simulate",
        metavar="SPEC",
        help="describe a machine instead of detecting it, e.g. ram=32G,gpu=nvidia:12G,cpu=16 (see docs/detect.md)",
    )
    from clover_local.commands.options import add_rpc_options

    add_rpc_options(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.detect.report import describe_machine, machine_to_dict
    from clover_local.model_files import detect

    machine = detect(args.simulate, args.rpc, args.link)
    if args.json:
        print(json.dumps(machine_to_dict(machine), indent=2))
    else:
        print("\n".join(describe_machine(machine)))
    return 0
