"""Loading a GGUF into the embedded engine exactly as a plan's settings say, with clear errors for files llama.cpp
cannot read. Running out of memory raises :class:`OutOfMemoryError`: the launch plans again for less memory
(``launch.safer_launch``), so nothing here rewrites settings.

``settings`` is the dict ``clover_local.plan.llama_args.llama_cpp_kwargs(plan)`` returns (``llama_cpp.Llama``
keyword names plus ``tensor_buft_overrides``); tests and scripts can pass one directly.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from clover_local.engine.embedded import EmbeddedEngine, EngineParts
from clover_local.engine.load_log import says_out_of_memory
from clover_local.engine.templates import TemplateChoice
from clover_local.errors import EngineError, OutOfMemoryError
from clover_local.plan.diffusion import DiffusionPlan
from clover_local.plan.memory import rollback_snapshots
from clover_local.plan.reasons import Notice
from clover_local.plan.types import SpeculativePlan
from clover_local.plan.verify_cost import batch_costs
from clover_local.presets import SamplingDefaults

_UNKNOWN_ARCH_RE = re.compile(r"unknown model architecture: '([^']*)'")


@dataclass(frozen=True)
class LoadResult:
    engine: EmbeddedEngine
    """A :class:`~clover_local.engine.diffusion_engine.DiffusionEngine` for diffusion models."""
    settings_used: dict[str, Any]
    placement: str
    """Where things went, from llama.cpp's load log (weights, KV cache, overridden tensors, GPU layers)."""
    notices: tuple[Notice, ...] = ()
    """Other things the person should know (e.g. no chat template in the GGUF, speculation off)."""
    load_log: tuple[str, ...] = ()
    """llama.cpp's log lines while loading the model and creating the context (all levels)."""


