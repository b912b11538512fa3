"""What the TUI adds to :mod:`clover_local.model_files` and :mod:`clover_local.launch`: the launch it loads for a
model already on disk (the person's context and speculation choice), and the models the model picker offers.

Screens call these from worker threads or for quick pure work. Heavy modules (llama_cpp, huggingface_hub)
are imported inside the functions, so the app paints before any of them load. Nothing here imports Textual.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from clover_local.errors import ContextOutOfRange
from clover_local.facts import LaunchFacts
from clover_local.launch import Launch
from clover_local.plan.reasons import Notice
from clover_local.presets import Preset
from clover_local.user_prefs import ModelSettings

DEMO_PRESET = "smollm2-135m"
"""The model that ships as a Python package: a chat with no network at all."""


@dataclass(frozen=True)
class ModelChoice:
    """A model the person picked inside the app: a preset by name, or a GGUF file (exactly one)."""

    preset: str | None = None
    path: str | None = None
    remember: bool = True
    """The next plain start opens it (a model picked in the app; not one named on the command line)."""
    draft: str = ""
    """What the person had written in the last chat's message box and not sent: the next chat starts with it."""


@dataclass(frozen=True)
class LoadAgain:
    """The chat's runner was given up and the person asked for the same model again (Ctrl+L): the next chat
    carries on conversation ``chat_id`` (kept in the chat store) with ``draft`` in its message box."""

    chat_id: int | None
    draft: str = ""


def choice_for_name(text: str) -> ModelChoice:
    """The model a name typed into the model picker means, in the grammar of every command
    (:mod:`clover_local.model_ref`): a preset, a local ``.gguf``, or a Hugging Face repo (a preset's own opens as
    that preset; another one opens from its downloaded file, found without the network). A
    :class:`~clover_local.errors.CloverError` saying what to do when it names nothing here."""
    from clover_local.model_files import checked_gguf, find_model, named_model, require_repo_file
    from clover_local.model_ref import parse_model_ref
    from clover_local.presets import list_presets

    named = named_model(parse_model_ref(text, presets=list_presets()))
    if named.model is not None:
        return ModelChoice(path=str(checked_gguf(Path(named.model))))
    if named.repo is not None and named.preset is None:
        return ModelChoice(path=str(require_repo_file(named.repo, named.quant)))
    assert named.preset is not None
    from clover_local.presets import load_preset

    if named.quant is not None:  # a quant of a preset's own repo: its file when downloaded, else the preset
        found = find_model(load_preset(named.preset), None, named.quant)
        if found is not None:
            return ModelChoice(path=str(found))
    return ModelChoice(preset=named.preset)


@dataclass(frozen=True)
class DiskModel:
    """A model already on this machine, as the model picker lists it."""

    label: str
    path: str
    size_bytes: int


def picker_presets() -> list[Preset]:
    """The presets the model picker offers: every one but those kept for the tests (``for_tests``)."""
    from clover_local.presets import list_presets, load_preset

    return [p for p in (load_preset(name) for name in list_presets()) if not p.for_tests]


def models_on_disk() -> list[DiskModel]:
    """The GGUFs here without the network: the packaged demo model, the Hugging Face cache's complete
    downloads, and the file the first run chose; a preset's kept for the tests (``for_tests``) is left out, in
    the package or the cache. Scans the cache: call from a worker."""
    from clover_local import user_prefs
    from clover_local.fetch.local import cached_ggufs, packaged_model
    from clover_local.presets import list_presets, load_preset

    found: dict[str, DiskModel] = {}
    presets = [load_preset(name) for name in list_presets()]
    test_repos = {p.repo.lower() for p in presets if p.for_tests}
    for preset in presets:
        packaged = packaged_model(preset) if preset.python_package and not preset.for_tests else None
        if packaged is not None:
            found[str(packaged)] = DiskModel(preset.display_name, str(packaged), packaged.stat().st_size)
    for cached in cached_ggufs():
        if cached.complete and str(cached.path) not in found and cached.repo.lower() not in test_repos:
            label = f"{cached.repo} · {Path(cached.filename).name}"
            found[str(cached.path)] = DiskModel(label, str(cached.path), cached.size_bytes)
    first = user_prefs.load_prefs().first_run
    if first.complete and first.model_path not in found:
        path = Path(first.model_path)
        found[first.model_path] = DiskModel(path.name, first.model_path, path.stat().st_size)
    return list(found.values())


def preset_and_key_for_file(path: str) -> tuple[Preset, str, bool]:
    """A GGUF picked or given without a preset: the preset its name says (else the default one, only for the
    plan's machine-wide numbers), the key its settings are saved under (the file's name) and whether a preset
    matched (if not, its settings come from the file itself: :func:`settings_for_file`)."""
    from clover_local.model_files import preset_named_by_file
    from clover_local.presets import load_preset

    named = preset_named_by_file(path)
    return (named or load_preset(None)), Path(path).name, named is not None


def settings_for_file(path: str, preset: Preset, matched: bool) -> ModelSettings:
    """First-time chat settings for a GGUF: its preset's when one matched, else generic sampling; the context
    never beyond what the file's own header says the model was trained for. Reads the header: call from a
    worker."""
    from clover_local.model_files import local_header
    from clover_local.plan.local_file import preset_from_header
    from clover_local.plan.planner import context_limit

    base = ModelSettings.from_preset(preset) if matched else ModelSettings()
    try:
        header = local_header(Path(path))
    except Exception:  # an unreadable header is said by the launch, with its reason
        return base
    limit = context_limit(preset_from_header(preset, header, Path(path)), [header])
    return replace(base, ctx=limit) if base.ctx > limit else base


def launch_for(
    preset: Preset,
    model_path: str,
    model_settings: ModelSettings,
    *,
    rpc: str | None = None,
    force: bool = False,
    facts: LaunchFacts | None = None,
) -> Launch:
    """The launch the app loads for a model on disk when no plan screen came first (a file given, remembered or
    picked), and shows as the llama-server command: ``model_path`` planned for this machine as it is now with
    the person's context and speculation choice (``launch.decide_launch``; ``facts``: what the command read
    already). After the plan screen the app opens that screen's launch instead. Reads the file's header: call
    from a worker."""
    from clover_local.launch import LaunchRequest
    from clover_local.launcher import Launcher

    launcher = Launcher(facts=facts)
    request = LaunchRequest(
        preset, model_path, ctx=model_settings.ctx, spec=model_settings.spec_mode, rpc=rpc, force=force
    )
    try:
        return launcher.decide(request)
    except ContextOutOfRange as exc:
        # A context saved for this model (or its preset's default) that this file does not take: the largest
        # it takes, said, rather than a refusal of a choice the person made elsewhere.
        launch = launcher.decide(replace(request, ctx=exc.limit))
        said = (
            f"The context saved for this model ({model_settings.ctx:,} tokens) is more than this file takes; "
            f"loaded with {exc.limit:,} (F2 changes it)."
        )
        return replace(launch, notices=(Notice("context-limited", said), *launch.notices))
