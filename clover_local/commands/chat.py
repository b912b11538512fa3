"""``clover-local chat``: open the app straight at the chat, with a given GGUF or a preset's model."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from clover_local.commands.options import (
    add_force_option,
    add_model_argument,
    add_rpc_options,
    add_spec_option,
    apply_model_ref,
    require_local_model,
)
from clover_local.errors import UsageError

if TYPE_CHECKING:
    from clover_local.facts import LaunchFacts
    from clover_local.tui.app import StartOptions


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "chat",
        help="chat in the terminal (straight to the chat screen)",
        description="Open the chat with a model named as MODEL (or --model): a preset, a local GGUF or a Hugging"
        " Face repo already downloaded.",
    )
    add_model_argument(parser)
    parser.add_argument(
        "--model", metavar="MODEL", help="the model, as MODEL (a .gguf: the first shard of a split model)"
    )
    parser.add_argument(
        "--preset",
        metavar="NAME",
        help="a preset name (shipped: clover-35b-a3b, gemma3-270m, smollm2-135m: the demo model)",
    )
    parser.add_argument(
        "--ctx", type=int, metavar="N", help="context size in tokens (default: saved or preset)"
    )
    add_rpc_options(parser)
    add_spec_option(parser)
    add_force_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.tui.app import run_app

    return run_app(start_options(args))


def start_options(args: argparse.Namespace) -> StartOptions:
    """What the app opens with: the model named in any form (``MODEL``, ``--model``, ``--preset``), checked
    before the app starts (its file, its architecture, ``--ctx`` against its limit, ``--rpc``)."""
    from clover_local.tui.app import StartOptions

    apply_model_ref(args)
    require_local_model(args)
    model_path = _resolve_model(args.model, args.preset, getattr(args, "quant", None))
    if args.ctx is not None and model_path is None:
        from clover_local.plan.planner import check_context
        from clover_local.presets import load_preset

        check_context(args.ctx, load_preset(args.preset))
    if args.link is not None:
        raise UsageError("chat measures the link to the workers itself; --link is for plan and command.")
    if args.rpc is not None and model_path is None:
        raise UsageError(
            "chat --rpc needs the model on disk.",
            "Download it first (clover-local download), or pass --model PATH.",
        )
    if args.rpc is not None:
        from clover_local.detect.remote import parse_rpc

        parse_rpc(args.rpc)  # a typo is said now, not inside the app
    facts = _facts_checked(args, model_path) if model_path is not None else None
    return StartOptions(
        preset=args.preset,
        model_path=model_path,
        ctx=args.ctx,
        rpc=args.rpc,
        spec=args.spec,
        force=args.force,
        facts=facts,
    )


def _facts_checked(args: argparse.Namespace, model_path: str) -> LaunchFacts:
    """The facts of the file's launch, gathered once for the whole command (the app decides its launch from
    them), and checked now without deciding it: an architecture no llama.cpp here loads and a ``--ctx`` beyond
    the file's own limit are said before the app starts (``decide.check_request``)."""
    from clover_local.decide import check_request
    from clover_local.launch import LaunchRequest
    from clover_local.launcher import Launcher

    request = LaunchRequest(
        args.preset, model_path, ctx=args.ctx, spec=args.spec or "auto", rpc=args.rpc, force=args.force
    )
    facts = Launcher().facts_for(request)
    check_request(request, facts)
    return facts


def _resolve_model(model: str | None, preset_name: str | None, quant: str | None = None) -> str | None:
    """The GGUF to load: the one given, else the preset's (test presets assemble theirs locally).

    None means "not on disk yet": the app then opens on the plan screen to choose and download it.
    """
    from clover_local.model_files import find_model
    from clover_local.presets import load_preset

    if not model and preset_name is None:
        return None
    found = find_model(None if model else load_preset(preset_name), model, quant or "auto")
    return str(found) if found is not None else None
