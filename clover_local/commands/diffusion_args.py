"""The ``--diffusion-*`` options shared by ``run``, ``chat``, ``serve`` and ``bench`` (diffusion models only)."""

from __future__ import annotations

import argparse

from clover_local.engine.diffusion_schedule import ALGORITHM_NAMES
from clover_local.errors import UsageError
from clover_local.plan.diffusion import DiffusionWishes


def add_diffusion_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("diffusion models (dream, llada, llada-moe, rnd1)")
    group.add_argument(
        "--diffusion-steps", type=int, metavar="N", help="denoising steps per block (default: planned)"
    )
    group.add_argument(
        "--diffusion-block-length",
        type=int,
        metavar="N",
        help="block length; 0 = timestep schedule over the whole answer (default: from the architecture)",
    )
    group.add_argument(
        "--diffusion-algorithm",
        choices=tuple(ALGORITHM_NAMES),
        help="which masked positions to unmask first (default: confidence)",
    )
    group.add_argument(
        "--diffusion-answer", type=int, metavar="N", help="answer length in tokens (default: planned, 256)"
    )


def diffusion_wishes(args: argparse.Namespace) -> DiffusionWishes | None:
    """The diffusion options given, or None when there were none."""
    steps = getattr(args, "diffusion_steps", None)
    block = getattr(args, "diffusion_block_length", None)
    answer = getattr(args, "diffusion_answer", None)
    algorithm = getattr(args, "diffusion_algorithm", None)
    for name, value in (("--diffusion-steps", steps), ("--diffusion-answer", answer)):
        if value is not None and value <= 0:
            raise UsageError(f"{name} must be positive, not {value}.")
    if block is not None and block < 0:
        raise UsageError(f"--diffusion-block-length must be 0 (timestep schedule) or positive, not {block}.")
    if steps is None and block is None and answer is None and algorithm is None:
        return None
    return DiffusionWishes(
        algorithm=algorithm, block_length=block, steps_per_block=steps, answer_length=answer
    )
