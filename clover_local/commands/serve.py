"""``clover-local serve``: an OpenAI-compatible endpoint (``/v1/chat/completions``, ``/v1/completions``,
``/v1/models``, ``/health``) for agents and editors, on the plan, with the embedded engine or llama-server."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

from clover_local.errors import UsageError

API_KEY_ENV = "CLOVER_API_KEY"
ALLOWED_HOSTS_ENV = "CLOVER_ALLOWED_HOSTS"


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
    add_plan_options(parser, offline=False)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8080, help="port (default: 8080)")
    key = parser.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key-file",
        metavar="FILE",
        help="refuse requests without the key in FILE (first non-comment line; keep it chmod 600)."
        f" Or set {API_KEY_ENV}",
    )
    key.add_argument(
        "--api-key",
        metavar="KEY",
        help="the key on the command line (other users see it in `ps`: prefer the file)",
    )
    parser.add_argument(
        "--allowed-host",
        metavar="NAME",
        action="append",
        default=[],
        help="also answer requests whose Host is NAME (repeatable; * for any) when bound to loopback;"
        f" other names get 403 (DNS rebinding). Also {ALLOWED_HOSTS_ENV} (comma-separated)",
    )
    parser.add_argument(
        "--engine", choices=("auto", "embedded", "llama-server"), default="auto", help="default: auto"
    )
    parser.add_argument("--llama-server", metavar="PATH", help="the llama-server binary to use")
    parser.add_argument("--verbose", action="store_true", help="print llama-server's log and every request")
    parser.add_argument(
        "--max-queue",
        type=int,
        default=None,
        metavar="N",
        help="requests that may wait for a slot (default: 4 per slot); past it a request gets 503 with "
        "Retry-After",
    )
    parser.add_argument(
        "--max-request-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="longest one reply may run (default: 1800); then it is stopped and answered with what it made",
    )
    parser.add_argument(
        "--keep-serving",
        action="store_true",
        help="when the model's llama-server keeps stopping and is given up, stay up and answer 503 with the "
        "reason (default: exit with status 1 and the reason, so systemd or Docker starts serve again)",
    )
    parser.set_defaults(func=run, parallel=0)


def read_api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file (first line that is not empty or a # comment) or, with
    neither, ``CLOVER_API_KEY``."""
    if args.api_key is not None:
        if not args.api_key.strip():
            raise UsageError("--api-key is empty.", "Give a non-empty key, or leave the option out.")
        print(
            f"note: --api-key shows the key to every user of this machine (`ps`); prefer --api-key-file or {API_KEY_ENV}.",
            file=sys.stderr,
        )
        return str(args.api_key.strip())
    if args.api_key_file is None:
        from_env = os.environ.get(API_KEY_ENV, "").strip()
        return from_env or None
    path = Path(args.api_key_file).expanduser()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"--api-key-file {path}: {exc.strerror}.") from None
    for line in lines:
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()
    raise UsageError(f"--api-key-file {path} holds no key.", "Put the key on the first line.")


def names_typed(args: argparse.Namespace) -> tuple[str, ...]:
    """The model as the person typed it (``hf.co/ORG/REPO:QUANT``, ``ORG/REPO``, a preset...), read before the
    options are: the server answers to it as well. A file's path is not a name (its file name is)."""
    typed = [str(t).strip() for t in (getattr(args, "model_ref", None), getattr(args, "model", None)) if t]
    return tuple(t for t in typed if not t.lower().endswith(".gguf"))


def preset_asked(args: argparse.Namespace, typed: tuple[str, ...]) -> str | None:
    """The preset the person asked for (``--preset``, or named as the model), or the default one when no model
    was named at all; None for a file or repo named without a preset. Read after :func:`model_file`."""
    from clover_local import settings

    if args.preset and not str(args.preset).endswith(".toml"):
        return str(args.preset)
    return None if typed or args.model else settings.default_preset_name()


def model_file(args: argparse.Namespace) -> Path:
    """The GGUF ``serve`` loads, from the model named in any form (``MODEL``, ``--model``, ``--preset``,
    ``--repo``/``--quant``): a preset's file, a local file, or a Hub repo's downloaded file."""
    from clover_local.commands.options import apply_model_ref, require_local_model
    from clover_local.model_files import require_model
    from clover_local.presets import load_preset

    apply_model_ref(args)
    require_local_model(args)
    return require_model(None if args.model else load_preset(args.preset), args.model, args.quant)


def run(args: argparse.Namespace) -> int:
    from clover_local.commands.options import launch_from_args
    from clover_local.decide import engine_notice
    from clover_local.launch import open_launch
    from clover_local.plan.pooled import pooling_summary
    from clover_local.serve.api import ApiConfig, bind_warning
    from clover_local.serve.request_guard import hosts_allowed
    from clover_local.serve.runner import serve_forever

    if args.max_queue is not None and args.max_queue < 0:
        raise UsageError(f"--max-queue {args.max_queue} is negative.", "Give 0 or more waiting requests.")
    if args.max_request_time is not None and not args.max_request_time > 0:
        raise UsageError(
            f"--max-request-time {args.max_request_time:g} is not a time.", "Give seconds above 0, e.g. 600."
        )
    if not 0 < args.port < 65536:
        raise UsageError(f"--port {args.port} is not a port number (1-65535).")
    api_key = read_api_key(args)
    warning = bind_warning(args.host, api_key)
    if warning:
        print(warning, file=sys.stderr)
    typed = names_typed(args)
    model = model_file(args)
    asked = preset_asked(args, typed)
    launch = launch_from_args(args, model=str(model))
    preset = launch.preset
    summary = pooling_summary(launch.plan)
    if summary:
        print(f"note: {summary}", file=sys.stderr)
    said = engine_notice(launch.runner)
    print(f"note: {said.text}", file=sys.stderr)  # before the load, which may take minutes; said once
    on_log = (lambda line: print(f"[llama-server] {line}", file=sys.stderr)) if args.verbose else None
    opened = open_launch(launch, on_log=on_log)
    for notice in opened.notices:
        if notice.code != said.code:
            print(f"note: {notice.text}", file=sys.stderr)
    plan = opened.plan
    extra_hosts = [*args.allowed_host, *os.environ.get(ALLOWED_HOSTS_ENV, "").split(",")]
    config = replace(
        ApiConfig.for_model(asked or preset.name, plan.model_path, api_key, also=(*typed, preset.name)),
        allowed_hosts=hosts_allowed(args.host, extra_hosts),
        max_queue=args.max_queue,
    )
    if args.max_request_time is not None:
        config = replace(config, max_request_s=args.max_request_time)
    print(
        f"serving {config.model_id} on http://{args.host}:{args.port}/v1 "
        f"(context {opened.engine.n_ctx} tokens per slot, {plan.parallel} slot{'s' if plan.parallel > 1 else ''}"
        f"{', API key required' if api_key else ''}); Ctrl-C stops",
        file=sys.stderr,
    )
    # Slots and the queue in serve's log: refusals (queue full) always; waits and admissions with --verbose.
    logging.basicConfig(format="serve: %(message)s")
    logging.getLogger("clover_local.serve").setLevel(logging.INFO if args.verbose else logging.WARNING)
    # A llama-server child that stops, its last lines, and its restart: always on this terminal (never in a reply).
    logging.getLogger("clover_local.runner").setLevel(logging.INFO)
    try:
        serve_forever(
            opened.engine,
            config,
            host=args.host,
            port=args.port,
            log_level="info" if args.verbose else "warning",
            keep_serving=args.keep_serving,
        )
    finally:
        opened.engine.close()
    return 0
