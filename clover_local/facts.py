"""Facts, gathered once: everything a launch depends on that is read from this machine, its files, the Hub or
the llama.cpp builds here, in one immutable value (:class:`LaunchFacts`), gathered in one function that does all
the I/O (:func:`gather_facts`). :func:`clover_local.decide.decide` then turns a request and its facts into a
launch without opening a file, a socket or a process.

What is read, once per command, is what :class:`LaunchFacts` holds. A smaller quant in the preset's community
repos is a fact only a plan that does not fit asks for (:func:`gather_community`): it is gathered after that
plan, then the launch is decided again from the fuller facts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from clover_local.errors import ServerError
from clover_local.gguf.names import DraftKind
from clover_local.measure.records import load_all_spec_ratios, load_records, load_verify_costs, spec_model_key
from clover_local.plan.measured import SpeedRecord, VerifyCostRecord
from clover_local.plan.reasons import Notice
from clover_local.plan.speculation import SERVER_ONLY_MODES
from clover_local.presets import Preset

if TYPE_CHECKING:
    from clover_local.arch_support import ArchCheck, ArchSupport
    from clover_local.detect.machine import Machine
    from clover_local.fetch.describe import QuantDescriptions
    from clover_local.gguf.model import ModelDescription
    from clover_local.launch_types import LaunchRequest
    from clover_local.llamacpp.binary import Capabilities, ServerBinary
    from clover_local.plan.community import CommunityQuants
    from clover_local.plan.types import Plan

__all__ = [
    "LaunchFacts",
    "LocalModel",
    "Measured",
    "ServerFacts",
    "gather_community",
    "gather_facts",
    "still_true_for",
]

Sidecars = Mapping[DraftKind, tuple[str, "ModelDescription | None"]]


@dataclass(frozen=True)
class LocalModel:
    """A GGUF the person named (``--model``): its path, its header, and the drafter sidecars beside it."""

    path: Path
    description: ModelDescription
    sidecars: Sidecars = field(default_factory=dict)


@dataclass(frozen=True)
class ServerFacts:
    """What one llama-server binary says about itself (``--help``, ``--list-devices``), or why it could not."""

    capabilities: Capabilities | None
    problem: Notice | None = None
    """Why the binary could not be asked (``server-unasked``; then it is asked again when started)."""
    kept_arg_cpp: Capabilities | None = None
    """An installed runtime's flags read from the ``common/arg.cpp`` kept beside it, when the binary could not
    be asked (a runtime built for another machine)."""
    kept_path: Path | None = None


@dataclass(frozen=True)
class Measured:
    """What was measured on this machine before: the plan uses it instead of its estimates."""

    speeds: tuple[SpeedRecord, ...] = ()
    """Decode speeds (``bench --llama-bench``, the full-size benchmark's ``--record``)."""
    spec_ratios: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Model key (``measure.records.spec_model_key``) -> speculation mode -> its speed over plain decoding."""
    verify_costs: tuple[VerifyCostRecord, ...] = ()
    """What verifying a draft costs here, per placement (``engine.verify_probe``)."""

    def spec_ratios_for(self, model: str) -> dict[str, float]:
        return dict(self.spec_ratios.get(spec_model_key(model), {}))


@dataclass(frozen=True)
class LaunchFacts:
    """Everything :func:`clover_local.decide.decide` needs, read once."""

    preset: Preset
    """The preset the request means (``model_files.resolve_preset``; a ``--repo``'s files as its quants)."""
    machine: Machine
    """As detected, or described (``--simulate``), with ``--rpc`` workers: before the runner's own build is
    known (``decide`` sees it through the runner's devices)."""
    support: ArchSupport
    """Which architectures each llama.cpp here loads (and the latest release, when it was asked)."""
    checks: Mapping[str, ArchCheck] = field(default_factory=dict)
    """Architecture -> what runs it here (``arch_support.check_architecture``), for the model's and its
    sidecars' architectures: checked once per command."""
    model: LocalModel | None = None
    """A file named with ``--model``; None: the preset's quants."""
    quants: QuantDescriptions | None = None
    """Each quant described (local header, the Hub's, else the preset's estimate); None when the request said
    not to describe (the preset's estimates) or names a file."""
    server: ServerBinary | None = None
    """The llama-server the usual search finds (or the one the request names)."""
    servers: Mapping[str, ServerFacts] = field(default_factory=dict)
    """Binary path -> what it says about itself: each llama-server the decision may choose."""
    measured: Measured = field(default_factory=Measured)
    repack_safe_here: bool = True
    """May llama.cpp repack weights on the CPU the launch runs on (``engine.repack``)."""
    community: CommunityQuants | None = None
    """Smaller quants of the preset's community repos (:func:`gather_community`); None: not asked."""
    asked: tuple[object, ...] = ()
    """What of the request these facts were gathered for (:func:`still_true_for`)."""


def _what_is_read(request: LaunchRequest) -> tuple[object, ...]:
    """The parts of a request that change what :func:`gather_facts` reads (not the context, goal, threads,
    slots or template: those are decided from the same facts)."""
    described_quant = request.quant if request.describe and not request.model else None  # its filter
    return (
        request.model,
        request.repo,
        described_quant,
        request.engine,
        request.llama_server,
        request.rpc,
        request.link,
        request.simulate,
        request.offline,
        request.describe,
        request.spec in SERVER_ONLY_MODES,
    )


def still_true_for(facts: LaunchFacts, request: LaunchRequest) -> bool:
    """Whether ``facts`` answer for ``request`` too: gathered for the same model, files, binaries and machine
    (a later step of the same command asking with another context or speculation mode reuses them)."""
    name = request.preset.name if isinstance(request.preset, Preset) else request.preset
    same_preset = name is None or name == facts.preset.name
    asked = _what_is_read(request)
    if facts.asked[2:3] == (None,):  # every quant was described: they answer for any one quant too
        asked = (*asked[:2], None, *asked[3:])
    return same_preset and facts.asked == asked


def gather_facts(
    request: LaunchRequest,
    *,
    machine: Machine | None = None,
    models: QuantDescriptions | None = None,
    find_binary: Callable[[str | None], ServerBinary | None] | None = None,
    community: CommunityQuants | None = None,
) -> LaunchFacts:
    """Read everything the launch for ``request`` depends on, once. ``machine``: instead of detecting (or the
    request's ``--simulate``); ``models``: quants described already; ``find_binary``: how a llama-server is
    found (``command`` names the one it prints instead of looking); ``community``: community quants read
    already. Raises what reading raises (no such file, a ``--repo`` that cannot be listed)."""
    from clover_local import model_files
    from clover_local.arch_support import installed_support
    from clover_local.engine.repack import repack_safe_here

    preset = model_files.resolve_preset(request.preset, request.model)
    if request.repo and not request.model:
        from clover_local.fetch.repo_preset import repo_preset

        preset = repo_preset(preset, request.repo, request.quant, offline=request.offline)
    machine = machine or model_files.detect(request.simulate, request.rpc, request.link)
    local: LocalModel | None = None
    if request.model:
        path = model_files.checked_gguf(Path(request.model).expanduser())
        local = LocalModel(path, model_files.local_header(path), model_files.local_sidecars(path))
    elif models is None and request.describe:
        from clover_local.fetch.describe import describe_quants

        models = describe_quants(
            preset,
            offline=True if request.offline else None,
            quants=None if request.quant == "auto" else [request.quant],  # an unknown quant: the plan says so
        )
    archs = _architectures(preset, local, models)
    support = _with_latest_release(installed_support(offline=True if request.offline else None), archs)
    checks = _checked(archs, support)
    from clover_local.llamacpp.binary import find_llama_server

    server = (find_binary or find_llama_server)(request.llama_server)
    servers = _ask_servers(request, server, checks)
    return LaunchFacts(
        preset=preset,
        machine=machine,
        support=support,
        checks=checks,
        model=local,
        quants=None if local is not None else models,
        server=server,
        servers=servers,
        measured=_measured(),
        repack_safe_here=repack_safe_here(),
        community=community,
        asked=_what_is_read(request),
    )


def gather_community(request: LaunchRequest, facts: LaunchFacts, plan: Plan) -> LaunchFacts:
    """``facts`` with the quants of the preset's community repos that could fit where ``plan`` (the preset's
    automatic quant) did not (offline: the notes say which repos would be asked)."""
    from clover_local.fetch.community import find_community_quants
    from clover_local.plan.community import weights_room

    found = find_community_quants(
        facts.preset,
        below_bytes=plan.file_bytes,
        room_bytes=weights_room(plan),
        offline=True if request.offline else None,
    )
    archs = {q.description.architecture.arch for q in found.quants} - set(facts.checks)
    support = _with_latest_release(facts.support, archs)
    checks = {**facts.checks, **_checked(archs, support)}
    return replace(facts, community=found, support=support, checks=checks)


def _checked(archs: set[str], support: ArchSupport) -> dict[str, ArchCheck]:
    from clover_local.arch_support import check_architecture

    return {arch: check_architecture(arch, support) for arch in sorted(archs)}


def _architectures(preset: Preset, local: LocalModel | None, models: QuantDescriptions | None) -> set[str]:
    """Every architecture the decision will check: the model's (each quant's) and its sidecars'."""
    if local is not None:
        descs = [local.description, *(d for _, d in local.sidecars.values() if d is not None)]
    elif models is not None:
        descs = [*models.models.values()]
        descs += [d for sc in models.sidecars.values() for _, d in sc.values() if d is not None]
    else:
        return {preset.architecture.arch}
    return {d.architecture.arch for d in descs} | ({preset.architecture.arch} if local is None else set())


def _with_latest_release(support: ArchSupport, archs: set[str]) -> ArchSupport:
    """``support`` with the latest release's answer, read now, when an architecture here is one no llama.cpp
    here knows (the only case that asks it): the decision then reads it from the facts."""
    from clover_local.arch_support import knows_locally, latest_release

    if support.latest is not None or all(knows_locally(a, support) for a in archs):
        return support
    return replace(support, latest=latest_release(support.look_upstream))


def _ask_servers(
    request: LaunchRequest, server: ServerBinary | None, checks: Mapping[str, ArchCheck]
) -> dict[str, ServerFacts]:
    """What each llama-server the decision may choose says about itself: the one found (or named), and the
    installed runtime's that loads the model's architecture. Not asked for a request the embedded engine runs
    by default (no ``--engine``, nothing that needs llama-server), nor under ``--engine embedded``."""
    from clover_local.llamacpp.binary import ServerBinary

    runtimes = {c.runtime: c.server_path for c in checks.values() if c.server_path and c.runtime}
    needs_server = (
        request.engine not in (None, "embedded")
        or bool(request.rpc)
        or request.spec in SERVER_ONLY_MODES
        or any(c.runner == "llama-server" or not c.supported for c in checks.values())
    )
    if request.engine == "embedded" or not needs_server:
        return {}
    binaries: dict[str, tuple[ServerBinary, str | None]] = {}
    if server is not None:
        binaries[str(server.path)] = (server, None)
    for tag, path in runtimes.items():
        binaries.setdefault(str(path), (ServerBinary(Path(path), f"runtime {tag}"), tag))
    return {key: _ask(binary, tag) for key, (binary, tag) in binaries.items()}


def _ask(binary: ServerBinary, runtime: str | None) -> ServerFacts:
    from clover_local import settings
    from clover_local.llamacpp.binary import capabilities, capabilities_from_arg_cpp

    try:
        return ServerFacts(capabilities(binary.path, binary.subcommand))
    except ServerError as exc:
        kept = settings.runtimes_dir() / runtime / "arg.cpp" if runtime else None
        if kept is None or not kept.is_file():
            return ServerFacts(None, Notice("server-unasked", exc.what))
        text = kept.read_text(encoding="utf-8", errors="replace")
        arg_cpp = capabilities_from_arg_cpp(text, runtime or "")
        return ServerFacts(None, Notice("server-unasked", exc.what), arg_cpp, kept)


def _measured() -> Measured:
    return Measured(tuple(load_records()), load_all_spec_ratios(), tuple(load_verify_costs()))
