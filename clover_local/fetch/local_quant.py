"""The one answer to "is this quant of a preset on this machine, and where": every command, the plan and the
app ask :func:`local_quant_file`, so ``plan`` and ``chat`` never disagree on whether a model is downloaded."""

from __future__ import annotations

from pathlib import Path

from clover_local import user_prefs
from clover_local.fetch.download import cached_model_path
from clover_local.fetch.local import packaged_model
from clover_local.presets import Preset

__all__ = ["local_quant_file"]


def local_quant_file(preset: Preset, quant: str | None = None) -> Path | None:
    """The file assembled from the preset's Python package (test presets: its one quant), else the newest download
    of ``quant`` (None: the preset's default) in the Hugging Face cache, else the file the app's first run chose
    for this preset and quant. Never the network."""
    found = packaged_model(preset) or cached_model_path(preset, quant)
    if found is not None:
        return found
    first = user_prefs.load_prefs().first_run
    same_quant = quant is None or first.quant.upper() == quant.upper()
    if first.preset == preset.name and same_quant and first.complete:
        return Path(first.model_path)
    return None
