"""``clover-local chat``: open the app straight at the chat, with a given GGUF or a preset's model."""

from __future__ import annotations

import argparse

from clover_local.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    parser = subparsers.add_parser(
        "chat",
        help="chat in the terminal (straight to the chat screen)",
        description="Open the chat with a local GGUF (--model) or a preset's model (--preset).",
    )
    parser.add_argument("--model", metavar="PATH", help="a local .gguf file (first shard of a split model)")
    parser.add_argument(
        "--preset", metavar="NAME", help="a preset name (shipped: clover-35b-a3b, gemma3-270m)"
    )
    parser.add_argument(
        "--ctx", type=int, metavar="N", help="context size in tokens (default: saved or preset)"
    )
    from clover_local.commands.options import add_spec_option

    add_spec_option(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    model_path = _resolve_model(args.model, args.preset)
    if args.ctx is not None and args.ctx < 256:
        raise UsageError(f"--ctx {args.ctx} is too small.", "Use at least 256 tokens.")
    from clover_local.tui.app import StartOptions, run_app

    return run_app(StartOptions(preset=args.preset, model_path=model_path, ctx=args.ctx, spec=args.spec))


def _resolve_model(model: str | None, preset_name: str | None) -> str | None:
    """The GGUF to load: the one given, else the preset's (test presets assemble theirs locally).

    None means "not on disk yet": the app then opens on the plan screen to choose and download it.
    """
    from clover_local.presets import load_preset
    from clover_local.runtime import find_model

    if not model and preset_name is None:
        return None
    found = find_model(None if model else load_preset(preset_name), model)
    return str(found) if found is not None else None
