"""Options shared by the commands that plan (``plan``, ``command``, ``serve``), and the plan they ask for."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from clover_local.errors import UsageError

if TYPE_CHECKING:
    from clover_local.launch import Launch, LaunchRequest
    from clover_local.plan.speculation import SpecMode


MODEL_HELP = (
    "the model: a preset (smollm2-135m), a .gguf file, ORG/REPO[:QUANT] as llama.cpp's -hf takes it, "
    "hf.co/ORG/REPO[:QUANT] as Ollama takes it, or hf:ORG/REPO[:QUANT] (default: clover-35b-a3b)"
)


def add_model_argument(parser: argparse.ArgumentParser) -> None:
    """The model as a positional argument, in the one grammar (``clover_local.model_ref``); ``--model`` takes the
    same forms. :func:`apply_model_ref` reads either into ``--preset/--model/--repo/--quant``."""
    parser.add_argument("model_ref", nargs="?", metavar="MODEL", help=MODEL_HELP)


def apply_model_ref(args: argparse.Namespace) -> None:
    """Read the model a command was given (``MODEL`` or ``--model``, in any form of :mod:`clover_local.model_ref`)
    into the options the command already reads: ``preset``, ``model`` (a local file), ``repo`` and ``quant``.
    A :class:`UsageError` when the model is named twice, or an option contradicts it."""
    from clover_local.model_files import named_model
    from clover_local.model_ref import parse_model_ref
    from clover_local.presets import list_presets

    positional, flag = getattr(args, "model_ref", None), getattr(args, "model", None)
    if positional and flag:
        raise UsageError("The model is named twice: as MODEL and with --model.", "Name it once.")
    text = positional or flag
    if not text:
        return
    named = named_model(parse_model_ref(str(text), presets=list_presets()))
    if named.preset is not None:
        asked = getattr(args, "preset", None)
        if asked and asked != named.preset:
            raise UsageError(
                f"{text} is the preset {named.preset}, and --preset says {asked}.", "Name the model once."
            )
        args.preset = named.preset
    args.model = named.model
    if named.repo is not None:
        asked_repo = getattr(args, "repo", None)
        if asked_repo and asked_repo.lower() != named.repo.lower():
            raise UsageError(
                f"{text} names {named.repo}, and --repo says {asked_repo}.", "Name the repo once."
            )
        args.repo = named.repo
    if named.quant is not None:
        asked_quant = getattr(args, "quant", None)
        if asked_quant not in (None, "auto") and str(asked_quant).lower() != named.quant.lower():
            raise UsageError(
                f"{text} names the quant {named.quant}, and --quant says {asked_quant}.",
                "Name the quant once.",
            )
        args.quant = named.quant
    args.model_ref = None  # read once: a second call sees the options it set


def require_local_model(args: argparse.Namespace) -> None:
    """For the commands that load the model (``run``, ``chat``, ``serve``): a Hub repo that is no preset's own is
    run from its downloaded file (``args.model``), found without the network."""
    from clover_local.model_files import require_repo_file

    repo = getattr(args, "repo", None)
    if repo and not getattr(args, "model", None):
        args.model = str(require_repo_file(repo, getattr(args, "quant", None)))
        args.repo = None


def add_plan_options(parser: argparse.ArgumentParser, *, offline: bool = True) -> None:
    """The options of the commands that plan; ``offline``: ``--offline`` too, for those that read GGUF headers
    from the Hub (``plan``, ``command``)."""
    add_model_argument(parser)
    parser.add_argument(
        "--preset", metavar="NAME", help="preset name or path to a .toml (default: clover-35b-a3b)"
    )
    parser.add_argument("--quant", default="auto", metavar="auto|Q4_K_M|Q8_0", help="quant (default: auto)")
    parser.add_argument("--ctx", type=int, metavar="N", help="context size in tokens (default: decided)")
    parser.add_argument("--goal", choices=("quality", "speed"), default="quality", help="what to favour")
    add_threads_option(
        parser,
        "CPU threads at most (default: every physical core; the embedded engine uses fewer while other programs "
        "keep the CPU busy)",
    )
    parser.add_argument(
        "--simulate",
        metavar="SPEC",
        help="plan for a described machine, e.g. ram=32G,gpu=nvidia:12G (see docs/detect.md)",
    )
    parser.add_argument(
        "--model",
        metavar="MODEL",
        help="the model, as MODEL (a local GGUF is planned with its exact tensor sizes)",
    )
    parser.add_argument(
        "--repo",
        metavar="ORG/NAME",
        help="another GGUF repo of the preset's model: its quants as its files name them, picked as "
        "llama.cpp's -hf REPO[:QUANT] picks them",
    )
    parser.add_argument(
        "--parallel",
        type=_slots,
        metavar="N|auto",
        help="slots: requests decoded at once, each with its own context (serve's default: auto, as many as "
        "fit up to 4; elsewhere 1)",
    )
    add_rpc_options(parser)
    add_spec_option(parser)
    add_force_option(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    if offline:
        parser.add_argument(
            "--offline",
            action="store_true",
            help="ask no server: sizes from downloaded files and headers read before, else the preset's estimate",
        )


def add_threads_option(parser: argparse.ArgumentParser, help: str) -> None:
    """``--threads N``, the same on every command that takes it: a whole number, 1 or more."""
    parser.add_argument("--threads", type=_positive, metavar="N", help=help)


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {number}")
    return number


def _slots(value: str) -> int:
    """``--parallel``: a number of slots, or ``auto`` (0: decide)."""
    if value == "auto":
        return 0
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of slots: {value!r} (a number, or auto)") from None


def add_force_option(parser: argparse.ArgumentParser) -> None:
    """``--force``: go on with a GGUF whose architecture the llama.cpp here cannot load (checked first)."""
    parser.add_argument(
        "--force",
        action="store_true",
        help="go on even when the llama.cpp here cannot load the model's architecture (it is checked first)",
    )


def add_rpc_options(parser: argparse.ArgumentParser) -> None:
    """``--rpc`` and ``--link``: pool devices other machines lend through llama.cpp's RPC backend."""
    parser.add_argument(
        "--rpc",
        metavar="[KIND@]HOST:PORT,...",
        help="workers started with `clover-local worker` on other machines: their devices are read and planned "
        "with this machine's (KIND: cpu, gpu:nvidia, gpu:amd, gpu:intel, gpu:apple; see docs/rpc.md)",
    )
    parser.add_argument(
        "--link",
        metavar="BW[/RTT]",
        help="the network to the workers, e.g. 1Gbit/0.5ms or 300MB/s (default: measured through the worker)",
    )


