"""``clover-local chat``: open the app straight at the chat, with a given GGUF or a preset's model."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from clover_local.errors import UsageError

if TYPE_CHECKING:
    from clover_local.tui.app import StartOptions


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "chat",
        help="chat in the terminal (straight to the chat screen)",
        description="Open the chat with a model named as MODEL (or --model): a preset, a local GGUF or a Hugging"
        " Face repo already downloaded.",
    )
    from clover_local.commands.options import add_model_argument

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
    from clover_local.commands.options import add_rpc_options

    add_rpc_options(parser)
    from clover_local.commands.options import add_force_option, add_spec_option

    add_spec_option(parser)
    add_force_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.tui.app import run_app

    return run_app(start_options(args))


def start_options(args: argparse.Namespace) -> StartOptions:
    """What the app opens with: the model named in any form (``MODEL``, ``--model``, ``--preset``), checked
    before the app starts (its file, its architecture, ``--ctx`` against its limit, ``--rpc``)."""
    from clover_local.commands.options import apply_model_ref, require_local_model
    from clover_local.tui.app import StartOptions

    apply_model_ref(args)
    require_local_model(args)
    model_path = _resolve_model(args.model, args.preset, getattr(args, "quant", None))
    if model_path is not None:
        from clover_local.runtime import check_local_file

        check_local_file(model_path, force=args.force)  # an architecture llama.cpp cannot load: said now
    if args.ctx is not None:
        _check_ctx(args.ctx, args.preset, model_path)
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
    return StartOptions(
        preset=args.preset,
        model_path=model_path,
        ctx=args.ctx,
        rpc=args.rpc,
        spec=args.spec,
        force=args.force,
    )


def _check_ctx(ctx: int, preset_name: str | None, model_path: str | None) -> None:
    """--ctx against the model's limit (its own header's when the file is known), before the app starts."""
    from clover_local.plan.planner import check_context
    from clover_local.presets import load_preset

    preset = load_preset(preset_name)
    if model_path:
        from clover_local.gguf.header import read_local_header
        from clover_local.plan.local_file import preset_from_header

        preset = preset_from_header(preset, read_local_header(Path(model_path)), Path(model_path))
    check_context(ctx, preset)


def _resolve_model(model: str | None, preset_name: str | None, quant: str | None = None) -> str | None:
    """The GGUF to load: the one given, else the preset's (test presets assemble theirs locally).

    None means "not on disk yet": the app then opens on the plan screen to choose and download it.
    """
    from clover_local.presets import load_preset
    from clover_local.runtime import find_model

    if not model and preset_name is None:
        return None
    found = find_model(None if model else load_preset(preset_name), model, quant or "auto")
    return str(found) if found is not None else None
