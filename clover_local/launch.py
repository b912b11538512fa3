"""A launch is one value: what the person asked for (:class:`LaunchRequest`) becomes, in :func:`decide_launch`, the
runner that will run the model, the plan budgeted for that runner, and the llama.cpp settings rendered from that
plan (:class:`Launch`). Every command, the app and ``serve`` make their launch here; :func:`open_launch` loads
exactly what the value says and decides nothing.

The order is the point: the runner is chosen *before* the plan, from what the model needs (its architecture, a
drafter only llama-server runs, pooled RPC devices, diffusion decoding) and what the person asked for, because the
two engines hold different memory. A load that runs out of memory is planned again (:func:`safer_launch`) for
less memory, so what is shown afterwards (the plan, the command) is what was loaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from shlex import join as shlex_join
from typing import TYPE_CHECKING, Literal

from clover_local.errors import (
    ArchitectureError,
    ContextOutOfRange,
    OutOfMemoryError,
    ServerError,
    UsageError,
)
from clover_local.plan.diffusion import DiffusionWishes
from clover_local.plan.llama_args import LlamaSettings, llama_settings
from clover_local.plan.reasons import Reason, without_reasons
from clover_local.plan.speculation import SERVER_ONLY_MODES, SPEC_MODES, SpecMode
from clover_local.plan.types import EngineKind, Goal, Plan
from clover_local.presets import Preset

if TYPE_CHECKING:
    from clover_local.arch_support import ArchCheck
    from clover_local.detect.machine import Machine
    from clover_local.engine.types import ChatEngine
    from clover_local.fetch.describe import QuantDescriptions
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.plan.community import CommunityQuant, CommunityQuants

__all__ = [
    "ENGINE_WISHES",
    "EngineWish",
    "Launch",
    "LaunchRequest",
    "OpenedEngine",
    "Runner",
    "VerifyCostsProbe",
    "choose_runner",
    "decide_launch",
    "measure_verify_costs",
    "needs_community",
    "open_launch",
    "safer_launch",
    "with_model_file",
]

EngineWish = Literal["auto", "embedded", "llama-server"]
ENGINE_WISHES: tuple[EngineWish, ...] = ("auto", "embedded", "llama-server")
EMBEDDED_DRAFTERS: frozenset[str] = frozenset(m for m in SPEC_MODES if m not in SERVER_ONLY_MODES)
"""Speculation modes the embedded engine runs itself (n-gram, and the MTP head through ``engine.mtp``)."""
SAFER_GPU_SHARE = 0.75
"""After an out-of-memory load, the re-plan may use this share of each GPU's free memory."""
SAFE_CTX = 4096
"""... and at most this context (halved, never below 512)."""


@dataclass(frozen=True)
class LaunchRequest:
    """What the person asked for, from any front end (flags, the app's settings, ``serve``); ``None`` and
    ``auto`` mean "decide for me"."""

    preset: Preset | str | None = None
    """A preset, its name, or the path of a ``.toml``; None: the default one, or the one a ``model`` file's
    name says (``runtime.preset_for_file``)."""
    model: str | None = None
    """A local GGUF to run (planned with its exact header); None: the preset's file."""
    repo: str | None = None
    """Another GGUF repo of the preset's model (``--repo``): its quants as its files name them
    (``fetch.repo_preset``)."""
    quant: str = "auto"
    ctx: int | None = None
    goal: Goal = "quality"
    threads: int | None = None
    spec: SpecMode = "auto"
    """Self-speculation (``--spec``): the one knob for it; ``off`` turns it off."""
    engine: EngineWish | None = None
    """``embedded``, ``llama-server`` or ``auto`` (llama-server when one is found); None: the embedded engine,
    unless the model needs llama-server (:func:`choose_runner`)."""
    llama_server: str | None = None
    """The ``llama-server`` binary to use whenever one runs (``--llama-server PATH``)."""
    rpc: str | None = None
    link: str | None = None
    simulate: str | None = None
    diffusion: DiffusionWishes | None = None
    chat_template: str | None = None
    """Instead of the preset's template (the embedded engine only)."""
    offline: bool = False
    describe: bool = True
    """Read each quant's GGUF header (local, else on the Hub) before planning; False: the preset's estimates."""
    force: bool = False
    """Go on even when no llama.cpp here can load the model's architecture."""
    parallel: int | None = 1
    """Slots: requests decoded at once (``--parallel``); None: as many as fit beside the one-slot placement, up
    to 4 (``plan.slots``; ``serve``'s default). The plan sizes memory for them; nothing decides it later."""


