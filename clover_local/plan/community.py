"""A smaller quant that fits, from the model's community GGUF repos (a preset's ``[[community]]``), where the plan's
own quants do not fit well. Pure: the repos' listings and headers come in as :class:`CommunityQuants`, read by
``fetch.community``; this module decides which quants are worth a header read (:func:`shortlist`) and which one
to name (:func:`choose_community_quant`).

The choice: among the quants whose plan on this machine fits, the best in llama.cpp's quality order of quant
types (:mod:`clover_local.plan.quant_order`), the faster one between equals; the reason says what each quant
weighed did (fits, does not fit, lower quality), its memory, its predicted speed, and the command that gets it.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from clover_local.detect.units import format_bytes as fb
from clover_local.gguf.model import ModelDescription, describe_from_preset
from clover_local.plan.fit import placement_words
from clover_local.plan.quant_order import quality_rank
from clover_local.plan.reasons import Reason
from clover_local.plan.speed import format_tokens_per_s
from clover_local.plan.types import CommunityPick, Plan
from clover_local.presets import Preset, QuantSpec

__all__ = [
    "HEADERS_PER_REPO",
    "CommunityQuant",
    "CommunityQuants",
    "as_repo_preset",
    "choose_community_quant",
    "download_command",
    "from_listings",
    "shortlist",
    "weights_room",
]

HEADERS_PER_REPO = 3
"""Headers read per repo (a few MB each): the best quants by quality that might fit, by their listed size."""


@dataclass(frozen=True)
class CommunityQuant:
    """One quant of a community repo, described."""

    repo: str
    quant: str
    files: tuple[str, ...]
    """Its file, or its shards in order."""
    description: ModelDescription
    """From its GGUF header (exact), else the base preset's shape at the listed size (an estimate)."""
    source: str
    """Where ``description``'s sizes came from, in words."""
    pattern: str | None = None
    """What ``--quant`` takes to get it; None: the repo's one model file (``--repo`` alone)."""
    quality: str = ""
    """What its publisher says it costs in quality, in their words (the preset keeps them)."""


@dataclass(frozen=True)
class CommunityQuants:
    """What the community repos were asked, and what they answered."""

    repos: tuple[str, ...]
    """The repos a smaller quant is looked for in (the preset's ``[[community]]``)."""
    quants: tuple[CommunityQuant, ...] = ()
    notes: tuple[str, ...] = ()
    """A sentence per repo that could not be asked or listed (offline: which ones would be)."""


def weights_room(plan: Plan) -> int:
    """The most bytes of weights this machine could hold beside what ``plan`` needs besides weights (its KV
    cache, compute buffers, recurrent state, runtime), all devices together, margins kept: a quant whose files
    are larger cannot fit, so its header is not worth reading."""
    room = 0
    for d in (*plan.memory.gpus, plan.memory.ram):
        room += d.capacity_bytes - d.margin_bytes - (d.used_bytes - d.weights_bytes)
    return max(room, 0)


def shortlist(
    listed: Mapping[str, int], below_bytes: int, room_bytes: int, per_repo: int = HEADERS_PER_REPO
) -> list[str]:
    """The quants of one repo (name -> listed bytes) whose headers are worth reading: smaller than the quant
    that did not fit (``below_bytes``) and no larger than :func:`weights_room`, best quality first (then the
    largest: more bits), at most ``per_repo``."""
    fitting = [q for q, size in listed.items() if size < below_bytes and size <= room_bytes]
    return sorted(fitting, key=lambda q: _quality_key(q, listed[q]))[:per_repo]


def _quality_key(quant: str, file_bytes: int) -> tuple[float, int]:
    """Best first: llama.cpp's quality order, names it does not rank after all it does, larger before smaller."""
    rank = quality_rank(quant)
    return (rank if rank is not None else float("inf"), -file_bytes)


def download_command(repo: str, pattern: str | None) -> str:
    """The one command that gets a community quant (``pattern`` None: the repo's one model file)."""
    quant = ["--quant", pattern] if pattern else []
    return shlex.join(["clover-local", "download", "--repo", repo, *quant])


def from_listings(preset: Preset, below_bytes: int, room_bytes: int) -> tuple[CommunityQuant, ...]:
    """The quants the preset's ``[[community]]`` tables list with their sizes (the publishers' pages, read by
    people) that are worth weighing where a quant of ``below_bytes`` did not fit and at most ``room_bytes`` of
    weights could (:func:`shortlist`): described from the base preset's shape at the listed size, as the
    preset's own quants are offline."""
    out: list[CommunityQuant] = []
    for c in preset.community:
        listed = {q.quant: q for q in c.quants}
        for name in shortlist({q: e.bytes for q, e in listed.items()}, below_bytes, room_bytes):
            e = listed[name]
            shape = replace(preset, quants={name: QuantSpec(name, e.pattern or name, e.bytes)})
            source = f"estimated from the size its page lists ({c.confirmed}); its header is read before any download"
            described = describe_from_preset(shape, name, e.bytes)
            out.append(CommunityQuant(c.repo, name, (), described, source, e.pattern, e.quality))
    return tuple(out)