def add_spec_option(parser: argparse.ArgumentParser) -> None:
    """``--spec MODE``: which self-speculation (``plan.speculation``); shared by plan, command, run, chat, serve."""
    from clover_local.plan.speculation import SPEC_MODES

    parser.add_argument(
        "--spec",
        choices=SPEC_MODES,
        default="auto",
        metavar="MODE",
        help="self-speculation: auto (decided from the files, the placement and bench), mtp, dflash, dspark,"
        " eagle3 (a drafter head from the model's files), ngram (lookup in the context) or off",
    )


def launch_request(args: argparse.Namespace, **overrides: object) -> LaunchRequest:
    """The :class:`~clover_local.launch.LaunchRequest` a command's options ask for (every command builds its
    request here); ``overrides`` win over the options (e.g. ``model=`` a file found for the preset)."""
    from dataclasses import replace

    from clover_local.launch import LaunchRequest

    apply_model_ref(args)
    spec: SpecMode = getattr(args, "spec", "auto")
    model = getattr(args, "model", None)
    # serve decides slots unless told (its --parallel defaults to 0: auto); every other front end runs one.
    asked: int | None = getattr(args, "parallel", None)
    parallel = (1 if asked is None else asked) or None
    request = LaunchRequest(
        preset=getattr(args, "preset", None),
        model=str(model) if model else None,
        repo=getattr(args, "repo", None),
        quant=getattr(args, "quant", "auto"),
        ctx=getattr(args, "ctx", None),
        goal=getattr(args, "goal", "quality"),
        threads=getattr(args, "threads", None),
        spec=spec,
        engine=getattr(args, "engine", None),
        llama_server=getattr(args, "llama_server", None),
        rpc=getattr(args, "rpc", None),
        link=getattr(args, "link", None),
        simulate=getattr(args, "simulate", None),
        offline=getattr(args, "offline", False),
        force=getattr(args, "force", False),
        parallel=parallel,
    )
    return replace(request, **overrides)  # type: ignore[arg-type]


def launch_from_args(args: argparse.Namespace, *, find_binary: object = None, **overrides: object) -> Launch:
    """The launch the options ask for (:func:`clover_local.launch.decide_launch`)."""
    from clover_local.launch import decide_launch

    return decide_launch(launch_request(args, **overrides), find_binary=find_binary)  # type: ignore[arg-type]