@dataclass(frozen=True)
class Runner:
    """Which engine runs a launch, and why."""

    kind: EngineKind
    why: str
    binary: ServerBinary | None = None
    """The ``llama-server`` to start (llama-server runner only)."""
    runtime: str | None = None
    """The installed runtime (release tag) whose llama-server this is; None: the built one, PATH or named."""
    install: str | None = None
    """The command that installs the release that would run it, when none here can yet (``binary`` is None):
    the launch can be shown (``plan``) but not opened."""

    @property
    def drafters(self) -> frozenset[str]:
        """The speculation modes this runner can run: the plan chooses only among these."""
        return frozenset(SPEC_MODES) if self.kind == "llama-server" else EMBEDDED_DRAFTERS


@dataclass(frozen=True)
class Launch:
    """Everything a load needs, decided: shown before loading (plan, command) and loaded as shown."""

    request: LaunchRequest
    preset: Preset
    machine: Machine
    runner: Runner
    plan: Plan
    """Budgeted for ``runner.kind`` (``plan.engine``)."""
    settings: LlamaSettings
    """``plan.llama_args.llama_settings(plan)``: argv for llama-server, parameters for the embedded engine."""
    notices: tuple[str, ...] = ()
    """What the person should read before loading (why this runner, a re-plan, flags this llama-server lacks)."""
    server_argv: tuple[str, ...] | None = None
    """``settings.argv()`` fitted to the runner's llama-server (its ``--help``): a flag it lacks dropped or
    translated, each change in ``notices``; None when not fitted (the embedded engine, a binary that could not
    be asked: then it is fitted when started)."""

    @property
    def argv(self) -> list[str]:
        """What llama-server gets (without the binary, host and port)."""
        return list(self.server_argv) if self.server_argv is not None else self.settings.argv()

    @property
    def command(self) -> str:
        """The ``llama-server`` command for this launch, ready to paste (the binary it would run), listening where
        every release listens when told (``server_args.PRINTED_PORT``)."""
        import shlex

        from clover_local.llamacpp.server_args import printed_endpoint
        from clover_local.plan.llama_args import hf_args

        binary = self.runner.binary.command if self.runner.binary is not None else ["llama-server"]
        hf = self.preset.repo if not self.settings.model_path and self.preset.repo else None
        model = hf_args(hf, self.settings.quant) if hf else []
        return shlex.join([*binary, *model, *printed_endpoint(self.argv)])


