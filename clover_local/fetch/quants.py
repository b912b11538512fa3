"""Which GGUF files in a repo make up one quant: pure name matching, no I/O.

GGUF repos on the Hub name files freely (``Model-Q4_K_M.gguf``, ``model.q4_k_m.gguf``,
``Q4_K_M/Model-Q4_K_M-00001-of-00002.gguf``), so a quant is found by its pattern appearing between
separators in the path, case-insensitively. ``Q4_K_M`` must not match ``IQ4_K_M`` nor ``Q4_K_M_L``: the
characters on either side of the match may not be letters, digits or ``_``.

Where that finds nothing, the file is the one llama.cpp's ``-hf REPO[:QUANT]`` loads (``find_best_model`` in
``common/download.cpp`` at the pinned commit): the first model GGUF, in the repo's order, whose path holds the
quant followed by ``.`` or ``-``; with no quant, ``Q4_K_M``, then ``Q8_0``, then the first model GGUF. So a
community repo's own names (``Model.IQ3_XXS.gguf``, ``Model-APEX-I-NanoPlus.gguf`` with ``--quant APEX-I``)
download and plan as the ``llama-server -hf`` command shown for them loads.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from clover_local.errors import DownloadError
from clover_local.fetch.sidecars import gguf_role
from clover_local.gguf.names import SHARD_RE

_QUANT_TOKEN_RE = re.compile(
    r"(?<![A-Za-z0-9])((?:IQ|TQ|Q)\d(?:_[A-Z0-9]+)*|BF16|F16|F32|MXFP4(?:_MOE)?)(?![A-Za-z0-9])",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class ShardName:
    """Where a file sits in a split GGUF (``-00001-of-00003.gguf``); unsplit files are 1 of 1."""

    base: str
    index: int
    count: int


def shard_of(path: str) -> ShardName:
    """Split a GGUF path into its split base, shard index (1-based) and shard count."""
    m = SHARD_RE.match(path)
    if m is None:
        return ShardName(base=path.removesuffix(".gguf").removesuffix(".GGUF"), index=1, count=1)
    return ShardName(base=m.group("base"), index=int(m.group("index")), count=int(m.group("count")))


def is_model_gguf(path: str) -> bool:
    """A GGUF holding model weights, not a sidecar, by llama.cpp's rule (:func:`.sidecars.gguf_role`)."""
    return gguf_role(path) == "model"


def quant_matches(path: str, pattern: str) -> bool:
    """True when ``pattern`` appears in ``path`` between separators (case-insensitive)."""
    needle = re.escape(pattern)
    return re.search(rf"(?<![A-Za-z0-9_]){needle}(?![A-Za-z0-9_])", path, re.IGNORECASE) is not None


def quant_of(path: str) -> str | None:
    """The quant name a GGUF file name carries (``Q4_K_M``, ``IQ2_XXS``, ``BF16``), upper-cased, if any."""
    name = path.rsplit("/", 1)[-1]
    found = _QUANT_TOKEN_RE.findall(name) or _QUANT_TOKEN_RE.findall(path)
    return found[-1].upper() if found else None


def group_shards(paths: Iterable[str]) -> dict[str, list[str]]:
    """Group GGUF paths by split base; each group's paths sorted by shard index."""
    groups: dict[str, list[str]] = {}
    for path in paths:
        groups.setdefault(shard_of(path).base, []).append(path)
    return {base: sorted(group, key=lambda p: shard_of(p).index) for base, group in sorted(groups.items())}


def missing_shards(group: list[str]) -> list[int]:
    """Shard indices (1-based) absent from a group of one split GGUF."""
    count = max(shard_of(p).count for p in group)
    present = {shard_of(p).index for p in group}
    return [i for i in range(1, count + 1) if i not in present]


HF_DEFAULT_TAGS = ("Q4_K_M", "Q8_0")
"""What ``-hf REPO`` without a quant looks for, in order (``find_best_model``)."""


def hf_pick(paths: Iterable[str], tag: str | None) -> str | None:
    """The file llama.cpp's ``-hf REPO[:TAG]`` loads from a repo listing (its first shard, chosen as the module
    says; a split only by its first shard), None when it finds none."""
    models = [p for p in paths if p.endswith(".gguf") and is_model_gguf(p)]
    firsts = [p for p in models if shard_of(p).count <= 1 or shard_of(p).index == 1]
    for wanted in (tag,) if tag else HF_DEFAULT_TAGS:
        needle = re.compile(re.escape(wanted) + r"[.-]", re.IGNORECASE)
        for path in firsts:
            if needle.search(path):
                return path
    return None if tag else next(iter(firsts), None)


def select_quant_files(repo: str, paths: Iterable[str], pattern: str | None) -> list[str]:
    """The files of one quant (found as the module says; ``pattern`` None: the file ``-hf REPO`` loads), first
    shard first. Refuses when no file matches (listing the quants the repo does have), when several different
    files or splits match (listing them), and when shards of a split are missing from the repo."""
    listed = list(paths)
    ggufs = [p for p in listed if is_model_gguf(p)]
    groups = group_shards(p for p in ggufs if pattern and quant_matches(p, pattern))
    if not groups and (picked := hf_pick(listed, pattern)) is not None:
        groups = group_shards(p for p in ggufs if shard_of(p).base == shard_of(picked).base)
    if not groups:
        available = sorted({q for p in ggufs if (q := quant_of(p))})
        fix = (
            f"Quants in this repo: {', '.join(available)}."
            if available
            else "The repo has no GGUF files; check the repo name."
        )
        raise DownloadError(f"No GGUF file in {repo} matches the quant {pattern or 'Q4_K_M or Q8_0'!r}.", fix)
    if len(groups) > 1:
        names = "\n     ".join(group[0] for group in groups.values())
        raise DownloadError(
            f"The quant {pattern!r} matches {len(groups)} different files in {repo}:\n     {names}",
            "Pick one with --repo REPO --file FILE (for a split file, give its first shard).",
        )
    (group,) = groups.values()
    return _complete(repo, group, "The upload is incomplete; try another quant or ask the repo's owner.")


def files_for_name(repo: str, paths: Iterable[str], filename: str) -> list[str]:
    """All shards of the split that ``filename`` belongs to (just ``filename`` when unsplit)."""
    ggufs = list(paths)
    if filename not in ggufs:
        close = [p for p in ggufs if p.endswith(".gguf")][:20]
        raise DownloadError(
            f"{repo} has no file {filename!r}.",
            f"GGUF files there: {', '.join(close)}." if close else "The repo has no GGUF files.",
        )
    base = shard_of(filename).base
    return _complete(repo, group_shards(p for p in ggufs if shard_of(p).base == base)[base])


def _complete(repo: str, group: list[str], fix: str | None = None) -> list[str]:
    """``group``, the shards of one split GGUF, or a :class:`DownloadError` naming those the repo lacks."""
    if gaps := missing_shards(group):
        raise DownloadError(
            f"{repo} has only part of the split GGUF {group[0]}: shard(s) {gaps} are missing.", fix
        )
    return group
