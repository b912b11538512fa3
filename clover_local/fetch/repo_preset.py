"""A preset for another GGUF repo of the same model (``--repo``): community repos name their quants freely
(``Q8_0``, ``Q3_K_M``, ``IQ3_XXS``, ``APEX-I-NanoPlus``), so the quants offered are the ones its files carry,
picked as llama.cpp's ``-hf REPO[:QUANT]`` picks them (:func:`clover_local.fetch.quants.select_quant_files`),
and everything else (context, sampling, template, the expected architecture) is the base preset's. The sizes
planned come from each quant's GGUF header (``fetch.describe``), as for the preset's own repo.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from clover_local.errors import DownloadError, HubUnreachableError
from clover_local.fetch.quants import is_model_gguf, quant_of, select_quant_files, shard_of
from clover_local.presets import Preset, QuantSpec


def preset_for_repo(base: Preset, repo: str, files: Mapping[str, int], quant: str = "auto") -> Preset:
    """``base`` for ``repo``, whose listing is ``files`` (path -> size): one quant when ``quant`` names one
    (:class:`DownloadError` listing the repo's quants when no file has it), else every quant its file names
    carry (the file ``-hf REPO`` loads when none carries one)."""
    models = {p: size for p, size in files.items() if p.endswith(".gguf") and is_model_gguf(p)}
    if quant != "auto":
        return _with_quants(base, repo, {quant: _spec(repo, models, quant, quant)})
    quants: dict[str, QuantSpec] = {}
    for path in sorted(models):
        name = quant_of(path)
        if name and name not in quants and shard_of(path).index == 1:
            try:
                quants[name] = _spec(repo, models, name, name)
            except DownloadError:
                continue  # two files of one quant, or a split with missing shards: not offered
    if not quants:
        first = select_quant_files(repo, models, None)  # what -hf REPO loads
        name = shard_of(first[0]).base.rsplit("/", 1)[-1]
        quants[name] = QuantSpec(name, name, sum(models[p] for p in first) or 1)
    return _with_quants(base, repo, quants)


def repo_preset(base: Preset, repo: str, quant: str = "auto", *, offline: bool = False) -> Preset:
    """:func:`preset_for_repo` with the repo listed on the Hub (:class:`DownloadError` when it cannot be:
    offline, unreachable, no such repo)."""
    from clover_local.fetch import hub

    if offline:
        raise HubUnreachableError(
            f"--repo {repo}: offline, so its files cannot be listed.",
            "Go online once, or plan the downloaded file with --model PATH.",
        )
    listing = hub.list_repo(repo, "main", timeout_s=10.0, retries=0)
    return preset_for_repo(base, repo, {e.path: e.size for e in listing.entries}, quant)


def _spec(repo: str, models: Mapping[str, int], name: str, pattern: str) -> QuantSpec:
    picked = select_quant_files(repo, models, pattern)
    return QuantSpec(name, pattern, sum(models[p] for p in picked) or 1)


def _with_quants(base: Preset, repo: str, quants: dict[str, QuantSpec]) -> Preset:
    return replace(
        base,
        repo=repo,
        display_name=f"{base.display_name} ({repo})",
        quants=quants,
        default_quant="auto",
        python_package=None,
        python_package_file=None,
    )