def as_repo_preset(preset: Preset, q: CommunityQuant) -> Preset:
    """``preset`` for the repo of ``q``, offering that one quant (as ``--repo R --quant Q`` makes it)."""
    return replace(
        preset,
        repo=q.repo,
        display_name=f"{preset.display_name} ({q.repo})",
        quants={q.quant: QuantSpec(q.quant, q.pattern or q.quant, q.description.file_bytes)},
        default_quant="auto",
        python_package=None,
        python_package_file=None,
    )


def choose_community_quant(
    found: CommunityQuants, plan_for: Callable[[CommunityQuant], Plan]
) -> tuple[CommunityPick | None, tuple[Reason, ...]]:
    """The best community quant whose plan fits (``plan_for``: the launch's plan of one quant, for the runner
    that would run it), and the reasons to add to the plan that did not fit (what was weighed, or why nothing
    was: offline, unreachable)."""
    notes = tuple(Reason("community", note) for note in found.notes)
    if not found.quants:
        return None, notes
    weighed = [(q, plan_for(q)) for q in found.quants]
    ranked = sorted(
        weighed,
        key=lambda qp: (
            *_quality_key(qp[0].quant, qp[0].description.file_bytes),
            -qp[1].predicted_tokens_per_s,
        ),
    )
    fitting = [(q, p) for q, p in ranked if p.fits]
    if not fitting:
        tried = ", ".join(f"{q.quant} of {q.repo} ({fb(q.description.file_bytes)})" for q, _ in ranked)
        said = f"No smaller community quant fits either: {tried} were read, and none fits this machine."
        return None, (*notes, Reason("community", said))
    best, plan = fitting[0]
    others = [_weighed(q, p, best) for q, p in ranked if q is not best]
    ram, gpus = plan.memory.ram, plan.memory.gpus
    where = f"RAM {fb(ram.used_bytes)} of {fb(ram.capacity_bytes)}" + "".join(
        f", {g.name} {fb(g.used_bytes)} of {fb(g.capacity_bytes)}" for g in gpus
    )
    placement = placement_words(plan.n_gpu_layers, plan.n_cpu_moe)
    command = download_command(best.repo, best.pattern)
    rank = quality_rank(best.quant)
    order = (
        "the best in llama.cpp's quality order of quant types"
        if rank is not None
        else "not a llama.cpp quant type, so ranked by size"
    )
    estimated = best.description.tensors is None
    why = (
        f"A smaller quant that fits: {best.quant} of {best.repo} ({fb(best.description.file_bytes)}"
        f"{f', {len(best.files)} files' if len(best.files) > 1 else ''}), {order} among the community quants "
        f"that fit this machine: {placement}, {where}, context {plan.ctx}, decode ~"
        f"{format_tokens_per_s(plan.predicted_tokens_per_s)} tokens/s predicted"
        f"{'' if plan.speed_source != 'estimate' else ' (an estimate)'}."
        + (f" Its publisher on quality: {best.quality.rstrip('.')}." if best.quality else "")
        + (
            " Its size is the one its page lists; its header is read before any download."
            if estimated
            else ""
        )
        + (f" Weighed too: {'; '.join(others)}." if others else "")
        + f" Get it with `{command}`."
    )
    pick = CommunityPick(
        repo=best.repo,
        quant=best.quant,
        files=best.files,
        file_bytes=best.description.file_bytes,
        ctx=plan.ctx,
        n_gpu_layers=plan.n_gpu_layers,
        n_cpu_moe=plan.n_cpu_moe,
        ram_bytes=ram.used_bytes,
        gpu_bytes=tuple(g.used_bytes for g in gpus),
        predicted_tokens_per_s=plan.predicted_tokens_per_s,
        size_source=best.source,
        command=command,
        why=why,
        quality=best.quality,
    )
    return pick, (*notes, Reason("community", why))


def _weighed(q: CommunityQuant, plan: Plan, best: CommunityQuant) -> str:
    """What one other quant did, in a few words."""
    size = fb(q.description.file_bytes)
    if not plan.fits:
        return f"{q.quant} of {q.repo} ({size}) does not fit"
    if quality_rank(q.quant) is None and quality_rank(best.quant) is None:
        return f"{q.quant} of {q.repo} ({size}) fits, smaller (neither is a llama.cpp quant type)"
    if quality_rank(q.quant) == quality_rank(best.quant):
        speed = format_tokens_per_s(plan.predicted_tokens_per_s)
        return f"{q.quant} of {q.repo} ({size}) fits, the same quant type, ~{speed} tokens/s"
    return f"{q.quant} of {q.repo} ({size}) fits, lower in the quality order than {best.quant}"
