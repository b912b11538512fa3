"""The plan next to llama.cpp's own fit: run ``llama-fit-params`` for the same model and context and show what
it would choose (GPU layers, tensor overrides / experts kept in RAM, context) beside the plan's choice.

``llama-fit-params`` prints the fitted flags on one stdout line (``-c N -ngl N [-ts a,b] [-ot "..."]``);
this module runs it, parses that line and lines the two up. A difference is not an error: the plan also
weighs speed and quality; the comparison shows where the two memory models disagree.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clover_local.engine.repack import common_argv_here
from clover_local.errors import CloverError, ServerError
from clover_local.llamacpp.binary import capabilities, find_llama_server
from clover_local.llamacpp.server_args import split_flags

if TYPE_CHECKING:
    from clover_local.plan.types import Plan
    from clover_local.presets import Preset

_EXPERT_LAYER_RE = re.compile(r"blk\\?\.\(?(\d+)\)?\\?\..*exps.*=(\S+)")
_ALWAYS = {"-m", "-c"}
"""The model file and the context: what llama-fit-params fits."""
_PASS_THROUGH = {
    "-fa",
    "--flash-attn",
    "-ctk",
    "--cache-type-k",
    "-ctv",
    "--cache-type-v",
    "-b",
    "-ub",
    "-np",
}
"""Plan flags that change the memory llama-fit-params must find room for; placement flags are left out so
that it makes its own choice."""


@dataclass(frozen=True)
class FitChoice:
    """What ``llama-fit-params`` chose."""

    ctx: int
    n_gpu_layers: int
    tensor_split: tuple[float, ...]
    overrides: tuple[str, ...]
    """``<regex>=<buffer type>`` entries, e.g. ``blk\\.14\\.ffn_(up|down|gate)_(ch|)exps=CPU``."""
    raw: str

    @property
    def expert_layers_on_cpu(self) -> tuple[int, ...]:
        """Layers whose routed experts stay in RAM (overrides to ``CPU``)."""
        layers: list[int] = []
        for entry in self.overrides:
            m = _EXPERT_LAYER_RE.search(entry)
            if m and m.group(2).upper().startswith("CPU"):
                layers.append(int(m.group(1)))
        return tuple(sorted(set(layers)))


@dataclass(frozen=True)
class FitComparison:
    fit: FitChoice
    rows: tuple[tuple[str, str, str], ...]
    """(setting, plan, llama-fit-params) per line of the table."""
    differences: tuple[str, ...]


def parse_fit_output(stdout: str) -> FitChoice:
    """The fitted flags line (the last line starting with ``-c``) as a :class:`FitChoice`."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip().startswith("-c ")]
    if not lines:
        raise ServerError("llama-fit-params printed no fitted flags.")
    line = lines[-1]
    values = dict(split_flags(shlex.split(line)))
    try:
        ctx = int(values.get("-c") or 0)
        ngl = int(values.get("-ngl") or 0)
        split = tuple(float(x) for x in (values.get("-ts") or "").split(",") if x)
    except ValueError:
        raise ServerError(f"Cannot read llama-fit-params' output: {line!r}.") from None
    overrides = tuple(x for x in (values.get("-ot") or "").split(",") if x)
    return FitChoice(ctx=ctx, n_gpu_layers=ngl, tensor_split=split, overrides=overrides, raw=line)


def fit_args(plan: Plan, fit_binary: Path) -> list[str]:
    """llama-fit-params' argv for the plan's model and context (plus the flags that change memory use)."""
    if not plan.model_path:
        raise ServerError("The plan has no local model file to fit.", "Pass --model PATH.")
    from clover_local.plan.llama_args import llama_server_args

    caps = capabilities(fit_binary)
    argv: list[str] = []
    for flag, value in split_flags(llama_server_args(plan)):
        if flag in _ALWAYS or (flag in _PASS_THROUGH and caps.supports(flag)):
            argv += [flag] if value is None else [flag, value]
    return argv


def run_fit_params(plan: Plan, fit_binary: Path, timeout_s: float = 300.0) -> FitChoice:
    """Run ``llama-fit-params`` for the plan's model and context."""
    argv = common_argv_here([str(fit_binary), *fit_args(plan, fit_binary)])
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ServerError(f"Running llama-fit-params failed: {exc}.") from None
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise ServerError(f"llama-fit-params could not fit {Path(plan.model_path or '').name}:\n{tail}")
    return parse_fit_output(proc.stdout)


