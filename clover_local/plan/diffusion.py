"""How to decode a diffusion model: schedule, steps, block length, algorithm and answer length, with reasons.

Pure: a model description (its GGUF header's diffusion keys), the preset's ``[diffusion]`` table and the
person's overrides in, a :class:`DiffusionPlan` out. Defaults follow llama.cpp's ``examples/diffusion``
model card per family: LLaDA-style models (``llada``, ``llada-moe``) unmask block by block (block length 32),
Dream-style models (``dream``, ``rnd1``) on the timestep schedule (eps 0.001); both at two answer tokens per
step (the model card's 256 steps for a 512-token canvas), confidence-based unmasking (the cli's default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeVar

from clover_local.errors import UsageError
from clover_local.gguf.model import ModelDescription
from clover_local.plan.reasons import Reason
from clover_local.presets import DiffusionDefaults, Preset

Schedule = Literal["block", "timestep"]
T = TypeVar("T")

BLOCK_FAMILY = frozenset({"llada", "llada-moe"})
DEFAULT_BLOCK_LENGTH = 32
DEFAULT_EPS = 0.001
DEFAULT_ANSWER = 256
TOKENS_PER_STEP = 2
DEFAULT_CANVAS = 1024
"""Prompt + answer by default: every step returns the logits of the whole canvas (n_vocab floats a token)."""


@dataclass(frozen=True)
class DiffusionPlan:
    schedule: Schedule
    block_length: int
    """0 on the timestep schedule."""
    eps: float
    """0 on the block schedule."""
    steps_per_block: int
    algorithm: str
    answer_length: int
    shift_logits: bool
    canvas: int
    """The most tokens (prompt + answer) one step decodes: n_ctx = n_batch = n_ubatch."""

    def timestep_steps(self, answer: int) -> int:
        """Timestep schedule: steps for an answer of ``answer`` tokens, at the planned tokens per step."""
        return max(1, round(self.steps_per_block * answer / self.answer_length))


@dataclass(frozen=True)
class DiffusionWishes:
    """What the person asked for on the command line; None: the preset's, else the default."""

    algorithm: str | None = None
    block_length: int | None = None
    steps_per_block: int | None = None
    answer_length: int | None = None


def wants_diffusion(preset: Preset | None, model: ModelDescription) -> bool:
    """Decode by diffusion? From the header; a preset that asks for diffusion on a model that is not one is an
    error, as is one that asks for autoregressive decoding of a diffusion model."""
    is_diffusion = model.diffusion is not None
    decoding = preset.decoding if preset is not None else "auto"
    if decoding == "diffusion" and not is_diffusion:
        raise UsageError(
            f"The preset asks for diffusion decoding, but {model.source or 'this model'} is a "
            f"{model.architecture.arch!r} model, which llama.cpp decodes left to right.",
            'Remove `decoding = "diffusion"` from the preset, or choose a diffusion GGUF '
            "(dream, llada, llada-moe, rnd1).",
        )
    if decoding == "autoregressive" and is_diffusion:
        raise UsageError(
            f"The preset asks for autoregressive decoding, but {model.architecture.arch!r} is a diffusion model.",
            'Remove `decoding = "autoregressive"` from the preset: llama.cpp runs this model only as diffusion.',
        )
    return is_diffusion


def plan_diffusion(
    model: ModelDescription,
    table: DiffusionDefaults | None = None,
    wishes: DiffusionWishes | None = None,
    ctx: int | None = None,
) -> tuple[DiffusionPlan, list[Reason]]:
    """Decide the diffusion settings for ``model`` and say why."""
    if model.diffusion is None:
        raise UsageError(
            f"{model.architecture.arch!r} is not a diffusion model: diffusion settings do not apply.",
            "Drop the diffusion options for this model.",
        )
    table = table or DiffusionDefaults()
    wishes = wishes or DiffusionWishes()
    arch = model.architecture.arch

    def pick(name: str, default: T) -> tuple[T, str]:
        wished = getattr(wishes, name)
        if wished is not None:
            return wished, "as asked"
        preset_value = getattr(table, name)
        if preset_value is not None:
            return preset_value, "from the preset"
        return default, "default"

    canvas = ctx or DEFAULT_CANVAS
    block_default = DEFAULT_BLOCK_LENGTH if arch in BLOCK_FAMILY else 0
    block_length, block_src = pick("block_length", block_default)
    answer, answer_src = pick("answer_length", min(DEFAULT_ANSWER, canvas // 2))
    algorithm, alg_src = pick("algorithm", "confidence")
    schedule: Schedule = "block" if block_length > 0 else "timestep"
    span = block_length if schedule == "block" else answer
    steps, steps_src = pick("steps_per_block", max(1, span // TOKENS_PER_STEP))
    eps = 0.0 if schedule == "block" else float(table.eps or DEFAULT_EPS)
    if answer >= canvas:
        raise UsageError(
            f"An answer of {answer} tokens does not fit a {canvas}-token canvas (prompt + answer).",
            "Raise --ctx or lower the answer length.",
        )
    header = model.diffusion
    if schedule == "block":
        how = (
            f"block schedule ({block_src}), {block_length}-token blocks unmasked one after another in {steps} "
            f"steps each ({steps_src}, {block_length / steps:.1f} tokens a step)."
        )
    else:
        how = (
            f"timestep schedule (eps {eps:g}), the whole {answer}-token answer refined in {steps} steps "
            f"({steps_src}, {answer / steps:.1f} tokens a step)."
        )
    reasons = [
        Reason("diffusion", f"Diffusion decoding ({arch}): {how}"),
        Reason(
            "diffusion-unmasking",
            f"Unmasking order: {algorithm} ({alg_src}); answer length {answer} tokens ({answer_src}); "
            f"shift_logits {'on' if header.shift_logits else 'off'} "
            f"({'from the header' if header.shift_logits_in_header else 'absent from the header: llama.cpp takes on'}).",
        ),
        Reason(
            "diffusion-canvas",
            f"The whole canvas (prompt + answer, up to {canvas} tokens) is decoded as one batch every step: "
            f"n_ctx = n_batch = n_ubatch = {canvas}, no KV cache, and llama.cpp returns the logits of every "
            "canvas position, so the compute and output buffers grow with the canvas.",
        ),
    ]
    plan = DiffusionPlan(
        schedule=schedule,
        block_length=block_length,
        eps=eps,
        steps_per_block=steps,
        algorithm=algorithm,
        answer_length=answer,
        shift_logits=header.shift_logits,
        canvas=canvas,
    )
    return plan, reasons
