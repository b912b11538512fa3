"""Where a preset's GGUF is on this machine, without touching the network: the file assembled from the preset's
Python package (test models), else the newest download in the Hugging Face cache."""

from __future__ import annotations

from pathlib import Path

from clover_local.presets import Preset


def find_model_file(preset: Preset, quant: str | None = None) -> Path | None:
    """The local GGUF (first shard) for ``preset`` and ``quant`` (None or ``auto``: the preset's default);
    None when it is not downloaded."""
    if preset.python_package:
        from clover_local.fetch.local import packaged_model

        packaged = packaged_model(preset)
        if packaged is not None:
            return packaged
    from clover_local.fetch.download import cached_model_path

    return cached_model_path(preset, None if quant in (None, "auto") else quant)
