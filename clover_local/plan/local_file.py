"""A local GGUF is described by its own header: when it is not the preset's model, the plan is made for
what the file says it is (its name, architecture and trained context), not for the preset's model."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from clover_local.gguf.model import ModelDescription
from clover_local.presets import TEMPLATE_FROM_GGUF, Preset, SamplingDefaults


def is_presets_model(preset: Preset, desc: ModelDescription) -> bool:
    """Whether the file holds the preset's model (same architecture, depth and width): a quant of it."""
    a, b = preset.architecture, desc.architecture
    return (a.arch, a.n_layers, a.n_embd) == (b.arch, b.n_layers, b.n_embd)


def preset_from_header(preset: Preset, desc: ModelDescription, path: Path) -> Preset:
    """``preset`` when the file is its model; otherwise a preset made from the file's header (named after
    the file, its own architecture, context limit = its trained context, the file's own chat template,
    generic sampling defaults), keeping the preset's speculation settings."""
    if is_presets_model(preset, desc):
        return preset
    trained = desc.architecture.n_ctx_train
    return replace(
        preset,
        name=path.stem,
        display_name=desc.name or path.stem,
        repo="",
        quants={},
        architecture=desc.architecture,
        ctx_default=min(preset.ctx_default, trained),
        ctx_max=trained,
        chat_template=TEMPLATE_FROM_GGUF,
        sampling=SamplingDefaults(),
        default_quant="auto",
        license="",
        python_package=None,
        source=path,
    )
