"""One pure decision: :func:`decide` turns what the person asked for and the facts gathered for it
(:mod:`clover_local.facts`) into a launch, reading no file, socket or process. In this order:

1. **the runner** (:func:`choose_runner`): what the model needs (its architecture, a drafter only llama-server
   runs, pooled RPC devices, diffusion decoding), then what the person asked for;
2. **the plan**, budgeted for that runner's memory and its devices (``plan.planner.make_plan``), with the
   architecture check and where the sizes came from;
3. **speculation**, chosen among the drafters that runner runs, with what was measured here;
4. **a smaller community quant**, when the plan does not fit and the facts hold one;
5. **the settings**: llama.cpp's parameters and llama-server's argv rendered from the plan
   (``plan.llama_args``), fitted to the flags that llama-server has.

The same facts give the same launch; tests run it with the network, processes and files barred.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, get_args

from clover_local.arch_support import Action, ArchCheck, ArchSupport, check_architecture, require_supported
from clover_local.detect.machine import Backend, Machine
from clover_local.errors import ServerError, UsageError
from clover_local.facts import LaunchFacts, LocalModel, ServerFacts, Sidecars
from clover_local.gguf.model import describe_from_preset
from clover_local.launch_types import ENGINE_WISHES, Launch, LaunchRequest, Runner
from clover_local.llamacpp.binary import ServerBinary, find_llama_server
from clover_local.llamacpp.server_args import fit_argv
from clover_local.plan.community import CommunityQuant, as_repo_preset, choose_community_quant
from clover_local.plan.llama_args import llama_settings
from clover_local.plan.local_file import preset_from_header
from clover_local.plan.measured import VerifyCostRecord, measured_verify_costs, verify_costs_key
from clover_local.plan.memory import rolls_back_from_a_copy
from clover_local.plan.planner import check_context, plan_placement
from clover_local.plan.reasons import Notice, Reason, ReasonCode
from clover_local.plan.speculation import SERVER_ONLY_MODES, offered_heads, speculate
from clover_local.plan.types import (
    CommunityPick,
    Placed,
    Plan,
    Provenance,
    Speculation,
    SpeculativePlan,
    Stage,
    Wishes,
    assemble,
    plan_fits,
)
from clover_local.presets import Preset

if TYPE_CHECKING:
    from clover_local.fetch.describe import QuantDescriptions
    from clover_local.gguf.model import ModelDescription

__all__ = ["MTP_ONE_SLOT", "check_request", "choose_runner", "decide", "engine_notice", "needs_community"]


def engine_notice(runner: Runner) -> Notice:
    """The notice that says which engine runs a launch and why (one of a llama-server launch's)."""
    return Notice("engine", f"Engine: {runner.kind} ({runner.why}).")


def decide(request: LaunchRequest, facts: LaunchFacts) -> Launch:
    """The launch for ``request`` from ``facts``: runner, plan, speculation, settings, in that order."""
    checks = _ArchChecks(facts.support, facts.checks)
    description = _model_description(request, facts)
    arch = checks.check(description.architecture.arch)
    runner = choose_runner(
        request,
        arch,
        diffusion=description.diffusion is not None,
        find_binary=lambda _configured: facts.server,
    )
    machine = _runner_machine(facts, runner)
    model: _Model = (facts.preset, facts.model, facts.quants)
    stages, preset = _plan(request, facts, model, runner, machine, checks, request.parallel)
    one_slot: tuple[Stage, ...] = ()
    if _mtp_needs_one_slot(request, runner, stages[0], stages[2]):
        stages, preset = _plan(request, facts, model, runner, machine, checks, 1)
        # the one-slot plan's reason ("as asked") is not why it has one slot
        one_slot = (Stage(reasons=(MTP_ONE_SLOT,), overrules=("slots",)),)
    pick, community = _community(request, facts, runner, machine, checks, plan_fits(stages[0], stages[2]))
    plan = assemble(*stages, *one_slot, community, chat_template=request.chat_template, community=pick)
    said = runner.kind == "llama-server" or request.engine not in (None, runner.kind)
    notices = (engine_notice(runner),) if said else ()
    settings = llama_settings(plan)
    argv, changed = _fitted_argv(facts, runner, settings.argv())
    keeps = _keeps_slots(facts, runner)
    return Launch(request, preset, machine, runner, plan, settings, (*notices, *changed), argv, keeps, facts)


# -- the runner -------------------------------------------------------------------------------------------


def choose_runner(
    request: LaunchRequest,
    arch: ArchCheck | None,
    *,
    diffusion: bool = False,
    find_binary: Callable[[str | None], ServerBinary | None] | None = None,
) -> Runner:
    """The one decision of which engine runs a model, made before it is planned.

    What the model needs comes first: diffusion decoding runs only in the embedded engine; an architecture only
    a newer llama.cpp knows (``arch.runner == "llama-server"``), devices pooled over RPC and the sidecar drafters
    (DFlash, DSpark, EAGLE-3) run only in llama-server. Then the person's ``engine``: ``embedded``,
    ``llama-server``, or ``auto`` (llama-server when one is found: upstream builds have every backend and the
    newest kernels). ``request.llama_server`` is the binary wherever llama-server runs; ``find_binary`` finds it
    (``decide`` passes the one gathered; None: look now)."""
    if request.engine is not None and request.engine not in ENGINE_WISHES:
        raise UsageError(f"--engine {request.engine!r} is not one of {', '.join(ENGINE_WISHES)}.")
    find = find_binary or find_llama_server
    if arch is not None and arch.install is not None and not arch.supported:
        if request.engine == "embedded":
            raise UsageError(
                f"--engine embedded cannot run this: {arch.why}.",
                f"Install the release that loads it (`{arch.install_command}`); its llama-server runs it.",
            )
        if request.llama_server:  # the person's own llama-server: theirs to know what it loads
            binary = find(request.llama_server)
            if binary is not None:
                said = f"{arch.why}; using {shlex.join(binary.command)} as asked"
                return Runner("llama-server", said, binary)
        said = (
            f"no llama.cpp here loads the architecture {arch.name!r}; `{arch.install_command}` installs a release "
            "that does, and its llama-server will run it"
        )
        return Runner("llama-server", said, install=arch.install_command)
    if diffusion or (arch is not None and arch.runner == "diffusion"):
        asked = (
            " (not llama-server, as asked: it cannot decode it)" if request.engine == "llama-server" else ""
        )
        return Runner("embedded", f"a diffusion model: only the embedded engine decodes it{asked}")
    needs = _needs_llama_server(request, arch)
    if needs is not None:
        if request.engine == "embedded":
            raise UsageError(
                f"--engine embedded cannot run this: {needs.text}.",
                "Drop --engine embedded (llama-server runs it), or change what needs llama-server.",
            )
        binary = _server_for(arch, request.llama_server, find)
        if binary is None:
            raise ServerError(
                f"{needs.text[0].upper()}{needs.text[1:]}, and no llama-server was found (CLOVER_LLAMA_SERVER, an installed "
                "runtime, the built one, PATH).",
                "Install one with `clover-local runtime install latest` (or scripts/build-llama-server), or pass "
                "--llama-server PATH.",
            )
        runtime = arch.runtime if arch is not None and not request.llama_server else None
        why = f"{needs.text}; using {shlex.join(binary.command)} ({binary.source})"
        return Runner("llama-server", why, binary, runtime)
    if request.engine in (None, "embedded"):
        said = "as asked" if request.engine == "embedded" else "the default"
        return Runner("embedded", f"the embedded engine (llama-cpp-python), {said}")
    binary = find(request.llama_server)
    if request.engine == "llama-server":
        if binary is None:
            raise ServerError(
                "--engine llama-server: no llama-server was found (CLOVER_LLAMA_SERVER, the built one, PATH).",
                "Build one with scripts/build-llama-server, pass --llama-server PATH, or use --engine embedded.",
            )
        said = f"asked for; using {shlex.join(binary.command)} ({binary.source})"
        return Runner("llama-server", said, binary)
    if binary is not None:
        return Runner("llama-server", f"found {shlex.join(binary.command)} ({binary.source})", binary)
    said = "no llama-server found (build one with scripts/build-llama-server); using llama-cpp-python"
    return Runner("embedded", said)


def _needs_llama_server(request: LaunchRequest, arch: ArchCheck | None) -> Notice | None:
    """Why only llama-server can run this request (None when the embedded engine can)."""
    if request.rpc:
        return Notice(
            "needs-rpc",
            f"the plan pools other machines' devices (--rpc {request.rpc}), and the embedded engine "
            "(llama-cpp-python's wheel) has no RPC backend",
        )
    if arch is not None and arch.runner == "llama-server":  # the details are the plan's architecture reason
        loader = (
            f"llama.cpp {arch.runtime} (an installed runtime)" if arch.runtime else "the built llama-server"
        )
        return Notice("needs-architecture", f"only {loader} loads the architecture {arch.name!r}")
    if request.spec in SERVER_ONLY_MODES:
        said = f"the {request.spec} drafter runs only in llama-server (the embedded engine drafts by n-gram or MTP)"
        return Notice("needs-drafter", said)
    return None


def _server_for(
    arch: ArchCheck | None, configured: str | None, find: Callable[[str | None], ServerBinary | None]
) -> ServerBinary | None:
    """The llama-server for a model: the one the person named; else the runtime whose llama.cpp knows the
    architecture (the architecture check names it); else the usual search."""
    if configured:
        return find(configured)
    if arch is not None and arch.server_path:
        return ServerBinary(Path(arch.server_path), arch.server_source or "runtime")
    return find(None)


def _runner_machine(facts: LaunchFacts, runner: Runner) -> Machine:
    """The machine as the runner sees it: llama-server offloads to the GPU backends of its own build (its
    ``--list-devices``), not llama-cpp-python's (a CPU wheel beside a CUDA runtime is the usual case); a runtime
    still to be installed, to the backend its installer picks for these GPUs (``runtimes.assets.target_for``).
    A described machine (``--simulate``) names its build itself; a binary that could not be asked changes
    nothing (starting it says why)."""
    machine = facts.machine
    if runner.kind != "llama-server" or machine.simulated or not machine.gpus:
        return machine
    if runner.binary is not None:
        asked = _server_facts(facts, runner)
        if asked is None or asked.capabilities is None:
            return machine
        offered = asked.capabilities.backends
    elif runner.install is not None:
        from clover_local.runtimes.assets import target_for

        offered = tuple("cuda" if b.startswith("cuda") else b for b in target_for(machine).backends[:1])
    else:
        return machine
    backends = tuple(b for b in dict.fromkeys((*offered, "cpu")) if b in get_args(Backend))
    gpu = any(b != "cpu" for b in backends)
    build = replace(machine.build, gpu_offload=gpu, backends=backends)  # type: ignore[arg-type]
    return machine if build == machine.build else replace(machine, build=build)


# -- the plan ---------------------------------------------------------------------------------------------


class _ArchChecks:
    """The facts' architecture checks (each gathered once, ``facts.gather_facts``); one the facts lack is
    checked here from the tables they hold (the latest release's included), never by asking again."""

    def __init__(self, support: ArchSupport, checked: Mapping[str, ArchCheck]) -> None:
        self.support = support
        self._done: dict[str, ArchCheck] = dict(checked)

    def check(self, arch: str) -> ArchCheck:
        if arch not in self._done:
            self._done[arch] = check_architecture(arch, self.support)
        return self._done[arch]

    def for_model(
        self, description: ModelDescription, subject: str, action: Action, request: LaunchRequest
    ) -> ArchCheck:
        """The check for the planned model: refused when no llama.cpp here (nor a release to install) loads
        it, unless ``--force``; from the preset's estimate it is said, not refused (the header is checked before
        any byte is downloaded or loaded)."""
        check = self.check(description.architecture.arch)
        if not description.exact:
            return replace(
                check,
                why=f"{check.why} (the preset's architecture: the GGUF header was not read; it is checked before "
                "anything is downloaded or loaded)",
            )
        return require_supported(check, subject, action, force=request.force, installable_ok=True)


_Model = tuple[Preset, LocalModel | None, "QuantDescriptions | None"]
"""What the plan is made from: the preset and a file named with ``--model``, else each quant described, else
(None, None) the preset's estimates."""


def _model_description(request: LaunchRequest, facts: LaunchFacts) -> ModelDescription:
    """The model the runner is chosen for: the named file's header, else the asked (or first) quant's
    description, else the preset's estimate."""
    if facts.model is not None:
        return facts.model.description
    models = facts.quants.models if facts.quants is not None else {}
    if models:
        return models[request.quant if request.quant in models else next(iter(models))]
    preset = facts.preset
    return describe_from_preset(
        preset, request.quant if request.quant in preset.quants else next(iter(preset.quants))
    )


_Stages = tuple[Placed, Provenance, Speculation | None]
"""A plan's stages, to assemble: the placement, where its model comes from, its speculation (None: diffusion)."""


def _plan(
    request: LaunchRequest,
    facts: LaunchFacts,
    model: _Model,
    runner: Runner,
    machine: Machine,
    checks: _ArchChecks,
    parallel: int | None,
) -> tuple[_Stages, Preset]:
    """The stages of the plan for ``model`` on ``machine``, budgeted for ``runner.kind`` and drafting only with
    what it runs.

    Sizes: a named file's header (the only candidate), else each quant's described sizes, else the preset's
    estimates; the plan names its model file whenever one is here and says where the sizes came from. A file
    that is not the preset's model is planned as itself (``plan.local_file.preset_from_header``)."""
    named, local, quants = model
    wishes = Wishes(
        quant="auto" if local is not None else request.quant,
        ctx=request.ctx,
        goal=request.goal,
        threads=request.threads,
        engine=runner.kind,
        parallel=parallel,
    )
    preset = named if local is None else preset_from_header(named, local.description, local.path)
    path: str | None = str(local.path) if local is not None else None
    desc: ModelDescription | None = local.description if local is not None else None
    placed = plan_placement(
        machine,
        preset,
        desc,
        wishes,
        path,
        models=quants.models if quants is not None else None,
        speed_records=facts.measured.speeds,
        diffusion_wishes=request.diffusion,
    )
    overrules: tuple[ReasonCode, ...] = ()
    sizes: tuple[Reason, ...] = ()
    sources: tuple[tuple[str, str], ...] = ()
    sidecars: Sidecars = {}
    if local is not None:
        sidecars, source = local.sidecars, f"exact, from the local file {local.path}"
        sizes, sources = (Reason("sizes", f"Sizes of {placed.quant}: {source}."),), ((placed.quant, source),)
    elif quants is not None:
        found_path = quants.paths.get(placed.quant)
        path = str(found_path) if found_path is not None else None
        desc, sidecars = quants.models.get(placed.quant), quants.sidecars.get(placed.quant, {})
        sizes, sources = _size_reasons(quants.sources), tuple(quants.sources.items())
        overrules = ("sizes-estimated",)
    subject = path or f"{preset.repo} {placed.quant}"
    described = desc or describe_from_preset(preset, placed.quant)
    arch = checks.for_model(described, subject, "load" if path else "download", request)
    said = (*sizes, *_architecture_reason(arch, placed.estimated))
    found = Provenance(
        model_path=path, size_sources=sources, architecture=arch, reasons=said, overrules=overrules
    )
    spec = _speculation(placed, path, described, sidecars, request, facts, machine, runner, checks)
    return (placed, found, spec), preset


def _size_reasons(sources: Mapping[str, str]) -> tuple[Reason, ...]:
    """Where each quant's sizes came from, one reason per source: quants estimated for the same cause (offline,
    the Hub unreachable) are named together, not said once each. They say more than the planner's
    ``sizes-estimated`` reason, which they replace."""
    quants_by_source: dict[str, list[str]] = {}
    for quant, source in sources.items():
        quants_by_source.setdefault(source, []).append(quant)
    return tuple(Reason("sizes", f"Sizes of {', '.join(qs)}: {src}.") for src, qs in quants_by_source.items())


def _architecture_reason(check: ArchCheck, estimated: bool) -> tuple[Reason, ...]:
    """What the plan says of its architecture check, when it is not the usual case."""
    if check.supported and check.runner != "llama-server":
        return ()
    if check.supported or (check.install is None and estimated):
        said = f"Architecture {check.name!r}: {check.why}."
    elif check.install is not None:
        said = (
            f"Architecture {check.name!r}: {check.why}. Install it before downloading or running: "
            f"`{check.install_command}`."
        )
    else:
        said = f"--force: planned anyway: {check.why}."
    return (Reason("architecture", said),)


def _speculation(
    placed: Placed,
    model_path: str | None,
    desc: ModelDescription,
    sidecars: Sidecars,
    request: LaunchRequest,
    facts: LaunchFacts,
    machine: Machine,
    runner: Runner,
    checks: _ArchChecks,
) -> Speculation | None:
    """The speculation stage: the mode chosen among the heads offered that the runner runs
    (``plan.speculation``), using ``bench --spec-modes``'s measurements of this model here when there are any,
    and the verification costs measured here; the sidecars whose architecture cannot load are said first. A
    diffusion plan drafts nothing (None); from the preset's estimates only n-gram and off can be chosen."""
    if placed.diffusion is not None:
        return None
    sidecars, skipped = _loadable_sidecars(sidecars, "load" if model_path else "download", checks)
    drafters = runner.drafters
    ratios = facts.measured.spec_ratios_for(model_path or f"{placed.preset}:{placed.quant}")
    measured = {m: r for m, r in ratios.items() if m in drafters}
    offers = [h for h in offered_heads(desc, sidecars) if h.kind in drafters]
    chosen = speculate(placed, desc, offers, request.spec, measured)
    costed, costs = _measured_costs(placed, chosen.speculative, machine, facts.measured.verify_costs)
    skipped_said = tuple(Reason("sidecar-skipped", s) for s in skipped)
    return replace(chosen, speculative=costed, reasons=(*skipped_said, *chosen.reasons, *costs))


def _measured_costs(
    placed: Placed, spec: SpeculativePlan, machine: Machine, records: tuple[VerifyCostRecord, ...]
) -> tuple[SpeculativePlan, tuple[Reason, ...]]:
    """The speculation keyed for this machine's verification costs, and using them when the engine has measured
    them (``engine.verify_probe``; until then the fixed model, and the engine measures at its first load)."""
    key = verify_costs_key(
        machine,
        placed.quant,
        placed.file_bytes,
        n_gpu_layers=placed.n_gpu_layers,
        n_cpu_moe=placed.n_cpu_moe,
        threads=placed.threads,
        threads_batch=placed.threads_batch,
        copies_state=placed.recurrent and rolls_back_from_a_copy(spec),
    )
    found = measured_verify_costs(list(records), key, spec.n_max + 1)
    if found is None:
        return replace(spec, costs_key=key), ()
    costs = found.costs[: spec.n_max + 1]
    reason = Reason(
        "verify-costs",
        f"Verification cost measured here{' on ' + found.when if found.when else ''}: a batch of {len(costs)} "
        f"tokens costs {costs[-1]:.1f} plain steps of {found.step_ms:.1f} ms, so drafting gains at most "
        f"{len(costs) / costs[-1]:.2f}x; the drafter decides with these fixed numbers, never with timings.",
    )
    costed = replace(spec, batch_costs=costs, costs_source="measured", costs_key=key)
    return costed, (reason,) if spec.enabled and spec.mode == "ngram" else ()


def _loadable_sidecars(sidecars: Sidecars, action: Action, checks: _ArchChecks) -> tuple[Sidecars, list[str]]:
    """The sidecars whose architecture the llama.cpp here loads (or whose header was not read: downloading
    checks those), and a note for each one left out."""
    from clover_local.arch_support import sidecar_skipped

    kept: dict[str, tuple[str, ModelDescription | None]] = {}
    notes: list[str] = []
    for kind, (name, desc) in sidecars.items():
        check = checks.check(desc.architecture.arch) if desc is not None else None
        if check is not None and not check.supported:
            notes.append(sidecar_skipped(kind, Path(name).name, check, action))
        else:
            kept[kind] = (name, desc)
    return kept, notes  # type: ignore[return-value]


MTP_ONE_SLOT = Reason(
    "slots",
    "1 slot: this plan drafts with the model's MTP head, which the embedded engine runs for one sequence only, so"
    " a lone request keeps its speculation (--parallel N serves N requests at once, drafting by n-gram instead).",
)


def _mtp_needs_one_slot(
    request: LaunchRequest, runner: Runner, placed: Placed, spec: Speculation | None
) -> bool:
    """Default slots (``parallel`` None) would switch off the MTP head the plan drafts with: the embedded engine's
    head follows one sequence (``engine.embedded``), and a lone request must keep its speculation. Slots asked
    for (``--parallel N``) are planned as asked, and the engine says what they cost."""
    return (
        request.parallel is None
        and runner.kind == "embedded"
        and placed.parallel > 1
        and spec is not None
        and spec.speculative.enabled
        and spec.speculative.mode == "mtp"
    )


# -- a smaller community quant ------------------------------------------------------------------------------


def needs_community(request: LaunchRequest, preset: Preset, fits: bool) -> bool:
    """The plan does not fit well (``fits``: the plan's), it is of the preset's automatic quant (not a file, repo
    or quant asked for), and the preset knows community repos that may hold a smaller quant that fits."""
    asked_for = request.model or request.repo or request.quant != "auto"
    return not fits and bool(preset.community) and not asked_for


def _community(
    request: LaunchRequest,
    facts: LaunchFacts,
    runner: Runner,
    machine: Machine,
    checks: _ArchChecks,
    fits: bool,
) -> tuple[CommunityPick | None, Stage]:
    """When the plan does not fit well and the facts hold the preset's community quants, the best smaller one
    that fits, planned for the same runner, with why and the command that gets it (``plan.community``)."""
    if facts.community is None or not needs_community(request, facts.preset, fits):
        return None, Stage()
    from clover_local.fetch.describe import QuantDescriptions

    def plan_for(q: CommunityQuant) -> Plan:
        """The plan ``--repo q.repo --quant q.quant`` gets: the same step, for the same runner."""
        described = QuantDescriptions({q.quant: q.description}, (), {q.quant: q.source})
        model: _Model = (as_repo_preset(facts.preset, q), None, described)
        asked = replace(request, quant=q.quant)
        return assemble(*_plan(asked, facts, model, runner, machine, checks, request.parallel)[0])

    pick, reasons = choose_community_quant(facts.community, plan_for)
    return pick, Stage(reasons=tuple(reasons))


# -- the settings -------------------------------------------------------------------------------------------


def _keeps_slots(facts: LaunchFacts, runner: Runner) -> bool:
    """Whether the runner's llama-server can save and restore its slots (``--slot-save-path`` in its help), so a
    relaunch for another load keeps the conversations; True where the binary was not asked (starting it asks)."""
    if runner.kind != "llama-server" or runner.binary is None:
        return False
    asked = _server_facts(facts, runner)
    caps = None if asked is None else (asked.capabilities or asked.kept_arg_cpp)
    return caps is None or caps.supports("--slot-save-path")


def _server_facts(facts: LaunchFacts, runner: Runner) -> ServerFacts | None:
    """What the runner's llama-server said about itself when the facts were gathered (None: not asked)."""
    return facts.servers.get(str(runner.binary.path)) if runner.binary is not None else None


def _fitted_argv(
    facts: LaunchFacts, runner: Runner, argv: list[str]
) -> tuple[tuple[str, ...] | None, tuple[Notice, ...]]:
    """The plan's argv fitted to the runner's llama-server, as its ``--help`` lists its flags (an upstream
    runtime may lack one the pinned llama.cpp has, or call it otherwise), with this CPU's repacking rule, and a
    notice per flag changed or dropped; (None, ()) for the embedded engine, or a binary that could not be asked
    (starting it fits the argv then, and says why)."""
    asked = _server_facts(facts, runner)
    if runner.kind != "llama-server" or asked is None:
        return None, ()
    said: tuple[Notice, ...] = ()
    caps = asked.capabilities
    if caps is None:
        if asked.kept_arg_cpp is None:
            return None, ()
        caps = asked.kept_arg_cpp
        problem = asked.problem.text if asked.problem else ""
        text = f"{problem} Its flags were checked against the arg.cpp kept beside it ({asked.kept_path})."
        said = (Notice("flags-from-arg-cpp", text),)
    # This CPU's repacking rule too (the plan may describe another machine): the command shown is what runs.
    adapted = fit_argv(argv, caps, repack_safe=facts.repack_safe_here)
    return tuple(adapted.argv), (*said, *adapted.warnings)


# -- what a launch would refuse, said before deciding it ------------------------------------------------------


def check_request(request: LaunchRequest, facts: LaunchFacts) -> None:
    """Raise what deciding ``request`` would refuse about its model, without deciding it (``chat`` says it
    before the app starts, and the app decides once): a file whose architecture no llama.cpp here loads (unless
    ``--force``), and a ``--ctx`` outside the model's limit. Pure: from the facts."""
    description = _model_description(request, facts)
    local = facts.model
    if local is not None:
        _ArchChecks(facts.support, facts.checks).for_model(description, str(local.path), "load", request)
    if request.ctx is not None:
        preset = preset_from_header(facts.preset, description, local.path) if local else facts.preset
        check_context(request.ctx, preset, [description])
