"""How each kind of contender gets ready to answer: a local model found (a preset's file, a ``.gguf``) or
fetched (a preset not downloaded yet, an ``hf:`` repo: its architecture checked before any byte comes), planned
for this machine and loaded through ``launch.open_launch``; an endpoint reached, with its key read from the
environment variable the person named."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from clover_local.compare.contenders import Contender
from clover_local.compare.options import CompareOptions, OpenedContender, Progress
from clover_local.errors import PlanError, UsageError

if TYPE_CHECKING:
    from clover_local.detect.machine import Machine
    from clover_local.fetch.progress import DownloadProgress
    from clover_local.presets import Preset

DEFAULT_HF_QUANT = "Q4_K_M"
"""An ``hf:`` repo's quant when none is given and the Hub cannot be asked which fits."""


def open_contender(
    contender: Contender,
    options: CompareOptions,
    machine: Machine | None,
    progress: Callable[[Progress], None],
) -> OpenedContender:
    if contender.kind == "endpoint":
        return open_endpoint(contender, options)
    return open_local(contender, options, machine, progress)


def endpoint_key(options: CompareOptions) -> str | None:
    """The key in the variable ``--key-env`` names (None without one); a :class:`UsageError` when it is unset."""
    if not options.key_env:
        return None
    key = os.environ.get(options.key_env)
    if not key:
        # The name is said only when it reads as one: a key given by mistake is not printed.
        name = options.key_env if re.fullmatch(r"[A-Z][A-Z0-9_]{0,39}", options.key_env) else "VAR"
        raise UsageError(
            f"--key-env {name}: that environment variable is not set.",
            f"export {name}=... before running compare (the key itself is never an option).",
        )
    return key


def open_endpoint(contender: Contender, options: CompareOptions) -> OpenedContender:
    from clover_local.compare.endpoint import EndpointEngine

    assert contender.model is not None
    engine = EndpointEngine(contender.target, contender.model, endpoint_key(options))
    engine.probe()
    return OpenedContender(engine, engine.close, description=f"{contender.model} at {contender.target}")


def local_model(
    contender: Contender, machine: Machine | None, progress: Callable[[Progress], None]
) -> tuple[Preset | None, Path]:
    """The contender's preset (None for a bare file or repo: the file's name picks one) and its local GGUF,
    downloaded first when it is not here yet."""
    from clover_local import model_files

    if contender.kind == "gguf":
        return None, model_files.checked_gguf(Path(contender.target).expanduser())
    if contender.kind == "hf":
        return None, _fetch_repo(contender, machine, progress)
    from clover_local.presets import load_preset

    preset = load_preset(contender.target)
    found = model_files.find_model(preset)
    if found is not None:
        return preset, found
    from clover_local.fetch.download import download_model
    from clover_local.launch import LaunchRequest, decide_launch

    quant = decide_launch(LaunchRequest(preset), machine=machine).plan.quant  # the quant planned for here
    return preset, download_model(preset, quant, progress=_download_progress(contender, progress))


def _fetch_repo(contender: Contender, machine: Machine | None, progress: Callable[[Progress], None]) -> Path:
    from clover_local.fetch.download import check_architectures, fetch_resolved, resolve_quant_files

    quant = contender.quant or planned_quant(contender.target, machine)
    resolved = resolve_quant_files(contender.target, quant, drafts=False)
    resolved = check_architectures(resolved)  # refused here, before any byte, when nothing here can run it
    return fetch_resolved(resolved, progress=_download_progress(contender, progress))