def load_engine(
    model_path: str | Path,
    settings: dict[str, Any],
    *,
    chat_template: str | TemplateChoice = "gguf",
    sampling: SamplingDefaults | None = None,
    speculative: SpeculativePlan | None = None,
    progress: Callable[[float], None] | None = None,
    diffusion: DiffusionPlan | None = None,
) -> LoadResult:
    """Load ``model_path`` with ``settings`` (:class:`OutOfMemoryError` when memory runs out), chatting with
    ``chat_template`` as the launch chose it (a name: chosen here against the GGUF's own).

    A diffusion model is decoded as ``diffusion`` says (None: the defaults for its header); its context is
    sized to the canvas (n_ctx = n_batch = n_ubatch)."""
    from llama_cpp import llama_cpp as C

    from clover_local.engine import native, templates

    path = Path(model_path).expanduser()
    _check_file(path)
    settings = dict(settings)
    speculative = speculative if speculative is not None else SpeculativePlan(enabled=True)
    if not speculative.batch_costs:
        # No plan's cost model (a file loaded with bare settings): the linear one for where the layers run.
        on_gpu = int(settings.get("n_gpu_layers", 0)) != 0
        costs = batch_costs(n_max_batch=speculative.n_max + 1, on_gpu=on_gpu)
        speculative = replace(speculative, batch_costs=costs)
    C.llama_backend_init()
    params = native.build_params(settings)
    mtp_on = speculative.enabled and speculative.mode == "mtp"
    if mtp_on and speculative.head == "embedded":
        params.model.load_mtp = True  # the head's blocks are skipped unless asked for
    if progress is not None:

        @C.llama_progress_callback
        def _on_progress(value: float, _user: ctypes.c_void_p) -> bool:
            progress(float(value))
            return True

        params.keep_alive.append(_on_progress)
        params.model.progress_callback = _on_progress

    with native.LogCapture() as log:
        model = C.llama_model_load_from_file(str(path).encode(), params.model)
    if not model:
        raise _load_error(path, log.text, "load the model")
    try:
        is_diffusion = bool(C.llama_model_is_diffusion(model))
        if is_diffusion:
            diffusion = diffusion or _default_diffusion_plan(path, settings)
            params.context.n_ctx = params.context.n_batch = params.context.n_ubatch = diffusion.canvas
        elif diffusion is not None:
            raise EngineError(
                f"{path.name} is not a diffusion model: diffusion decoding was asked for a model llama.cpp "
                "decodes left to right.",
                'Drop the diffusion options (or `decoding = "diffusion"` in the preset) for this model.',
            )
        recurrent = bool(C.llama_model_is_recurrent(model) or C.llama_model_is_hybrid(model))
        _check_speculation_settings(path, settings, speculative, recurrent=recurrent)
        with native.LogCapture() as ctx_log:
            ctx = C.llama_init_from_model(model, params.context)
        if not ctx:
            raise _load_error(path, ctx_log.text, "create the context")
        mtp = None
        if mtp_on:
            from clover_local.engine.mtp import open_mtp_head

            sidecar = speculative.sidecar if speculative.head == "sidecar" else None
            with native.LogCapture() as mtp_log:
                mtp = open_mtp_head(
                    model, ctx, params.model, params.context, sidecar, speculative.draft_n_max
                )
            ctx_log.lines.extend(mtp_log.lines)
        choice = (  # as the launch chose it, else from the GGUF's own
            chat_template
            if isinstance(chat_template, TemplateChoice)
            else templates.choose_template(
                chat_template, templates.gguf_chat_template(model), templates.builtin_template_names()
            )
        )
    except BaseException:
        C.llama_model_free(model)
        raise
    notices = [Notice("chat-template", choice.notice)] if choice.notice else []
    parts = EngineParts(
        model=model,
        ctx=ctx,
        model_name=_model_name(model, path),
        template=choice,
        sampling=sampling or SamplingDefaults(),
        speculative=speculative,
        recurrent=recurrent,
        backend_sampling=bool(settings["backend_sampling"]),  # plan.llama_args._engine_rows
        keep_alive=params.keep_alive,
        notices=notices,
        ctx_checkpoints=int(settings.get("ctx_checkpoints", 0)),
        mtp=mtp,
    )
    if is_diffusion:
        from clover_local.engine.diffusion_engine import DiffusionEngine

        assert diffusion is not None
        engine: EmbeddedEngine = DiffusionEngine(parts, diffusion)
    else:
        engine = EmbeddedEngine(parts)
    used = dict(settings)
    used["n_ctx"] = engine.n_ctx
    if is_diffusion:
        used["n_batch"] = used["n_ubatch"] = engine.n_ctx
    return LoadResult(
        engine=engine,
        settings_used=used,
        placement=placement_summary(log.lines + ctx_log.lines),
        notices=tuple(notices),
        load_log=tuple(log.lines + ctx_log.lines),
    )


def _check_file(path: Path) -> None:
    if not path.exists():
        raise EngineError(f"Model file {path} does not exist.", "Download it first (clover-local download).")
    if not path.is_file():
        raise EngineError(f"{path} is not a file.")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise EngineError(
            f"{path} is not a GGUF file (it starts with {magic!r}, not b'GGUF').",
            "Check the path, or download the model again.",
        )


def _check_speculation_settings(
    path: Path, settings: dict[str, Any], speculative: SpeculativePlan, *, recurrent: bool
) -> None:
    """Refuse settings that cannot hold the speculation asked for, rather than change them here: the settings
    producer (``plan.llama_args``) sizes them from the plan, and the command shown must be what loads."""
    if not speculative.enabled:
        return
    needs = {"n_outputs_max_per_seq": speculative.n_max + 1}  # one output per verified token
    if recurrent and rollback_snapshots(speculative):  # a snapshot per drafted token, the batch in one ubatch
        needs |= {"n_rs_seq": rollback_snapshots(speculative), "n_ubatch": speculative.n_max + 2}
    short = [
        f"{key} {settings[key]} (needs {need})" for key, need in needs.items() if int(settings[key]) < need
    ]
    if short:
        kind = "a recurrent or hybrid model" if recurrent else "a model"
        raise EngineError(
            f"The settings for {path.name} cannot hold speculation up to {speculative.n_max} tokens on {kind}: "
            f"{', '.join(short)}.",
            "Build the settings from the plan (plan.llama_args.llama_settings) with the same speculation; a plan "
            "made for the file knows whether its model is recurrent.",
        )


