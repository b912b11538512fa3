"""A launch is one value: what the person asked for (``LaunchRequest``) becomes, in :func:`decide_launch`, the
runner that will run the model, the plan budgeted for that runner, and the llama.cpp settings rendered from that
plan (``Launch``). Every command, the app and ``serve`` make their launch here; :func:`open_launch` loads
exactly what the value says and decides nothing.

:func:`decide_launch` is two steps: the facts are gathered once (``facts.gather_facts``: every file, process
and Hub request), then decided without I/O (``decide.decide``). A load that runs out of memory is planned again
(:func:`safer_launch`) for less memory, so what is shown afterwards (the plan, the command) is what was loaded.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clover_local.decide import choose_runner, needs_community
from clover_local.errors import ArchitectureError, ContextOutOfRange, OutOfMemoryError, UsageError
from clover_local.facts import LaunchFacts
from clover_local.launch_types import EMBEDDED_DRAFTERS, Launch, LaunchRequest
from clover_local.launcher import Launcher
from clover_local.measure.records import add_verify_costs
from clover_local.plan.measured import VerifyCostRecord
from clover_local.plan.reasons import Notice, find_notice
from clover_local.plan.types import EngineKind, Plan

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine
    from clover_local.engine.templates import TemplateChoice
    from clover_local.engine.types import ChatEngine
    from clover_local.fetch.describe import QuantDescriptions
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.plan.community import CommunityQuants

__all__ = [
    "EMBEDDED_DRAFTERS",
    "Launch",
    "LaunchRequest",
    "OpenedEngine",
    "VerifyCostsProbe",
    "choose_runner",
    "decide_launch",
    "measure_verify_costs",
    "needs_community",
    "open_launch",
    "safer_launch",
    "with_model_file",
]

SAFER_GPU_SHARE = 0.75
"""After an out-of-memory load, the re-plan may use this share of each GPU's free memory."""
SAFE_CTX = 4096
"""... and at most this context (halved, never below 512)."""


@dataclass(frozen=True)
class OpenedEngine:
    """A loaded launch."""

    engine: ChatEngine
    launch: Launch
    """What was loaded: after an out-of-memory re-plan, the safer launch, not the one asked for."""
    notices: tuple[Notice, ...] = ()
    """Warnings and facts for the person: flags dropped for this llama-server, a re-plan, ..."""
    placement: str = ""
    """Where the weights, KV cache and experts went, in words (the embedded engine's load log)."""

    @property
    def fallback_message(self) -> str | None:
        """Set when the first load ran out of memory and the safer launch was loaded instead: what changed (its
        ``safer-launch`` notice)."""
        said = find_notice(self.notices, "safer-launch")
        return said.text if said is not None else None

    @property
    def kind(self) -> EngineKind:
        return self.launch.runner.kind

    @property
    def plan(self) -> Plan:
        return self.launch.plan


def decide_launch(
    request: LaunchRequest,
    *,
    machine: Machine | None = None,
    models: QuantDescriptions | None = None,
    find_binary: Callable[[str | None], ServerBinary | None] | None = None,
    community: CommunityQuants | None = None,
) -> Launch:
    """The launch for ``request`` on ``machine`` (None: the request's ``--simulate`` machine, else this one), for
    a front end that makes one launch: a :class:`~clover_local.launcher.Launcher` of its own gathers the facts
    once and decides (``models``, ``find_binary`` and ``community`` stand in for what it would read). A front
    end that decides more than once (the app, ``chat``) keeps its launcher instead."""
    launcher = Launcher(machine=machine, models=models, find_binary=find_binary, community=community)
    return launcher.decide(request)


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