def planned_quant(repo: str, machine: Machine | None) -> str:
    """The quant of ``repo`` the planner picks for this machine, as it picks Clover's: each quant the repo has
    weighed with its exact sizes from its GGUF header on the Hub (``launch.decide_launch`` on a preset made
    for the repo, which also refuses an architecture nothing here runs, before any download). Offline, or
    with the Hub unreachable, :data:`DEFAULT_HF_QUANT`."""
    from clover_local.errors import DownloadError, HubUnreachableError
    from clover_local.fetch import hub
    from clover_local.fetch.quants import is_model_gguf, quant_of
    from clover_local.fetch.remote_header import read_remote_header
    from clover_local.launch import LaunchRequest, decide_launch
    from clover_local.presets import Preset, QuantSpec
    from clover_local.settings import hf_offline

    if hf_offline():
        return DEFAULT_HF_QUANT
    try:
        listing = hub.list_repo(repo, "main")
    except HubUnreachableError:
        return DEFAULT_HF_QUANT
    sizes: dict[str, int] = {}
    first: dict[str, str] = {}
    for entry in listing.entries:
        quant = quant_of(entry.path) if is_model_gguf(entry.path) else None
        if quant:
            sizes[quant] = sizes.get(quant, 0) + entry.size
            first.setdefault(quant, entry.path)
    if not sizes:
        raise DownloadError(f"{repo} has no GGUF files.", "Check the repo name (hf:OWNER/REPO[:QUANT]).")
    if len(sizes) == 1:
        return next(iter(sizes))
    some = min(sizes, key=lambda q: sizes[q])
    arch = read_remote_header(repo, first[some]).architecture
    preset = Preset(
        name=repo.split("/")[-1],
        display_name=repo,
        repo=repo,
        quants={q: QuantSpec(q, q, n) for q, n in sorted(sizes.items(), key=lambda item: item[1])},
        architecture=arch,
        ctx_default=min(4096, arch.n_ctx_train or 4096),
        ctx_max=arch.n_ctx_train or 4096,
    )
    return decide_launch(LaunchRequest(preset), machine=machine).plan.quant


def _download_progress(
    contender: Contender, progress: Callable[[Progress], None]
) -> Callable[[DownloadProgress], None]:
    from clover_local.fetch.progress import status_line

    return lambda p: progress(Progress("downloading", contender.name, message=status_line(p)))


def open_local(
    contender: Contender,
    options: CompareOptions,
    machine: Machine | None,
    progress: Callable[[Progress], None],
) -> OpenedContender:
    """The contender planned for this machine (its own plan) and loaded through ``open_launch``; a plan that
    does not fit is refused before loading (it would swap, and its times would say nothing)."""
    from clover_local.launch import LaunchRequest, decide_launch, open_launch
    from clover_local.plan.reasons import find_reason

    preset, path = local_model(contender, machine, progress)
    request = LaunchRequest(preset, str(path), ctx=options.ctx, engine=options.engine)  # type: ignore[arg-type]
    launch = decide_launch(request, machine=machine)
    if not launch.plan.fits:
        advice = find_reason(launch.plan.reasons, "does-not-fit")
        why = advice.text if advice else ""
        raise PlanError(
            f"{contender.name} does not fit this machine{': ' + why if why else '.'}",
            "Compare a smaller quant or model, or give a smaller --ctx.",
        )
    opened = open_launch(launch)
    pid = opened.engine.runner_pid or os.getpid()
    plan = opened.launch.plan
    description = f"{opened.kind}: {Path(plan.model_path or path).name} {plan.quant}, ctx {plan.ctx}"
    return OpenedContender(
        opened.engine,
        opened.engine.close,
        holder_pid=pid,
        in_process=opened.kind == "embedded",
        description=description,
        notices=opened.notices,
    )


def check_contenders(contenders: list[Contender], options: CompareOptions) -> None:
    """What can be checked before any model loads: each preset exists, each file is a GGUF, the endpoints'
    key variable is set. (Downloads, plans and endpoints are each contender's own turn: one that fails there
    is an error for it alone.)"""
    from clover_local import model_files
    from clover_local.presets import load_preset

    for c in contenders:
        if c.kind == "preset":
            load_preset(c.target)
        elif c.kind == "gguf":
            model_files.checked_gguf(Path(c.target).expanduser())
    if any(c.kind == "endpoint" for c in contenders):
        endpoint_key(options)
