"""The steps the TUI composes (detect, plan, fetch, engine), behind a few plain functions.

Screens call these from worker threads or for quick pure work. Heavy modules (llama_cpp, huggingface_hub)
are imported inside the functions, so the app paints before any of them load. Nothing here imports Textual.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clover_local.detect.machine import Machine
from clover_local.engine.types import ChatEngine
from clover_local.fetch.describe import QuantDescriptions
from clover_local.fetch.progress import DownloadProgress
from clover_local.gguf.model import ModelDescription
from clover_local.plan.types import Plan, SpeculativePlan, Wishes
from clover_local.presets import Preset
from clover_local.user_prefs import ModelSettings


def detect(simulate: str | None = None, rpc: str | None = None) -> Machine:
    """The real machine, or a described one (``--simulate`` syntax), with the ``--rpc`` workers when given
    (read through the RPC protocol: network I/O, call from a worker)."""
    if rpc:
        from clover_local.plan.report import machine_for

        return machine_for(simulate, rpc)
    if simulate:
        from clover_local.detect import parse_simulate

        return parse_simulate(simulate)
    from clover_local.detect import detect_machine

    return detect_machine()


def describe_models(preset: Preset) -> QuantDescriptions:
    """Exact sizes per quant before downloading (a downloaded file, else the GGUF header read on the Hub with
    range requests, else the preset's estimate, with a note per quant). Network I/O: call from a worker."""
    from clover_local.fetch.describe import describe_quants

    return describe_quants(preset)


def make_plan(
    machine: Machine,
    preset: Preset,
    quant: str,
    ctx: int | None,
    model_path: str | None,
    models: QuantDescriptions | None = None,
) -> Plan:
    """The planner's answer for the person's current choices (pure once headers are read; run per change).

    With ``model_path`` the local GGUF's header gives exact sizes, and its quant is the only candidate; else
    ``models`` (from :func:`describe_models`) gives each quant's sizes, and the preset's estimates fill gaps.
    """
    from clover_local.plan.planner import make_plan as planner

    model = _local_header(model_path, Path(model_path).stat().st_mtime_ns) if model_path else None
    wishes = Wishes(quant="auto" if model_path else quant, ctx=ctx)
    if model is not None or models is None:
        return planner(machine, preset, model, wishes, model_path=model_path)
    from clover_local.plan.report import plan_with_sizes

    return plan_with_sizes(machine, preset, wishes, models)


@functools.lru_cache(maxsize=8)
def _local_header(path: str, mtime_ns: int) -> ModelDescription:
    """A local GGUF's header, read once per file version (a 262k-token vocabulary takes most of a second)."""
    from clover_local.gguf.header import read_local_header

    return read_local_header(Path(path))


def llama_server_command(plan: Plan) -> str:
    """The exact equivalent ``llama-server`` command line, to copy."""
    from clover_local.plan.llama_args import shell_command

    return shell_command(plan)


@dataclass(frozen=True)
class Loaded:
    """What the launch screen shows once the model is up."""

    engine: ChatEngine
    placement: str
    """Where the weights, KV cache and experts went, in words."""
    fallback_message: str | None
    settings_used: dict[str, Any]


def load(
    model_path: str,
    preset: Preset,
    model_settings: ModelSettings,
    plan: Plan | None,
    progress: Callable[[float], None],
) -> Loaded:
    """Load the model as the plan says (or with the person's context when there is no plan)."""
    from clover_local.engine.loader import load_engine

    if plan is not None and plan.rpc_servers:
        return _load_pooled(preset, model_settings, plan)
    if plan is not None:
        from clover_local.plan.llama_args import llama_cpp_kwargs

        settings = dict(llama_cpp_kwargs(plan))
    else:
        settings = {}
    settings["n_ctx"] = model_settings.ctx
    settings["n_threads"] = ui_decode_threads(int(settings.get("n_threads") or _physical_cores()))
    result = load_engine(
        model_path,
        settings,
        chat_template=preset.chat_template,
        sampling=preset.sampling,
        speculative=_speculative(preset, model_settings),
        progress=progress,
    )
    return Loaded(
        engine=result.engine,
        placement=str(result.placement),
        fallback_message=result.fallback_message,
        settings_used=dict(result.settings_used),
    )


def _load_pooled(preset: Preset, model_settings: ModelSettings, plan: Plan) -> Loaded:
    """A plan with workers runs in llama-server (llama-cpp-python's wheel has no RPC backend)."""
    from dataclasses import replace

    from clover_local.detect.units import format_bytes
    from clover_local.serve.engines import choose_engine, open_engine

    opened = open_engine(
        choose_engine("llama-server"),
        replace(plan, ctx=model_settings.ctx),
        preset,
        speculative=model_settings.speculative,
    )
    devices = "; ".join(
        f"{d.name} {format_bytes(d.used_bytes)}" for d in (*plan.memory.gpus, plan.memory.ram)
    )
    placement = (
        f"Pooled with {', '.join(plan.rpc_servers)} over RPC, in llama-server: {devices}; "
        f"predicted ~{plan.predicted_tokens_per_s:.0f} tokens/s"
    )
    return Loaded(
        engine=opened.engine,
        placement=placement,
        fallback_message="; ".join(opened.notices) or None,
        settings_used={},
    )


SMALL_MACHINE_CORES = 4


def ui_decode_threads(planned: int) -> int:
    """Decode threads when the app's own UI thread runs beside the engine.

    On a machine with few cores, llama.cpp's threads spin-wait for each other: if one of them loses its core
    to the UI (rendering streamed text), every token waits. Measured on a 2-core machine: 2 decode threads
    beside the chat were 10x slower than 1. So small machines leave one core to the UI.
    """
    return max(1, planned - 1) if planned <= SMALL_MACHINE_CORES else planned


def _physical_cores() -> int:
    import psutil

    return max(1, psutil.cpu_count(logical=False) or 1)


def _speculative(preset: Preset, model_settings: ModelSettings) -> SpeculativePlan:
    """The preset's self-speculative settings, switched on or off by the person's choice."""
    d = preset.speculative
    return SpeculativePlan(
        enabled=model_settings.speculative, type=d.type, n_match=d.n_match, n_min=d.n_min, n_max=d.n_max
    )


def download(
    preset: Preset,
    quant: str,
    progress: Callable[[DownloadProgress], None],
    cancel: threading.Event,
) -> str:
    """Download (or resume) the GGUF for ``quant``; returns the local path of its first shard."""
    from clover_local.fetch.download import download_model

    return str(download_model(preset, quant, progress=progress, cancel=cancel))
