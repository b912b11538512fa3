"""Opening the embedded engine from what a person names: a preset and/or a GGUF path, planned for this machine.

Shared by ``clover-local run`` and ``clover-local bench``: find the file, plan (detect -> plan -> llama.cpp
settings), load, and collect what the person should be told.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clover_local.engine.loader import LoadResult, load_engine
from clover_local.errors import UsageError
from clover_local.plan.diffusion import DiffusionPlan, DiffusionWishes
from clover_local.plan.types import SpeculativePlan
from clover_local.presets import Preset, SamplingDefaults


@dataclass(frozen=True)
class OpenedEmbedded:
    result: LoadResult
    preset: Preset | None
    model_path: Path
    notes: tuple[str, ...]


def resolve_model_path(model: str | None, preset: Preset | None) -> Path:
    """The GGUF to load: ``model`` when given, else the preset's local file."""
    from clover_local.engine.model_source import find_model_file

    if model:
        path = Path(model).expanduser()
        if not path.is_file():
            raise UsageError(f"--model {model}: no such file.", "Give the path of a local .gguf file.")
        return path
    assert preset is not None
    found = find_model_file(preset)
    if found is None:
        raise UsageError(
            f"{preset.display_name} is not downloaded yet.",
            f"Run `clover-local download --preset {preset.name}` first, or pass --model PATH.",
        )
    return found


def planned_settings(
    preset: Preset,
    path: Path,
    ctx: int | None,
    threads: int | None,
    diffusion: DiffusionWishes | None = None,
) -> tuple[dict[str, Any], SpeculativePlan, str, DiffusionPlan | None]:
    """llama.cpp settings, the speculation plan, the chat template and (for diffusion models) the diffusion
    plan the planner picks for this machine."""
    from clover_local.detect import detect_machine
    from clover_local.gguf.header import read_local_header
    from clover_local.plan.llama_args import llama_cpp_kwargs
    from clover_local.plan.planner import make_plan
    from clover_local.plan.types import Wishes

    machine = detect_machine()
    description = read_local_header(path)
    plan = make_plan(
        machine, preset, description, Wishes(ctx=ctx, threads=threads), str(path), diffusion_wishes=diffusion
    )
    return llama_cpp_kwargs(plan), plan.speculative, plan.chat_template, plan.diffusion


def header_diffusion_plan(
    path: Path, ctx: int | None, wishes: DiffusionWishes | None
) -> tuple[DiffusionPlan | None, list[str]]:
    """For a GGUF without a preset: the diffusion plan its header calls for (None for autoregressive
    models; diffusion options for them are an error)."""
    from clover_local.gguf.header import read_local_header
    from clover_local.plan.diffusion import plan_diffusion

    description = read_local_header(path)
    if description.diffusion is None:
        if wishes is not None and wishes != DiffusionWishes():
            raise UsageError(
                f"{path.name} is a {description.architecture.arch!r} model, which llama.cpp decodes left to "
                "right: the diffusion options do not apply.",
                "Drop --diffusion-* options, or pick a diffusion GGUF (dream, llada, llada-moe, rnd1).",
            )
        return None, []
    return plan_diffusion(description, wishes=wishes, ctx=ctx)


def default_settings(ctx: int | None, threads: int | None) -> dict[str, Any]:
    """CPU settings for a GGUF without a preset: a modest context, physical cores."""
    from clover_local.engine.native import default_threads

    return {"n_ctx": ctx or 4096, "n_threads": threads or default_threads(), "n_gpu_layers": 0}


def open_embedded(
    *,
    model: str | None,
    preset: str | None,
    ctx: int | None = None,
    threads: int | None = None,
    chat_template: str | None = None,
    diffusion: DiffusionWishes | None = None,
) -> OpenedEmbedded:
    """Find, plan and load. ``model`` alone: defaults (CPU, 4K context, the GGUF's template; for a
    diffusion model the header's diffusion defaults and a 1K canvas)."""
    from clover_local.presets import load_preset

    chosen = load_preset(preset) if preset or not model else None
    path = resolve_model_path(model, chosen)
    notes: list[str] = []
    if chosen is not None:
        settings, speculative, template, dplan = planned_settings(chosen, path, ctx, threads, diffusion)
        sampling = chosen.sampling
    else:
        dplan, reasons = header_diffusion_plan(path, ctx, diffusion)
        notes += reasons
        settings = default_settings(dplan.canvas if dplan else ctx, threads)
        speculative, template, sampling = SpeculativePlan(enabled=dplan is None), "gguf", SamplingDefaults()
    result = load_engine(
        path,
        settings,
        chat_template=chat_template or template,
        sampling=sampling,
        speculative=speculative,
        diffusion=dplan,
    )
    notes += result.notices
    if result.fallback_message:
        notes.insert(0, result.fallback_message)
    return OpenedEmbedded(result=result, preset=chosen, model_path=path, notes=tuple(notes))