def _default_diffusion_plan(path: Path, settings: dict[str, Any]) -> DiffusionPlan:
    """The header's defaults, the canvas as large as the settings' context (at most the default canvas: every
    step returns the logits of the whole canvas)."""
    from clover_local.gguf.header import read_local_header
    from clover_local.plan.diffusion import DEFAULT_CANVAS, plan_diffusion

    ctx = min(int(settings.get("n_ctx") or DEFAULT_CANVAS), DEFAULT_CANVAS)
    plan, _reasons = plan_diffusion(read_local_header(path), ctx=ctx)
    return plan


def _load_error(path: Path, log_text: str, step: str) -> EngineError:
    """Turn a failed load into an error a person can act on, using llama.cpp's log."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    detail = errors[-1] if errors else (lines[-1] if lines else "no details in the log")
    arch = _UNKNOWN_ARCH_RE.search(log_text)
    if arch:
        return EngineError(
            f"{path.name} uses the model architecture {arch.group(1)!r}, which this llama.cpp does not know.",
            "Update llama-cpp-python, or use the upstream llama-server backend.",
        )
    if says_out_of_memory(log_text):
        return OutOfMemoryError(f"not enough memory to {step}: {detail}")
    if step != "load the model":
        return EngineError(
            f"llama.cpp could not {step} for {path.name}: {detail}.",
            "Check the settings (context size, batch sizes, cache types) or run `clover-local plan`.",
        )
    return EngineError(
        f"llama.cpp could not {step} from {path.name}: the file looks corrupt or truncated ({detail}).",
        "Verify the file (clover-local verify) or download it again.",
    )


_BUFFER_RE = re.compile(r"(\S+) (model|KV|compute|RS) buffer size\s*=\s*([\d.]+) MiB")
_OFFLOAD_RE = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")


def placement_summary(lines: list[str]) -> str:
    """A one-line human summary of where llama.cpp put weights, caches and overridden tensors."""
    parts: list[str] = []
    sizes: dict[str, dict[str, float]] = {}
    offloaded = None
    for line in lines:
        for m in _BUFFER_RE.finditer(line):
            sizes.setdefault(m.group(2), {}).setdefault(m.group(1), 0.0)
            sizes[m.group(2)][m.group(1)] += float(m.group(3))
        offload = _OFFLOAD_RE.search(line)
        if offload:
            offloaded = f"{offload.group(1)}/{offload.group(2)} layers on GPU"
    overridden = sum("buffer type overridden to" in line for line in lines)
    names = {"model": "weights", "KV": "KV cache", "RS": "recurrent state", "compute": "compute"}
    for kind in ("model", "KV", "RS", "compute"):
        if kind in sizes:
            where = ", ".join(f"{dev} {mib:.0f} MiB" for dev, mib in sizes[kind].items())
            parts.append(f"{names[kind]}: {where}")
    if offloaded:
        parts.append(offloaded)
    if overridden:
        parts.append(f"{overridden} expert tensors kept in RAM by override")
    return "; ".join(parts) or "no placement details in llama.cpp's log"


def _model_name(model: Any, path: Path) -> str:
    from llama_cpp import llama_cpp as C

    buf = ctypes.create_string_buffer(256)
    n = C.llama_model_meta_val_str(model, b"general.name", buf, len(buf))
    return buf.value.decode("utf-8", errors="replace") if n > 0 else path.stem