def safer_launch(launch: Launch, why: str) -> Launch | None:
    """The launch planned again for less memory after ``why`` (an out-of-memory load): at most
    :data:`SAFE_CTX` tokens of context (halved, at least 512) and :data:`SAFER_GPU_SHARE` of each GPU's free
    memory, so more experts and layers stay in RAM. None when there is nothing left to give back."""
    plan = launch.plan
    new_ctx = max(512, min(plan.ctx // 2, SAFE_CTX))
    if new_ctx >= plan.ctx and plan.n_gpu_layers == 0:
        return None
    gpus = tuple(replace(g, free_bytes=int(g.free_bytes * SAFER_GPU_SHARE)) for g in launch.machine.gpus)
    machine = replace(launch.machine, gpus=gpus)
    request = replace(launch.request, ctx=min(new_ctx, plan.ctx), quant=plan.quant)
    if not isinstance(launch.facts, LaunchFacts):  # made without facts (a test's launch): read them
        safer = decide_launch(replace(request, preset=launch.preset, repo=None), machine=machine)
    else:  # the same facts, a smaller machine: nothing read again
        safer = Launcher(facts=replace(launch.facts, machine=machine)).decide(request)
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
    return replace(safer, notices=(Notice("safer-launch", said), *safer.notices))


def _layers(n: int) -> str:
    return "all" if n < 0 else str(n)


def open_launch(
    launch: Launch,
    *,
    progress: Callable[[float], None] | None = None,
    on_log: Callable[[str], None] | None = None,
    ready_timeout_s: float = 600.0,
    measure_costs: bool = True,
) -> OpenedEngine:
    """Load ``launch`` exactly as it says. When the load runs out of memory (the embedded engine, or a llama-server
    child whose log says so), the launch is planned again for less memory once (:func:`safer_launch`) and that one
    is loaded; the result names the launch loaded. A llama-server child is supervised: one that stops later is
    started again with the same argv (``llamacpp.supervisor``), never re-planned behind the person's back.
    ``measure_costs``: at an n-gram plan's first load here, measure what verifying a draft costs
    (:func:`measure_verify_costs`, its notice among the result's), as every front end does after opening."""
    opened = _open_or_safer(launch, lambda chosen: _open(chosen, progress, on_log, ready_timeout_s))
    probe = measure_verify_costs(opened) if measure_costs else None
    return replace(opened, notices=(*opened.notices, probe.notice)) if probe is not None else opened


def _open_or_safer(launch: Launch, load: Callable[[Launch], OpenedEngine]) -> OpenedEngine:
    if launch.runner.install is not None:
        arch = launch.plan.architecture
        raise ArchitectureError(
            f"{launch.plan.model_path or launch.preset.repo}: {arch.why if arch else launch.runner.why}. "
            "Nothing was loaded.",
            f"Install it first: `{launch.runner.install}`; then run again.",
        )
    if not launch.plan.model_path:
        raise UsageError(
            "No local model file to run.", "Download it first (clover-local download), or pass --model PATH."
        )
    try:
        return load(launch)
    except OutOfMemoryError as first:  # either engine: llama-server's load log is read as the embedded one's
        safer = safer_launch(launch, first.what)
        if safer is None:
            raise
        try:
            return load(safer)  # its notices begin with the re-plan's
        except OutOfMemoryError as second:
            said = find_notice(safer.notices, "safer-launch")
            raise OutOfMemoryError(
                f"Not enough memory to load {Path(launch.plan.model_path).name}, even planned again for less "
                f"memory ({said.text if said is not None else first.what}).",
                "Close other programs, choose a smaller quant, or lower --ctx. " + second.what,
            ) from None


def _open(
    launch: Launch,
    progress: Callable[[float], None] | None,
    on_log: Callable[[str], None] | None,
    ready_timeout_s: float,
) -> OpenedEngine:
    plan, preset = launch.plan, launch.preset
    assert plan.model_path is not None
    template = chat_template(launch)  # chosen once, for either engine: neither asks the header or /props
    if launch.runner.kind == "embedded":
        from clover_local.engine.loader import load_engine

        result = load_engine(
            plan.model_path,
            launch.settings.kwargs(),
            chat_template=template,
            sampling=preset.sampling,
            speculative=plan.speculative,
            progress=progress,
            diffusion=plan.diffusion,
        )
        return OpenedEngine(result.engine, launch, (*launch.notices, *result.notices), str(result.placement))

    from clover_local.llamacpp.server import start_llama_server
    from clover_local.llamacpp.server_engine import LlamaServerEngine
    from clover_local.plan.memory import pad_cells

    assert launch.runner.binary is not None  # a llama-server runner has one unless it is to install (refused)
    process = start_llama_server(
        launch.argv,
        binary=launch.runner.binary,
        on_log=on_log,
        ready_timeout_s=ready_timeout_s,
        adapt=launch.server_argv is None,  # fitted when decided; only a binary not asked then is asked now
        keep_slots=launch.follow_load is not None and launch.keeps_slots,
    )
    engine = LlamaServerEngine(
        process,
        model_name=preset.name,
        sampling=preset.sampling,
        template=template,
        n_ctx=pad_cells(plan.ctx),  # each slot's context as llama.cpp holds it (what its /props says)
        slots=plan.parallel,
        ready_timeout_s=ready_timeout_s,
        follow_load=launch.follow_load,
    )
    said = [Notice("chat-template", template.notice)] if template.notice else []
    notes = (*launch.notices, *said, *process.warnings)
    return OpenedEngine(engine, launch, notes)


def chat_template(launch: Launch) -> TemplateChoice:
    """The chat template the launch's model is chatted with on either engine (``templates.choose_template``),
    against the GGUF's own as the header its facts read holds it (read now only for a launch made without
    facts, or a file downloaded since)."""
    from clover_local.engine.templates import builtin_template_names, choose_template
    from clover_local.model_files import local_header

    plan, facts = launch.plan, launch.facts if isinstance(launch.facts, LaunchFacts) else None
    path = Path(plan.model_path or "")
    if facts is not None and facts.model is not None and facts.model.path == path:
        gguf = facts.model.description.chat_template
    elif facts is not None and facts.quants is not None and facts.quants.paths.get(plan.quant) == path:
        gguf = facts.quants.models[plan.quant].chat_template
    else:
        gguf = local_header(path).chat_template if plan.model_path else None
    return choose_template(plan.chat_template, gguf, builtin_template_names())


@dataclass(frozen=True)
class VerifyCostsProbe:
    """What the first-load verification probe did: its notice for the person, and whether the table was kept."""

    notice: Notice
    kept: bool


def measure_verify_costs(opened: OpenedEngine, *, again: bool = False) -> VerifyCostsProbe | None:
    """At an n-gram drafting plan's first load on this machine, time what verifying a draft costs here
    (``engine.verify_probe``), keep it for every later plan and use it now; returns what it did (None when
    there was nothing to measure). A measurement taken while other programs kept the CPU busy is neither kept
    nor used (the notice says so), and is taken again at the next load. A step of its own after the load,
    which :func:`open_launch` takes for every front end: later plans read the kept numbers (``decide``), so
    drafting decisions never depend on timings. ``again``: measure even when the plan already uses kept costs
    (``bench verify-costs``)."""
    spec = opened.plan.speculative
    first = spec.costs_source != "measured" or again
    wanted = spec.enabled and spec.mode == "ngram" and first and spec.costs_key
    if not wanted or opened.fallback_message is not None:
        return None  # a re-planned load is not the placement the costs would be kept for
    measured = opened.engine.measure_verify_costs(spec.n_max + 1)
    if measured is None:
        return None
    if not measured.quiet:
        said = (
            f"Did not keep what verifying a draft costs here: other programs used {measured.others_busy:.1f} "
            "cores while it was measured, so the timings were of stalls. The drafter uses its model for "
            "now; it is measured again at a later load."
        )
        return VerifyCostsProbe(Notice("verify-costs", said), kept=False)
    add_verify_costs(
        VerifyCostRecord(
            spec.costs_key, measured.costs, measured.step_ms, time.strftime("%Y-%m-%d"), measured.others_busy
        )
    )
    said = (
        f"Measured what verifying a draft costs here (once, kept for later loads): {len(measured.costs)} "
        f"tokens cost {measured.costs[-1]:.1f} plain steps, so speculation gains at most "
        f"{measured.ceiling:.2f}x."
    )
    return VerifyCostsProbe(Notice("verify-costs", said), kept=True)