def compare(plan: Plan, fit: FitChoice, n_layers: int | None = None) -> FitComparison:
    """The plan and llama.cpp's fit side by side, with a sentence per difference."""
    plan_all, fit_all = (
        n < 0 or (n_layers is not None and n > n_layers) for n in (plan.n_gpu_layers, fit.n_gpu_layers)
    )
    plan_gpu = "all" if plan.n_gpu_layers < 0 else str(plan.n_gpu_layers)
    fit_gpu = f"all ({fit.n_gpu_layers})" if fit_all else str(fit.n_gpu_layers)
    cpu_only = plan.backend == "cpu"
    if cpu_only:
        plan_gpu, fit_gpu = f"{plan_gpu} (no GPU)", f"{fit_gpu} (no GPU)"
    cpu_layers = fit.expert_layers_on_cpu
    fit_experts = _layers_text(cpu_layers)
    plan_experts = f"first {plan.n_cpu_moe} layers" if plan.n_cpu_moe else "none"
    rows = (
        ("context", str(plan.ctx), str(fit.ctx)),
        ("GPU layers", plan_gpu, fit_gpu),
        ("experts in RAM", plan_experts, fit_experts),
        ("tensor split", _split_text(plan.tensor_split), _split_text(fit.tensor_split)),
    )
    differences: list[str] = []
    if fit.ctx != plan.ctx:
        differences.append(f"llama.cpp would run a {fit.ctx}-token context, the plan {plan.ctx}.")
    if not cpu_only and plan.n_gpu_layers != fit.n_gpu_layers and not (plan_all and fit_all):
        differences.append(f"GPU layers differ: plan {plan_gpu}, llama.cpp {fit_gpu}.")
    if len(cpu_layers) != plan.n_cpu_moe:
        differences.append(
            f"Experts kept in RAM: the plan keeps {plan.n_cpu_moe} layers' worth, llama.cpp {len(cpu_layers)}."
        )
    return FitComparison(fit, rows, tuple(differences))


def describe(comparison: FitComparison) -> list[str]:
    """Text lines: a three-column table, then the differences (or that there are none)."""
    header = ("setting", "plan", "llama-fit-params")
    rows = (header, *comparison.rows)
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(widths[i]) for i, cell in enumerate(r)).rstrip() for r in rows]
    lines.append("")
    lines += comparison.differences or ["The plan and llama.cpp's own fit agree."]
    lines.append(f"llama-fit-params said: {comparison.fit.raw}")
    return lines


def _layers_text(layers: tuple[int, ...]) -> str:
    if not layers:
        return "none"
    if layers == tuple(range(layers[0], layers[-1] + 1)):
        return f"{len(layers)} layers ({layers[0]}-{layers[-1]})"
    return f"{len(layers)} layers"


def _split_text(split: tuple[float, ...]) -> str:
    return ",".join(f"{s:g}" for s in split) if len(split) > 1 else "-"


def fit_params_binary() -> Path | None:
    """``llama-fit-params`` next to the llama-server clover-local would use (built or configured), else on
    PATH; None when there is none."""
    server = find_llama_server()
    if server is not None:
        return server.sibling("llama-fit-params")
    found = shutil.which("llama-fit-params")
    return Path(found) if found else None


def compare_fit(
    plan: Plan, preset: Preset, *, simulated: bool = False, binary: Path | None = None
) -> dict[str, Any]:
    """The one comparison of a plan with llama.cpp's own fit (``plan --compare-fit``, ``doctor``): run
    ``llama-fit-params`` (``binary``, else :func:`fit_params_binary`) for the plan's model file and context and
    line its choice up with the plan's; ``{"shown": False, "why": ...}`` when it cannot be run or fails."""
    if simulated:
        return _not_shown(
            "--simulate describes another machine, while llama-fit-params fits the devices of this one."
        )
    if plan.model_path is None:
        return _not_shown(
            f"llama-fit-params reads the model file, and {preset.display_name} {plan.quant} is not on this "
            f"machine: download it (`clover-local download --preset {preset.name} --quant {plan.quant}`) "
            "or pass --model PATH."
        )
    try:
        binary = binary or fit_params_binary()
        if binary is None:
            return _not_shown(
                "no llama-fit-params binary: scripts/build-llama-server builds it next to llama-server "
                "(or put llama.cpp's on PATH)."
            )
        fit = run_fit_params(plan, binary)
    except CloverError as exc:
        return _not_shown(str(exc))
    comparison = compare(plan, fit, preset.architecture.n_layers)
    return {
        "shown": True,
        "binary": str(binary),
        "rows": [list(row) for row in comparison.rows],
        "differences": list(comparison.differences),
        "raw": fit.raw,
        "text": describe(comparison),
    }


def _not_shown(why: str) -> dict[str, Any]:
    return {"shown": False, "why": why}
