"""The arithmetic of block-diffusion decoding, as llama.cpp's ``examples/diffusion/diffusion.cpp`` does it.

Pure Python (numpy), no llama_cpp: the parameters, how many masked positions to unmask at each step
(timestep or block schedule, in ``float`` arithmetic as the C++ does it), and the C++ standard library's
``std::mt19937`` with libstdc++'s ``uniform_real_distribution``, so the random algorithms draw the same
numbers as ``llama-diffusion-cli``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

F32 = np.float32


class Algorithm(IntEnum):
    """Which masked positions to unmask first (``--diffusion-algorithm``; the numbers are llama.cpp's)."""

    ORIGIN = 0
    """Each position independently, with the schedule's probability (random order)."""
    ENTROPY = 1
    MARGIN = 2
    RANDOM = 3
    CONFIDENCE = 4


ALGORITHM_NAMES: dict[str, Algorithm] = {a.name.lower(): a for a in Algorithm}


def parse_algorithm(value: str | int) -> Algorithm:
    """``"confidence"``, ``"entropy"``, ... or llama.cpp's number (0-4)."""
    if isinstance(value, int) or (isinstance(value, str) and value.isdigit()):
        return Algorithm(int(value))
    try:
        return ALGORITHM_NAMES[value.strip().lower()]
    except KeyError:
        raise ValueError(
            f"unknown diffusion algorithm {value!r}: use one of {', '.join(ALGORITHM_NAMES)}"
        ) from None


@dataclass(frozen=True)
class DiffusionParams:
    """One diffusion generation, as ``diffusion_params`` in ``diffusion.h`` (what ``llama-diffusion-cli``
    fills from its flags). ``max_length`` is the whole canvas: prompt plus answer (the cli's ``-ub``)."""

    max_length: int
    steps: int
    mask_token_id: int
    algorithm: Algorithm = Algorithm.CONFIDENCE
    eps: float = 0.0
    """Timestep schedule (Dream) when > 0."""
    block_length: int = 0
    """Block schedule (LLaDA) when > 0; exactly one of ``eps`` and ``block_length`` is set."""
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    seed: int = 0
    shift_logits: bool = True
    """Position i reads the logits of position i-1 (Dream); from the header's ``diffusion.shift_logits``."""
    alg_temp: float = 0.0
    add_gumbel_noise: bool = False

    def check(self, n_input: int) -> None:
        """Raise ``ValueError`` for parameters the C++ would assert on (or silently return nothing for)."""
        if n_input <= 0:
            raise ValueError("the prompt is empty: diffusion needs at least one prompt token")
        if self.max_length <= n_input:
            raise ValueError(
                f"the canvas ({self.max_length} tokens) has no room after the {n_input}-token prompt"
            )
        if (self.eps == 0) == (self.block_length == 0):
            raise ValueError("set exactly one of eps (timestep schedule) and block_length (block schedule)")
        if self.steps <= 0:
            raise ValueError("steps must be at least 1")
        if self.block_length:
            if self.max_length % self.block_length:
                raise ValueError(
                    f"the canvas ({self.max_length}) must be a multiple of the block length ({self.block_length})"
                )
            if self.steps % (self.max_length // self.block_length):
                raise ValueError(
                    f"steps ({self.steps}) must be a multiple of the number of blocks "
                    f"({self.max_length // self.block_length})"
                )

    @property
    def n_blocks(self) -> int:
        return self.max_length // self.block_length if self.block_length else 1

    @property
    def steps_per_block(self) -> int:
        return self.steps // self.n_blocks


def block_bounds(params: DiffusionParams, n_input: int, block: int) -> tuple[int, int]:
    """[start, end) of the positions block ``block`` may unmask; the whole canvas on the timestep schedule."""
    if not params.block_length:
        return 0, params.max_length
    start = n_input + block * params.block_length
    return start, min(n_input + (block + 1) * params.block_length, params.max_length)


def transfer_counts_for_block(mask_count: int, steps: int) -> list[int]:
    """LLaDA's ``get_num_transfer_tokens``: spread ``mask_count`` unmaskings evenly, the first steps one more."""
    base, remainder = divmod(mask_count, steps)
    return [base + (1 if i < remainder else 0) for i in range(steps)]


def transfer_count(
    step: int, total_steps: int, remaining: int, params: DiffusionParams, block_counts: list[int]
) -> int:
    """How many masked positions to unmask at ``step`` (``calculate_transfer_count``, in float32)."""
    if params.block_length:
        if step < len(block_counts):
            return block_counts[step]
        return remaining // (total_steps - step)
    one, eps = F32(1.0), F32(params.eps)
    t = one - F32(step) / F32(total_steps) * (one - eps)
    s = one - F32(step + 1) / F32(total_steps) * (one - eps)
    p_transfer = (one - s / t) if step < total_steps - 1 else one
    return int(F32(remaining) * F32(p_transfer))


class Mt19937:
    """``std::mt19937`` seeded like ``std::mt19937 rng(seed)``, with libstdc++'s uniform real distributions."""

    def __init__(self, seed: int) -> None:
        gen = np.random.MT19937(0)
        gen._legacy_seeding(seed & 0xFFFFFFFF)  # init_genrand(seed): the std::mt19937(seed) seeding
        self._gen = gen

    def next_u32(self) -> int:
        return int(self._gen.random_raw())

    def uniform_float(self) -> float:
        """``uniform_real_distribution<float>(0, 1)``: one 32-bit draw, computed in float."""
        value = F32(F32(self.next_u32()) / F32(4294967296.0))
        if value >= F32(1.0):
            value = np.nextafter(F32(1.0), F32(0.0))
        return float(value)

    def uniform_doubles(self, n: int) -> np.ndarray:
        """``n`` draws of ``uniform_real_distribution<double>(0, 1)`` (two 32-bit draws each), in order."""
        raw = np.asarray(self._gen.random_raw(2 * n), dtype=np.float64).reshape(n, 2)
        values = (raw[:, 0] + raw[:, 1] * 4294967296.0) / 18446744073709551616.0
        return np.where(values < 1.0, values, math.nextafter(1.0, 0.0))