@dataclass(frozen=True)
class OpenedEngine:
    """A loaded launch."""

    engine: ChatEngine
    launch: Launch
    """What was loaded: after an out-of-memory re-plan, the safer launch, not the one asked for."""
    notices: tuple[str, ...] = ()
    """Warnings and facts for the person: flags dropped for this llama-server, a re-plan, ..."""
    placement: str = ""
    """Where the weights, KV cache and experts went, in words (the embedded engine's load log)."""
    fallback_message: str | None = None
    """Set when the first load ran out of memory and the safer launch was loaded instead: what changed."""
    extras: dict[str, object] = field(default_factory=dict, compare=False)

    @property
    def kind(self) -> EngineKind:
        return self.launch.runner.kind

    @property
    def plan(self) -> Plan:
        return self.launch.plan


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
    newest kernels). ``request.llama_server`` is the binary wherever llama-server runs."""
    if request.engine is not None and request.engine not in ENGINE_WISHES:
        raise UsageError(f"--engine {request.engine!r} is not one of {', '.join(ENGINE_WISHES)}.")
    find = find_binary or _find_binary
    if arch is not None and arch.install is not None and not arch.supported:
        if request.engine == "embedded":
            raise UsageError(
                f"--engine embedded cannot run this: {arch.why}.",
                f"Install the release that loads it (`{arch.install_command}`); its llama-server runs it.",
            )
        if request.llama_server:  # the person's own llama-server: theirs to know what it loads
            binary = find(request.llama_server)
            if binary is not None:
                return Runner(
                    "llama-server", f"{arch.why}; using {shlex_join(binary.command)} as asked", binary
                )
        return Runner(
            "llama-server",
            f"{arch.why}; `{arch.install_command}` installs it, and its llama-server will run it",
            install=arch.install_command,
        )
    if diffusion or (arch is not None and arch.runner == "diffusion"):
        asked = (
            " (not llama-server, as asked: it cannot decode it)" if request.engine == "llama-server" else ""
        )
        return Runner("embedded", f"a diffusion model: only the embedded engine decodes it{asked}")
    needs = _needs_llama_server(request, arch)
    if needs:
        if request.engine == "embedded":
            raise UsageError(
                f"--engine embedded cannot run this: {needs}.",
                "Drop --engine embedded (llama-server runs it), or change what needs llama-server.",
            )
        binary = _server_for(arch, request.llama_server, find)
        if binary is None:
            raise ServerError(
                f"{needs[0].upper()}{needs[1:]}, and no llama-server was found (CLOVER_LLAMA_SERVER, an installed "
                "runtime, the built one, PATH).",
                "Install one with `clover-local runtime install latest` (or scripts/build-llama-server), or pass "
                "--llama-server PATH.",
            )
        runtime = arch.runtime if arch is not None and not request.llama_server else None
        return Runner(
            "llama-server", f"{needs}; using {shlex_join(binary.command)} ({binary.source})", binary, runtime
        )
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
        return Runner(
            "llama-server", f"asked for; using {shlex_join(binary.command)} ({binary.source})", binary
        )
    if binary is not None:
        return Runner("llama-server", f"found {shlex_join(binary.command)} ({binary.source})", binary)
    return Runner(
        "embedded",
        "no llama-server found (build one with scripts/build-llama-server); using llama-cpp-python",
    )


def _runner_machine(machine: Machine, runner: Runner) -> Machine:
    """The machine as the runner sees it: llama-server offloads to the GPU backends of its own build (its
    ``--list-devices``), not llama-cpp-python's (a CPU wheel beside a CUDA runtime is the usual case); a runtime
    still to be installed, to the backend its installer picks for these GPUs (``runtimes.assets.target_for``).
    A described machine (``--simulate``) names its build itself; a binary that cannot be asked changes nothing
    (starting it says why)."""
    if runner.kind != "llama-server" or machine.simulated or not machine.gpus:
        return machine
    from typing import get_args

    from clover_local.detect.machine import Backend

    if runner.binary is not None:
        from clover_local.llamacpp.binary import capabilities

        try:
            offered = capabilities(runner.binary.path).backends
        except ServerError:
            return machine
    elif runner.install is not None:
        from clover_local.runtimes.assets import target_for

        offered = tuple("cuda" if b.startswith("cuda") else b for b in target_for(machine).backends[:1])
    else:
        return machine
    backends = tuple(b for b in dict.fromkeys((*offered, "cpu")) if b in get_args(Backend))
    gpu = any(b != "cpu" for b in backends)
    build = replace(machine.build, gpu_offload=gpu, backends=backends)  # type: ignore[arg-type]
    return machine if build == machine.build else replace(machine, build=build)


def _needs_llama_server(request: LaunchRequest, arch: ArchCheck | None) -> str:
    """Why only llama-server can run this request ("" when the embedded engine can)."""
    if request.rpc:
        return (
            f"the plan pools other machines' devices (--rpc {request.rpc}), and the embedded engine "
            "(llama-cpp-python's wheel) has no RPC backend"
        )
    if arch is not None and arch.runner == "llama-server":
        return arch.why
    if request.spec in SERVER_ONLY_MODES:
        return f"the {request.spec} drafter runs only in llama-server (the embedded engine drafts by n-gram or MTP)"
    return ""


def _find_binary(configured: str | None) -> ServerBinary | None:
    from clover_local.llamacpp.binary import find_llama_server

    return find_llama_server(configured)


def _server_for(
    arch: ArchCheck | None, configured: str | None, find: Callable[[str | None], ServerBinary | None]
) -> ServerBinary | None:
    """The llama-server for a model: the one the person named; else the runtime whose llama.cpp knows the
    architecture (the architecture check names it); else the usual search."""
    if configured:
        return find(configured)
    if arch is not None and arch.server_path:
        from clover_local.llamacpp.binary import ServerBinary

        return ServerBinary(Path(arch.server_path), arch.server_source or "runtime")
    return find(None)


# -- the launch -------------------------------------------------------------------------------------------


def decide_launch(
    request: LaunchRequest,
    *,
    machine: Machine | None = None,
    models: QuantDescriptions | None = None,
    find_binary: Callable[[str | None], ServerBinary | None] | None = None,
    community: CommunityQuants | None = None,
) -> Launch:
    """The launch for ``request`` on ``machine`` (None: the request's ``--simulate`` machine, else this one):
    the model described once (its header, local or on the Hub), its architecture checked, the runner chosen,
    the plan made for that runner, and the settings rendered from the plan. ``find_binary``: how a
    llama-server is found (``command`` names the one it prints instead of looking for one). A plan that does
    not fit well names a smaller quant of the preset's community repos that does (:func:`_with_community`;
    ``community``: their quants, read already)."""
    from clover_local import runtime
    from clover_local.arch_support import check_architecture, installed_support

    preset = runtime.resolve_preset(request.preset, request.model)
    if request.repo and not request.model:
        from clover_local.fetch.repo_preset import repo_preset

        preset = repo_preset(preset, request.repo, request.quant, offline=request.offline)
    machine = machine or runtime.detect(request.simulate, request.rpc, request.link)
    description = None
    if request.model:
        path = runtime.checked_gguf(Path(request.model).expanduser())
        description = runtime.local_header(path)
    else:
        if models is None and request.describe:
            from clover_local.fetch.describe import describe_quants

            models = describe_quants(
                preset,
                offline=True if request.offline else None,
                quants=None if request.quant == "auto" else [request.quant],
            )
        if models is not None and models.models:
            wanted = request.quant if request.quant in models.models else next(iter(models.models))
            description = models.models[wanted]
    if description is None:
        from clover_local.gguf.model import describe_from_preset

        quant = request.quant if request.quant in preset.quants else next(iter(preset.quants))
        description = describe_from_preset(preset, quant)
    arch = check_architecture(
        description.architecture.arch, installed_support(offline=True if request.offline else None)
    )
    runner = choose_runner(
        request, arch, diffusion=description.diffusion is not None, find_binary=find_binary
    )
    machine = _runner_machine(machine, runner)
    resolved = preset

    def plan_with(parallel: int | None) -> tuple[Plan, Preset]:
        return runtime._plan_for_runner(
            resolved,
            model=request.model,
            quant=request.quant,
            ctx=request.ctx,
            goal=request.goal,
            threads=request.threads,
            machine=machine,
            models=models,
            describe=request.describe,
            offline=request.offline,
            engine=runner.kind,
            diffusion=request.diffusion,
            spec=request.spec,
            drafters=runner.drafters,
            force=request.force,
            parallel=parallel,
        )

    plan, preset = plan_with(request.parallel)
    if _mtp_needs_one_slot(request, runner, plan):
        plan, preset = plan_with(1)
        # the one-slot plan's reason ("as asked") is not why it has one slot
        plan = replace(plan, reasons=(*without_reasons(plan.reasons, "slots"), MTP_ONE_SLOT))
    if plan.chat_template != (request.chat_template or plan.chat_template):
        plan = replace(plan, chat_template=request.chat_template or plan.chat_template)
    plan = _with_community(request, preset, machine, runner, plan, community)
    said = runner.kind == "llama-server" or request.engine not in (None, runner.kind)
    notices = (f"Engine: {runner.kind} ({runner.why}).",) if said else ()
    settings = llama_settings(plan)
    argv, dropped = _fitted_argv(runner, settings)
    return Launch(request, preset, machine, runner, plan, settings, (*notices, *dropped), argv)


def needs_community(request: LaunchRequest, preset: Preset, plan: Plan) -> bool:
    """The plan does not fit well, it is of the preset's automatic quant (not a file, repo or quant asked for),
    and the preset knows community repos that may hold a smaller quant that fits."""
    asked_for = request.model or request.repo or request.quant != "auto"
    return not plan.fits and bool(preset.community) and not asked_for


def _with_community(
    request: LaunchRequest,
    preset: Preset,
    machine: Machine,
    runner: Runner,
    plan: Plan,
    community: CommunityQuants | None,
) -> Plan:
    """``plan``, and when it does not fit well (the preset's automatic quant, not a file or repo asked for), the
    best smaller quant of the preset's community repos that fits, planned for the same runner, with why and the
    command that gets it (``plan.community``). Their quants are read here unless given (``describe`` False:
    not at all); offline, the reasons name the repos that would be asked."""
    if not needs_community(request, preset, plan):
        return plan
    from clover_local import runtime
    from clover_local.fetch.describe import QuantDescriptions
    from clover_local.plan.community import as_repo_preset, choose_community_quant, weights_room

    if community is None:
        if not request.describe:
            return plan
        from clover_local.fetch.community import find_community_quants

        community = find_community_quants(
            preset,
            below_bytes=plan.file_bytes,
            room_bytes=weights_room(plan),
            offline=True if request.offline else None,
        )

    def plan_for(q: CommunityQuant) -> Plan:
        """The plan ``--repo q.repo --quant q.quant`` gets: the same step, for the same runner."""
        described = QuantDescriptions({q.quant: q.description}, (), {q.quant: q.source})
        planned, _ = runtime._plan_for_runner(
            as_repo_preset(preset, q),
            quant=q.quant,
            ctx=request.ctx,
            goal=request.goal,
            threads=request.threads,
            machine=machine,
            models=described,
            offline=request.offline,
            engine=runner.kind,
            spec=request.spec,
            drafters=runner.drafters,
            force=request.force,
            parallel=request.parallel,
        )
        return planned

    pick, reasons = choose_community_quant(community, plan_for)
    return replace(plan, community=pick, reasons=(*plan.reasons, *reasons))


MTP_ONE_SLOT = Reason(
    "slots",
    "1 slot: this plan drafts with the model's MTP head, which the embedded engine runs for one sequence only, so"
    " a lone request keeps its speculation (--parallel N serves N requests at once, drafting by n-gram instead).",
)


def _mtp_needs_one_slot(request: LaunchRequest, runner: Runner, plan: Plan) -> bool:
    """Default slots (``parallel`` None) would switch off the MTP head the plan drafts with: the embedded engine's
    head follows one sequence (``engine.embedded``), and a lone request must keep its speculation. Slots asked
    for (``--parallel N``) are planned as asked, and the engine says what they cost."""
    return (
        request.parallel is None
        and runner.kind == "embedded"
        and plan.parallel > 1
        and plan.speculative.enabled
        and plan.speculative.mode == "mtp"
    )


def with_model_file(launch: Launch, path: str) -> Launch:
    """``launch``, shown before its file was here (the plan screen, then a download), now run from ``path``:
    the same launch when its plan already names that file; else the same request on the same machine at the
    same context, planned from the file's own header and the drafters downloaded beside it (before the download
    the plan could name only the repo's file names). The runner follows the same model, so it is the one shown."""
    if launch.plan.model_path == path:
        return launch
    request = replace(launch.request, preset=launch.preset, model=path, repo=None, ctx=launch.plan.ctx)
    try:
        return decide_launch(request, machine=launch.machine)
    except ContextOutOfRange:
        if launch.request.ctx is not None:
            raise  # the person asked for it: said, not changed
        # The plan chose that context from what was known before the download; the file's own header knows
        # better, so the plan chooses again (the app never refuses a plan it made).
        return decide_launch(replace(request, ctx=None), machine=launch.machine)


def _fitted_argv(runner: Runner, settings: LlamaSettings) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """The plan's argv fitted to the runner's llama-server, as its ``--help`` lists its flags (an upstream
    runtime may lack one the pinned llama.cpp has, or call it otherwise), and a notice per flag changed or
    dropped; (None, ()) for the embedded engine, or a binary that cannot be asked (starting it says why)."""
    if runner.kind != "llama-server" or runner.binary is None:
        return None, ()
    from clover_local.llamacpp.binary import capabilities, capabilities_from_arg_cpp
    from clover_local.llamacpp.server_args import adapt_args

    said: tuple[str, ...] = ()
    try:
        caps = capabilities(runner.binary.path, runner.binary.subcommand)
    except ServerError as exc:
        kept = _kept_arg_cpp(runner)
        if kept is None:
            return None, ()
        caps = capabilities_from_arg_cpp(
            kept.read_text(encoding="utf-8", errors="replace"), f"{runner.runtime}"
        )
        said = (f"{exc.what} Its flags were checked against the arg.cpp kept beside it ({kept}).",)
    from clover_local.engine.repack import common_argv_here

    # This CPU's repacking rule too (the plan may describe another machine): the command shown is what runs.
    adapted = adapt_args(common_argv_here(settings.argv()), caps)
    return tuple(adapted.argv), (*said, *adapted.warnings)


def _kept_arg_cpp(runner: Runner) -> Path | None:
    """The ``common/arg.cpp`` an installed runtime keeps in its folder, when it does."""
    if runner.runtime is None:
        return None
    from clover_local import settings

    path = settings.runtimes_dir() / runner.runtime / "arg.cpp"
    return path if path.is_file() else None


def safer_launch(launch: Launch, why: str) -> Launch | None:
    """The launch planned again for less memory after ``why`` (an out-of-memory load): at most
    :data:`SAFE_CTX` tokens of context (halved, at least 512) and :data:`SAFER_GPU_SHARE` of each GPU's free
    memory, so more experts and layers stay in RAM. None when there is nothing left to give back."""
    plan = launch.plan
    new_ctx = max(512, min(plan.ctx // 2, SAFE_CTX))
    if new_ctx >= plan.ctx and plan.n_gpu_layers == 0:
        return None
    machine = launch.machine
    if machine.gpus:
        machine = replace(
            machine,
            gpus=tuple(replace(g, free_bytes=int(g.free_bytes * SAFER_GPU_SHARE)) for g in machine.gpus),
        )
    request = replace(
        launch.request, ctx=min(new_ctx, plan.ctx), model=plan.model_path or launch.request.model
    )
    safer = decide_launch(replace(request, preset=launch.preset, repo=None), machine=machine)
    changes = []
    if safer.plan.ctx != plan.ctx:
        changes.append(f"context {plan.ctx} -> {safer.plan.ctx} tokens")
    if (safer.plan.n_gpu_layers, safer.plan.n_cpu_moe) != (plan.n_gpu_layers, plan.n_cpu_moe):
        changes.append(
            f"GPU layers {_layers(plan.n_gpu_layers)} -> {_layers(safer.plan.n_gpu_layers)}, experts of "
            f"{plan.n_cpu_moe} -> {safer.plan.n_cpu_moe} layers in RAM"
        )
    if not changes:
        return None
    said = (
        f"Loading with the planned settings ran out of memory ({why}). Planned again for less memory and "
        f"loaded that instead: {'; '.join(changes)}."
    )
    return replace(safer, notices=(said, *safer.notices))


def _layers(n: int) -> str:
    return "all" if n < 0 else str(n)


def open_launch(
    launch: Launch,
    *,
    progress: Callable[[float], None] | None = None,
    on_log: Callable[[str], None] | None = None,
    ready_timeout_s: float = 600.0,
) -> OpenedEngine:
    """Load ``launch`` exactly as it says. When the load runs out of memory (the embedded engine, or a llama-server
    child whose log says so), the launch is planned again for less memory once (:func:`safer_launch`) and that one
    is loaded; the result names the launch loaded. A llama-server child is supervised: one that stops later is
    started again with the same argv (``llamacpp.supervisor``), never re-planned behind the person's back."""
    if launch.runner.install is not None:
        arch = launch.plan.architecture
        raise ArchitectureError(
            f"{launch.plan.model_path or launch.preset.repo}: {arch.why if arch else launch.runner.why}. "
            "Nothing was loaded.",
            f"Install it first: `{launch.runner.install}`; then run again.",
        )
    if not launch.plan.model_path:
        raise UsageError(
            "No local model file to run.",
            "Download it first (clover-local download), or pass --model PATH.",
        )
    try:
        return _open(launch, progress, on_log, ready_timeout_s)
    except OutOfMemoryError as first:  # either engine: llama-server's load log is read as the embedded one's
        safer = safer_launch(launch, first.what)
        if safer is None:
            raise
        try:
            opened = _open(safer, progress, on_log, ready_timeout_s)
        except OutOfMemoryError as second:
            raise OutOfMemoryError(
                f"Not enough memory to load {Path(launch.plan.model_path).name}, even planned again for less "
                f"memory ({safer.notices[0]}).",
                "Close other programs, choose a smaller quant, or lower --ctx. " + second.what,
            ) from None
        return replace(opened, fallback_message=safer.notices[0], notices=(safer.notices[0], *opened.notices))


def _open(
    launch: Launch,
    progress: Callable[[float], None] | None,
    on_log: Callable[[str], None] | None,
    ready_timeout_s: float,
) -> OpenedEngine:
    plan, preset = launch.plan, launch.preset
    assert plan.model_path is not None
    if launch.runner.kind == "embedded":
        from clover_local.engine.loader import load_engine

        result = load_engine(
            plan.model_path,
            launch.settings.kwargs(),
            chat_template=launch.request.chat_template or plan.chat_template,
            sampling=preset.sampling,
            speculative=plan.speculative,
            progress=progress,
            diffusion=plan.diffusion,
        )
        return OpenedEngine(
            result.engine, launch, (*launch.notices, *result.notices), str(result.placement), None
        )

    from clover_local.llamacpp.server import start_llama_server
    from clover_local.llamacpp.server_engine import LlamaServerEngine
    from clover_local.runtime import chat_template_for

    template = chat_template_for(plan)
    process = start_llama_server(
        launch.argv,
        binary=launch.runner.binary,
        on_log=on_log,
        ready_timeout_s=ready_timeout_s,
        adapt=launch.server_argv is None,  # fitted when decided; only a binary not asked then is asked now
    )
    engine = LlamaServerEngine(
        process,
        model_name=preset.name,
        sampling=preset.sampling,
        template=template,
        slots=plan.parallel,
        ready_timeout_s=ready_timeout_s,
    )
    notes = (*launch.notices, *([template.notice] if template.notice else []), *process.warnings)
    return OpenedEngine(engine, launch, notes)


@dataclass(frozen=True)
class VerifyCostsProbe:
    """What the first-load verification probe did: its notice for the person, and whether the table was kept."""

    notice: str
    kept: bool


def measure_verify_costs(opened: OpenedEngine, *, again: bool = False) -> VerifyCostsProbe | None:
    """At an n-gram drafting plan's first load on this machine, time what verifying a draft costs here
    (``engine.verify_probe``), keep it for every later plan and use it now; returns what it did (None when
    there was nothing to measure). A measurement taken while other programs kept the CPU busy is neither kept
    nor used (the notice says so), and is taken again at the next load. An explicit step, called by the front
    ends after opening: later plans read the kept numbers (``runtime.with_measured_costs``), so drafting
    decisions never depend on timings. ``again``: measure even when the plan already uses kept costs
    (``bench verify-costs``)."""
    from clover_local.engine.embedded import EmbeddedEngine

    engine, spec = opened.engine, opened.plan.speculative
    first = spec.costs_source != "measured" or again
    wanted = spec.enabled and spec.mode == "ngram" and first and spec.costs_key
    if not wanted or not isinstance(engine, EmbeddedEngine) or engine.n_ctx < spec.n_max + 8:
        return None
    if opened.fallback_message is not None:
        return None  # a re-planned load is not the placement the costs would be kept for
    import time

    from clover_local.engine.verify_probe import measure_batch_costs
    from clover_local.measure.records import add_verify_costs
    from clover_local.plan.measured import VerifyCostRecord

    measured = measure_batch_costs(engine, spec.n_max + 1)
    if not measured.quiet:
        return VerifyCostsProbe(
            f"Did not keep what verifying a draft costs here: other programs used {measured.others_busy:.1f} "
            "cores while it was measured, so the timings were of stalls. The drafter uses its model for now; "
            "it is measured again at a later load.",
            kept=False,
        )
    add_verify_costs(
        VerifyCostRecord(
            spec.costs_key, measured.costs, measured.step_ms, time.strftime("%Y-%m-%d"), measured.others_busy
        )
    )
    engine.use_batch_costs(measured.costs)
    return VerifyCostsProbe(
        f"Measured what verifying a draft costs here (once, kept for later loads): {len(measured.costs)} tokens "
        f"cost {measured.costs[-1]:.1f} plain steps, so speculation gains at most {measured.ceiling:.2f}x.",
        kept=True,
    )
