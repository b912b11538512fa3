"""The values a launch is made of: what the person asked for (:class:`LaunchRequest`), which engine runs it
(:class:`Runner`) and the launch itself (:class:`Launch`): the runner, the plan budgeted for it and the llama.cpp
settings rendered from that plan. :func:`clover_local.decide.decide` makes a launch; nothing changes one after."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from clover_local.llamacpp.server_args import printed_endpoint
from clover_local.plan.diffusion import DiffusionWishes
from clover_local.plan.llama_args import LlamaSettings, hf_args
from clover_local.plan.reasons import Notice
from clover_local.plan.speculation import SERVER_ONLY_MODES, SPEC_MODES, SpecMode
from clover_local.plan.types import EngineKind, Goal, Plan
from clover_local.presets import Preset

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine
    from clover_local.llamacpp.binary import ServerBinary
    from clover_local.llamacpp.load_follow import FollowLoad

__all__ = ["EMBEDDED_DRAFTERS", "ENGINE_WISHES", "EngineWish", "Launch", "LaunchRequest", "Runner"]

EngineWish = Literal["auto", "embedded", "llama-server"]
ENGINE_WISHES: tuple[EngineWish, ...] = ("auto", "embedded", "llama-server")
EMBEDDED_DRAFTERS: frozenset[str] = frozenset(m for m in SPEC_MODES if m not in SERVER_ONLY_MODES)
"""Speculation modes the embedded engine runs itself (n-gram, and the MTP head through ``engine.mtp``)."""


@dataclass(frozen=True)
class LaunchRequest:
    """What the person asked for, from any front end (flags, the app's settings, ``serve``); ``None`` and
    ``auto`` mean "decide for me"."""

    preset: Preset | str | None = None
    """A preset, its name, or the path of a ``.toml``; None: the default one, or the one a ``model`` file's
    name says (``model_files.preset_for_file``)."""
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
    notices: tuple[Notice, ...] = ()
    """What the person should read before loading (why this runner, a re-plan, flags this llama-server lacks)."""
    server_argv: tuple[str, ...] | None = None
    """``settings.argv()`` fitted to the runner's llama-server (its ``--help``): a flag it lacks dropped or
    translated, each change in ``notices``; None when not fitted (the embedded engine, a binary that could not
    be asked: then it is fitted when started)."""
    keeps_slots: bool = False
    """The llama-server can save and restore its slots (``--slot-save-path``, from its ``--help`` when decided;
    True where it was not asked, and starting it asks): a relaunch for another load then keeps them."""
    facts: object = field(default=None, compare=False, repr=False)
    """The ``facts.LaunchFacts`` it was decided from (typed ``object`` here: ``facts`` sits beside this module and
    imports it): a re-plan for less memory decides from them again, reading nothing (``launch.safer_launch``)."""

    @property
    def follow_load(self) -> FollowLoad | None:
        """How a llama-server child follows the machine's load (``llamacpp.load_follow``): started again between
        requests with fewer threads while other programs keep cores busy, up to every physical core. None where
        the threads are fixed: the embedded engine (it follows the load between steps itself) and a ``--threads``
        the person asked for."""
        from clover_local.llamacpp.load_follow import FollowLoad

        if self.runner.kind != "llama-server" or self.request.threads:
            return None
        return FollowLoad(
            max(1, self.machine.cpu.physical_cores, self.plan.threads), self.plan.predicted_tokens_per_s
        )

    @property
    def argv(self) -> list[str]:
        """What llama-server gets (without the binary, host and port)."""
        return list(self.server_argv) if self.server_argv is not None else self.settings.argv()

    @property
    def command(self) -> str:
        """The ``llama-server`` command for this launch, ready to paste (the binary it would run), listening where
        every release listens when told (``server_args.PRINTED_PORT``)."""
        binary = self.runner.binary.command if self.runner.binary is not None else ["llama-server"]
        hf = self.preset.repo if not self.settings.model_path and self.preset.repo else None
        model = hf_args(hf, self.settings.quant) if hf else []
        return shlex.join([*binary, *model, *printed_endpoint(self.argv)])
