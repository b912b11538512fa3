"""``clover-local serve``: an OpenAI-compatible endpoint (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health``) for agents and editors, on the plan, with the embedded engine or llama-server."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from clover_local.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clover_local.commands.options import add_plan_options

    parser = subparsers.add_parser(
        "serve",
        help="serve the model over an OpenAI-compatible HTTP API",
        description=(
            "Serve the model on an OpenAI-compatible API (chat and text completions, streamed or not). Binds "
            "to 127.0.0.1 unless --host says otherwise; with --api-key every request must carry the key. "
            "--engine auto uses an upstream llama-server when one is found, else the embedded engine."
        ),
    )
    add_plan_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--api-key", metavar="KEY", help="refuse requests without this key (401)")
    key.add_argument("--api-key-file", metavar="FILE", help="read the key from FILE (first non-comment line)")
    parser.add_argument(
        "--engine", choices=("auto", "embedded", "llama-server"), default="auto", help="default: auto"
    )
    parser.add_argument("--llama-server", metavar="PATH", help="the llama-server binary to use")
    parser.add_argument(
        "--no-spec", dest="spec", action="store_const", const="off", help="same as --spec off"
    )
    parser.add_argument("--verbose", action="store_true", help="print llama-server's log and every request")
    parser.set_defaults(func=run)


def read_api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key or --api-key-file (first line that is not empty or a # comment)."""
    if args.api_key is not None:
        if not args.api_key.strip():
            raise UsageError("--api-key is empty.", "Give a non-empty key, or leave the option out.")
        return str(args.api_key.strip())
    if args.api_key_file is None:
        return None
    path = Path(args.api_key_file).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"--api-key-file {path}: {exc.strerror}.") from None
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    raise UsageError(f"--api-key-file {path} holds no key.", "Put the key on the first line.")


def run(args: argparse.Namespace) -> int:
    from clover_local.commands.options import launch_from_args
    from clover_local.launch import measure_verify_costs, open_launch
    from clover_local.presets import load_preset
    from clover_local.runtime import require_model
    from clover_local.serve.api import ApiConfig, bind_warning
    from clover_local.serve.runner import serve_forever

    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a port number (1-65535).")
    api_key = read_api_key(args)
    warning = bind_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr)
    model = require_model(None if args.model else load_preset(args.preset), args.model, args.quant)
    launch = launch_from_args(args, model=str(model))
    plan, preset = launch.plan, launch.preset
    from clover_local.plan.pooled import pooling_summary

    summary = pooling_summary(plan)
    if summary:
        print(f"note: {summary}", file=sys.stderr)
    print(f"engine: {launch.runner.kind} ({launch.runner.why})", file=sys.stderr)
    on_log = (lambda line: print(f"[llama-server] {line}", file=sys.stderr)) if args.verbose else None
    opened = open_launch(launch, on_log=on_log)
    measured = measure_verify_costs(opened)
    for notice in (*opened.notices, *([measured] if measured else [])):
        print(f"note: {notice}", file=sys.stderr)
    plan = opened.plan
    config = ApiConfig.for_model(preset.name, plan.model_path, api_key)
    print(
        f"serving {config.model_id} on http://{args.host}:{args.port}/v1 "
        f"(context {opened.engine.n_ctx} tokens{', API key required' if api_key else ''}); Ctrl-C stops",
        file=sys.stderr,
    )
    try:
        serve_forever(
            opened.engine,
            config,
            host=args.host,
            port=args.port,
            log_level="info" if args.verbose else "warning",
        )
    finally:
        opened.engine.close()
    return 0
