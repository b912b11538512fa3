"""``clover-local command``: the exact ``llama-server`` command line for the plan, shell-quoted."""

from __future__ import annotations

import argparse
import json
import shlex
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clover_local.plan.types import Plan
    from clover_local.presets import Preset


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clover_local.commands.options import add_plan_options

    parser = subparsers.add_parser(
        "command",
        help="print the llama-server command line for the plan",
        description=(
            "Print the upstream llama-server command that runs the plan (same options as `plan`, the same plan and "
            "flags: one slot unless --parallel says otherwise, as `serve --parallel auto` decides). Without "
            "--model, a planned quant already downloaded is run from its file (-m PATH); one not downloaded yet is "
            "fetched by the server itself from Hugging Face (-hf REPO:QUANT). A model only a newer llama.cpp "
            "loads is printed with the release it needs and the command that installs it."
        ),
    )
    add_plan_options(parser)
    parser.add_argument(
        "--binary", default="llama-server", help="llama-server binary (default: llama-server)"
    )
    parser.add_argument(
        "--engine",
        choices=("llama-server", "vllm", "sglang"),
        default="llama-server",
        help="llama-server (default), or the command for a GPU server with vLLM or SGLang (the path beyond RPC)",
    )
    parser.add_argument(
        "--hf-model",
        metavar="REPO",
        help="vLLM/SGLang: the safetensors repo (default: the GGUF repo without -GGUF)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from clover_local.commands.options import launch_from_args
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.llamacpp.server_args import printed_endpoint

    printed = ServerBinary(Path(args.binary), "command --binary")  # printed, not run: nothing to look for
    launch = launch_from_args(args, engine="llama-server", find_binary=lambda _configured: printed)
    plan, preset = launch.plan, launch.preset
    if args.engine != "llama-server":
        return _print_gpu_server_command(args, plan, preset)
    argv = [args.binary, *printed_endpoint(launch.settings.argv(hf_repo=preset.repo))]
    if launch.runner.runtime is not None and args.binary == "llama-server":
        # Only an installed runtime loads this model: its llama-server, with the flags it accepts.
        argv = shlex.split(launch.command)
    arch = plan.architecture
    needs = arch.runs_with if arch is not None and arch.install is not None and not arch.supported else None
    if args.json:
        out: dict[str, object] = {"argv": argv, "command": shlex.join(argv), "fits": plan.fits}
        if needs is not None and arch is not None:
            out |= {"needs": needs, "install_command": arch.install_command}
        print(json.dumps(out))
    else:
        if needs is not None:
            print(f"# {needs}")
        if not plan.fits:
            print("# warning: this plan does not fit well; see `clover-local plan` for why")
        print(shlex.join(argv))
    return 0


def _print_gpu_server_command(args: argparse.Namespace, plan: Plan, preset: Preset) -> int:
    from clover_local.plan.server_engines import notes, sglang_argv, vllm_argv

    build = vllm_argv if args.engine == "vllm" else sglang_argv
    argv = build(plan, preset, args.hf_model)
    if args.json:
        out = {"engine": args.engine, "argv": argv, "command": shlex.join(argv), "notes": notes(plan)}
        print(json.dumps(out))
    else:
        for note in notes(plan):
            print(f"# {note}")
        print(shlex.join(argv))
    return 0
