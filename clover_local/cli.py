"""The ``clover-local`` command line. With no arguments it opens the TUI.

Each subcommand lives in ``clover_local/commands/<name>.py`` and exposes
``register(subparsers) -> None``, which adds its parser and sets ``func=run`` where
``run(args: argparse.Namespace) -> int``. Heavy imports (llama_cpp, textual, huggingface_hub) happen
inside ``run``, so ``clover-local --help`` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from clover_local import __version__
from clover_local.errors import CloverError
from clover_local.user_files import take_notices

COMMANDS = (
    "detect",
    "plan",
    "command",
    "download",
    "verify",
    "models",
    "run",
    "bench",
    "compare",
    "chat",
    "serve",
    "doctor",
    "worker",
    "runtime",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clover-local",
        description="Run Clover-35B-A3B-Preview well on your own machine. With no command, opens the app.",
    )
    parser.add_argument("--version", action="version", version=f"clover-local {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"clover_local.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"clover_local.commands.{name}":
                continue  # command not built into this version
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if getattr(args, "func", None) is None:
            from clover_local.tui.app import run_app

            return run_app()
        return int(args.func(args) or 0)
    except CloverError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # Output piped into `head` and the like: stop quietly, as Unix tools do.
        sys.stderr.close()
        return 0
    finally:
        for notice in take_notices():  # damaged settings or presets that were set aside
            print(f"warning: {notice}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
