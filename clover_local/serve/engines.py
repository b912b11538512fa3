"""Open the engine a plan asks for: the embedded llama-cpp-python one, or an upstream ``llama-server``.

``choose_engine("auto")`` picks llama-server when one is found (upstream builds have every backend and the
newest kernels), else the embedded engine, and says why. ``serve``, ``bench`` and the TUI share this.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from clover_local.engine.types import ChatEngine
from clover_local.errors import ServerError, UsageError
from clover_local.llamacpp.binary import ServerBinary, find_llama_server

if TYPE_CHECKING:
    from clover_local.plan.types import Plan
    from clover_local.presets import Preset

EngineKind = Literal["embedded", "llama-server"]
ENGINE_CHOICES = ("auto", "embedded", "llama-server")


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


def choose_engine(wanted: str, configured_binary: str | None = None) -> EngineChoice:
    """Which engine to run and why; ``wanted`` is ``auto``, ``embedded`` or ``llama-server``."""
    if wanted not in ENGINE_CHOICES:
        raise UsageError(f"--engine {wanted!r} is not one of {', '.join(ENGINE_CHOICES)}.")
    if wanted == "embedded":
        return EngineChoice("embedded", "asked for with --engine embedded")
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


def open_engine(
    choice: EngineChoice,
    plan: Plan,
    preset: Preset,
    *,
    speculative: bool | None = None,
    on_log: Callable[[str], None] | None = None,
    ready_timeout_s: float = 600.0,
) -> OpenedEngine:
    """Load the model as the plan says, in the chosen engine. ``speculative`` overrides the plan's choice."""
    if not plan.model_path:
        raise UsageError(
            "No local model file to serve.",
            "Download it first (clover-local download), or pass --model PATH.",
        )
    if plan.rpc_servers and choice.kind == "embedded":
        raise UsageError(
            f"The plan pools other machines' devices (--rpc {','.join(plan.rpc_servers)}), but the embedded engine "
            "(llama-cpp-python's wheel) has no RPC backend.",
            "Use --engine llama-server (scripts/build-llama-server builds one with RPC), or drop --rpc.",
        )
    if speculative is not None and speculative != plan.speculative.enabled:
        plan = replace(plan, speculative=replace(plan.speculative, enabled=speculative))
    if choice.kind == "embedded":
        from clover_local.engine.loader import load_engine
        from clover_local.plan.llama_args import llama_cpp_kwargs

        result = load_engine(
            plan.model_path,
            llama_cpp_kwargs(plan),
            chat_template=plan.chat_template,
            sampling=preset.sampling,
            speculative=plan.speculative,
        )
        notices = list(result.notices)
        if result.fallback_message:
            notices.insert(0, result.fallback_message)
        return OpenedEngine(result.engine, "embedded", tuple(notices))

    from clover_local.llamacpp.server import plan_server_argv, start_llama_server
    from clover_local.llamacpp.server_engine import LlamaServerEngine

    process = start_llama_server(
        plan_server_argv(plan), binary=choice.binary, on_log=on_log, ready_timeout_s=ready_timeout_s
    )
    engine = LlamaServerEngine(process, model_name=preset.name, sampling=preset.sampling)
    return OpenedEngine(engine, "llama-server", process.warnings)
