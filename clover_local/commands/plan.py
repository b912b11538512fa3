"""``clover-local plan``: what quant, context and llama.cpp settings fit this machine (or a described one), and why;
with ``--compare-fit``, llama.cpp's own fit (``llama-fit-params``) next to the plan."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from clover_local.errors import CloverError
from clover_local.plan.types import Plan
from clover_local.presets import Preset


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    from clover_local.plan.report import add_plan_options, add_size_options

    parser = subparsers.add_parser(
        "plan",
        help="decide quant, context, GPU layers and expert offload for this machine, and say why",
        description=(
            "Plan how llama.cpp should run the model on this machine (or one described with --simulate): quant, "
            "context, KV cache type, GPU layers and MoE expert offload, threads, speculative decoding, memory per "
            "device and a predicted decode speed, with the reasons for each choice. Sizes are exact from the GGUF "
            "header, read from the Hub with range requests (a few MB) when the model is not downloaded; nothing "
            "is downloaded."
        ),
    )
    add_plan_options(parser)
    add_size_options(parser)
    parser.add_argument(
        "--compare-fit",
        action="store_true",
        help="also run llama.cpp's llama-fit-params on the local model file and show its choice next to the plan",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from clover_local.plan.report import describe_plan, plan_from_args, plan_to_dict

    plan, preset = plan_from_args(args)
    fit = compare_fit(plan, preset, simulated=args.simulate is not None) if args.compare_fit else None
    if args.json:
        out = plan_to_dict(plan)
        if fit is not None:
            out["compare_fit"] = fit
        print(json.dumps(out, indent=2))
        return 0
    lines = describe_plan(plan, preset)
    if fit is not None:
        lines += ["", "Plan vs llama.cpp's own fit (llama-fit-params):"]
        if fit["shown"]:
            lines += [f"  {line}" if line else "" for line in fit["text"]]
        else:
            lines.append(f"  not shown: {fit['why']}")
    print("\n".join(lines))
    return 0


def compare_fit(plan: Plan, preset: Preset, *, simulated: bool) -> dict[str, Any]:
    """Run ``llama-fit-params`` for the plan's model file and context and line its choice up with the plan's;
    ``{"shown": False, "why": ...}`` when it cannot be run or fails."""
    from clover_local.llamacpp.fit_params import compare, describe, run_fit_params

    if simulated:
        return _not_shown(
            "--simulate describes another machine, while llama-fit-params fits the devices of this one."
        )
    if plan.model_path is None:
        return _not_shown(
            f"llama-fit-params reads the model file, and {preset.display_name} {plan.quant} is not on this "
            f"machine: download it (`clover-local download --preset {preset.name} --quant {plan.quant}`) "
            "or pass --model PATH."
        )
    try:
        binary = fit_params_binary()
        if binary is None:
            return _not_shown(
                "no llama-fit-params binary: scripts/build-llama-server builds it next to llama-server "
                "(or put llama.cpp's on PATH)."
            )
        fit = run_fit_params(plan, binary)
    except CloverError as exc:
        return _not_shown(str(exc))
    comparison = compare(plan, fit, preset.architecture.n_layers)
    return {
        "shown": True,
        "binary": str(binary),
        "rows": [list(row) for row in comparison.rows],
        "differences": list(comparison.differences),
        "raw": fit.raw,
        "text": describe(comparison),
    }


def fit_params_binary() -> Path | None:
    """``llama-fit-params`` next to the llama-server clover-local would use (built or configured), else on
    PATH; None when there is none."""
    import shutil

    from clover_local.llamacpp.binary import find_llama_server

    server = find_llama_server()
    if server is not None:
        return server.sibling("llama-fit-params")
    found = shutil.which("llama-fit-params")
    return Path(found) if found else None


def _not_shown(why: str) -> dict[str, Any]:
    return {"shown": False, "why": why}
